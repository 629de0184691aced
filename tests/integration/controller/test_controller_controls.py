"""The controller respects MaintenanceWindows end to end: the real worker plans on its informer cache,
which reads the windows applied with kubectl, and the invariant checker judges every start."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from sim.binaries import temporal_cli
from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import (
    FAST,
    TWENTY_PODS,
    A,
    B,
    scenario,
    status,
    until_quiet,
)
from tests.integration.workflows.conftest import REPO

pytestmark = pytest.mark.integration

PAUSE_A = f"""
apiVersion: karpflow.dev/v1alpha1
kind: MaintenanceWindow
metadata:
  name: keep-a
spec:
  actions: [Consolidation, Emptiness]
  selector:
    - key: kubernetes.io/hostname
      operator: In
      values: [{A.name}]
"""


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_a_window_blocks_consolidation_of_the_nodes_it_matches_and_not_of_others(karpflow, tmp_path):
    path = tmp_path / "window.yaml"
    path.write_text(PAUSE_A)
    kubectl(karpflow.stack, "apply", "-f", str(path))
    async with karpflow.worker(**FAST):
        # B's pods fit on A: B goes, A stays; without the window both are replaced by one new node
        await karpflow.eventually(lambda: _nodes_left(karpflow, 1), within=90, what="B consolidated")
        # B's pods landing on A restart A's consolidateAfter (1 s): until it passes, that is what a
        # pass says of A; then the window is.
        final = await karpflow.eventually(
            lambda: _settled(karpflow, "MaintenanceWindow keep-a blocks Consolidation"),
            within=60,
            what=lambda: f"nothing in flight, A held by the window: {LAST_BLOCKED}",
        )
        assert set(await karpflow.nodes()) == {A.name}
        # Held back by the window, the controller is not quiet: A waits (issue 19).
        assert not final.quiet and A.name in final.waiting
        kubectl(karpflow.stack, "delete", "maintenancewindow", "keep-a")
        await until_quiet(karpflow, after_passes=final.passes + 3)
        after = await karpflow.nodes()
    assert A.name not in after and len(after) == 1, after  # the window closed: A is consolidated too
    assert_no_violations(karpflow.stack)


def readme_pause_blocks() -> list[str]:
    text = Path(REPO, "README.md").read_text()
    section = text.split("<!-- pause-commands:begin -->")[1].split("<!-- pause-commands:end -->")[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


@pytest.mark.sim_stack(scenario=scenario([A, B], TWENTY_PODS))
async def test_a_pause_holds_new_commands_back_until_resume_with_the_readme_commands(karpflow):
    """Issue 19: pause stops new commands, resume starts again; run as the README writes them
    (`karpflow pause` and `status`, then the `temporal` CLI's update for resume). The pause is sent
    before any worker runs the controller: it reaches the first workflow task, ahead of the first
    pass, so nothing can have started before it."""
    pause, resume = readme_pause_blocks()
    env = {
        "KARPFLOW_CLUSTER_NAME": karpflow.stack.cluster_name,  # as `source .state/env` sets them
        "KARPFLOW_TEMPORAL_ADDRESS": karpflow.temporal_address,
        "KARPFLOW_TASK_QUEUE": karpflow.task_queue,
        "KARPFLOW_CONTROLLER_INTERVAL": str(FAST["controller_interval"]),
        "KARPFLOW_CONTROLLER_VALIDATION": str(FAST["controller_validation"]),
        "TEMPORAL_ADDRESS": karpflow.temporal_address,
        # `karpflow pause --nodepool` checks the cluster has that NodePool first.
        "KUBECONFIG": str(karpflow.stack.kubeconfig_path),
        "PATH": os.pathsep.join(
            [os.path.dirname(temporal_cli()), os.path.dirname(sys.executable), os.environ["PATH"]]
        ),
    }
    await karpflow.run("karpflow", "controller", "start", **env)
    pausing = asyncio.create_task(karpflow.run("bash", "-euo", "pipefail", "-c", pause, **env))
    # Time for `karpflow pause` to start and send its update (it waits for a worker to answer it):
    # a worker started before the update is sent may plan a first pass without the pause. A loaded
    # machine (the full suite on 2 cores) needs seconds to start a Python CLI.
    await asyncio.sleep(6)
    async with karpflow.worker(**FAST):
        shown = await pausing
        assert "paused NodePool default by " in shown.stdout and "driver upgrade" in shown.stdout
        paused = await karpflow.eventually(
            lambda: _held_by_the_pause(karpflow), within=60, what="a node held back by the pause"
        )
        await asyncio.sleep(3)  # six more passes
        # Held back, not stuck: the controller does not call itself quiet while the pause holds nodes.
        paused = await status(karpflow)
        assert not paused.quiet and paused.waiting and paused.in_flight == [] and paused.started == []
        assert set(await karpflow.nodes()) == {A.name, B.name}

        await karpflow.run("bash", "-euo", "pipefail", "-c", resume, **env)
        await karpflow.eventually(lambda: _nodes_left(karpflow, 1), within=90, what="consolidation")
        assert (await status(karpflow)).pauses == []
    assert_no_violations(karpflow.stack)


async def _passes(karpflow: Any, count: int) -> bool:
    try:
        return (await status(karpflow)).passes >= count
    except Exception:
        return False


async def _held_by_the_pause(karpflow: Any) -> Any:
    shown = await status(karpflow)
    held = [why for why in shown.blocked.values() if why.startswith("paused (NodePool default")]
    return shown if held else None


LAST_BLOCKED: dict[str, str] = {}


async def _settled(karpflow: Any, why: str = "") -> Any:
    """The status once nothing is in flight and A is held back (by `why`, when given)."""
    shown = await status(karpflow)
    LAST_BLOCKED.clear()
    LAST_BLOCKED.update(shown.blocked)
    held = A.name in shown.blocked and shown.blocked[A.name].startswith(why)
    return shown if not shown.in_flight and not shown.validating and held else None


async def _nodes_left(karpflow: Any, count: int) -> bool:
    return len(await karpflow.nodes()) == count
