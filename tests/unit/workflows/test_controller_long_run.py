"""The small version of bench/bench_controller_history.py, in CI: a long controller life on a busy
generated cluster (the real planner's reasons and commands, churn, failures, malformed signals, a
worker that forgets what it sent) stays bounded run after run, and every run replays."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from temporalio.client import Client

BENCH = Path(__file__).resolve().parents[3] / "bench" / "bench_controller_history.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_controller_history", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


# Once again when it fails: a failed workflow task was seen twice in full-suite runs under heavy
# load and never alone; the assertion names its cause (README, "Tests"). A second failure is real.
@pytest.mark.flaky(reruns=1)
async def test_a_long_busy_controller_keeps_every_run_under_its_history_limit(ts_client: Client):
    b = bench()
    cluster = b.PlannedCluster.generate(1000)
    limit = 1_000_000  # the default is 4 MB; lowered so that 400 passes cross it several times
    figures = await b.measure(ts_client, cluster, 400, max_history_bytes=limit, forget_every=(40, 80))
    b.report(figures)
    whole = len(cluster.reasons)
    one_pass = figures.reasons_bytes * 2  # every reason, plus a command and the rest of a result
    assert figures.still_running and figures.status.error == ""
    assert len(figures.status.blocked) >= whole - 5  # every node explained (but a command's)
    assert figures.forgotten >= 4 and figures.signals >= 5  # and the controller went on
    closed = [r for r in figures.runs if r.ended != "running"]
    assert any(r.ended == "history limit" for r in closed), [r.ended for r in figures.runs]
    assert all(r.bytes < limit + one_pass for r in figures.runs), [r.bytes for r in figures.runs]
    # UNHANDLED_COMMAND is the server refusing a completion (its continue-as-new) because a signal
    # arrived meanwhile: the worker runs the task again with it, by design (the fault matrix's BENIGN).
    # The bench reports them; any other cause is a bug.
    failures = [c for r in figures.runs for c in r.task_failures]
    assert [c for c in failures if not c.startswith("WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND")] == []
    assert [r.replay_error for r in figures.runs if r.replay_error] == []
