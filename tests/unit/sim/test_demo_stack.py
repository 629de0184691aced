"""Which stack `karpflow demo` runs (never a developer's), and how its steps go on after a failure.
No servers: a running stack is a live process with a pid file, as `karpflow dev` records it."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from sim.demo import Demo, DemoFailure, Step, bring_down, demo_settings, tell
from sim.devstack import DevSettings, DevStack, DevStackError, purged_message


def fake_running_stack(state_dir: Path) -> subprocess.Popen[bytes]:
    """A stack `DevStack.running()` believes in: dev.json and one live process with its pid file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "dev.json").write_text(DevSettings(state_dir=state_dir).model_dump_json())
    process = subprocess.Popen(["sleep", "60"])
    time.sleep(0.05)  # the pid file must be younger than the process it names
    (state_dir / "sim.pid").write_text(f"{process.pid}\n")
    assert DevStack.from_state_dir(state_dir).running()
    return process


@pytest.fixture
def no_flags() -> dict[str, object]:
    return {"state_dir": None, "temporal_port": None, "ui_port": None, "kube_port": None, "moto_port": None}


def test_the_demo_leaves_a_running_dev_stack_alone(monkeypatch, tmp_path, no_flags, capsys):
    monkeypatch.setenv("KARPFLOW_STATE_DIR", str(tmp_path))
    dev = fake_running_stack(tmp_path)
    try:
        settings, own = demo_settings(no_flags)
        assert own and settings.state_dir == tmp_path / "demo"
        assert f"A dev stack runs in {tmp_path}" in capsys.readouterr().out
        assert dev.poll() is None and (tmp_path / "sim.pid").is_file() and (tmp_path / "dev.json").is_file()
    finally:
        dev.kill()
        dev.wait()


def test_a_demo_stack_kept_by_an_earlier_run_is_stopped_and_wiped(monkeypatch, tmp_path, no_flags):
    monkeypatch.setenv("KARPFLOW_STATE_DIR", str(tmp_path))
    kept = fake_running_stack(tmp_path / "demo")
    (tmp_path / "demo" / "temporal.db").write_text("old history")
    try:
        _, own = demo_settings(no_flags)
        assert own
        assert kept.wait(timeout=15) is not None  # stopped (SIGTERM)
        assert not (tmp_path / "demo" / "temporal.db").exists()
        assert not (tmp_path / "demo" / "dev.json").exists()
    finally:
        kept.kill()
        kept.wait()


def test_a_running_stack_in_a_state_dir_given_as_a_flag_is_refused(tmp_path, no_flags):
    other = fake_running_stack(tmp_path)
    try:
        with pytest.raises(DevStackError, match="already runs in"):
            demo_settings({**no_flags, "state_dir": tmp_path})
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_busy_ports_are_replaced_unless_given_as_flags(monkeypatch, tmp_path, no_flags, capsys):
    with socket.socket() as ui, socket.socket() as kube:
        for sock in (ui, kube):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        busy_ui, busy_kube = ui.getsockname()[1], kube.getsockname()[1]
        monkeypatch.setenv("KARPFLOW_UI_PORT", str(busy_ui))
        flags = {**no_flags, "state_dir": tmp_path / "state", "kube_port": busy_kube}
        settings, own = demo_settings(flags)
    assert not own
    assert settings.ui_port != busy_ui
    assert settings.kube_port == busy_kube  # a flag is kept: `up` then names the busy port
    assert (
        f"Port {busy_ui} (Temporal Web UI) is in use; the demo uses {settings.ui_port}"
        in capsys.readouterr().out
    )


def test_after_a_failure_only_the_steps_that_show_the_end_state_run(tmp_path):
    ran: list[str] = []

    def step(name: str, fail: bool = False):
        def run(demo: Demo) -> None:
            ran.append(name)
            if fail:
                raise DemoFailure(f"{name} failed")

        return run

    demo = Demo(stack=DevStack(DevSettings(state_dir=tmp_path)), sim=None)  # type: ignore[arg-type]
    try:
        failures = tell(
            demo,
            [
                Step("plan", step("plan")),
                Step("skipped by its condition", step("never"), only_if=lambda d: False),
                Step("follow", step("follow", fail=True)),
                Step("second pass", step("second pass")),
                Step("nodes afterwards", step("nodes afterwards"), after_failure=True),
            ],
        )
    finally:
        demo.close()
    assert failures == ["follow failed"]
    assert ran == ["plan", "follow", "nodes afterwards"]


@pytest.mark.parametrize("second", [0, 31, 59])
def test_the_demos_window_is_active_when_applied_and_closes_on_its_own(second: int):
    """The objects the demo applies are valid as karpflow reads them (the CRD schemas refuse what
    these readers refuse: tests/unit/test_control_crds.py), and the window is a real daily schedule
    that blocks Expiration and Consolidation now and closes `hold` seconds later, whatever the second."""
    from datetime import UTC, datetime, timedelta

    from planner.maintenance_windows import read_window
    from planner.node_disruption_budgets import read_ndb
    from sim.demo import demo_controls

    now = datetime(2026, 11, 26, 23, 59, second, 400_000, tzinfo=UTC)
    (window_object, budget_object), closes = demo_controls(now, hold=35)
    window, budget = read_window(window_object), read_ndb(budget_object)
    assert not window.problems and not budget.problems
    assert closes - now >= timedelta(seconds=35) and closes - now < timedelta(seconds=36)
    assert window.active_at(now) and window.active_at(closes - timedelta(seconds=1))
    assert not window.active_at(closes) and window.active_end(now) == closes
    assert window.actions == {"Expiration", "Consolidation"}
    zone_a = {"karpenter.sh/nodepool": "default", "topology.kubernetes.io/zone": "us-west-2a"}
    assert window.matches(zone_a) and not window.matches({**zone_a, "karpenter.sh/nodepool": "batch"})
    assert budget.selects(zone_a) and not budget.selects({"topology.kubernetes.io/zone": "us-west-2b"})
    assert budget.allowed_unavailable(7) == 1


def state_written_by_a_demo(state_dir: Path) -> DevStack:
    """What a stopped demo stack leaves: its database, logs, env files and the controls it applied."""
    state_dir.mkdir(parents=True)
    for name in ("temporal.db", "dev.json", "env", "kubeconfig", "demo-controls.yaml"):
        (state_dir / name).write_text("x")
    (state_dir / "logs").mkdir()
    (state_dir / "logs" / "worker.log").write_text("x")
    return DevStack(DevSettings(state_dir=state_dir))


def test_a_clean_demo_removes_its_directory_and_says_so_only_when_it_is_gone(tmp_path, capsys):
    stack = state_written_by_a_demo(tmp_path / "demo")
    bring_down(stack, keep=False, own=True, failed=False)
    assert not (tmp_path / "demo").exists()
    assert f"removed {tmp_path / 'demo'}" in " ".join(capsys.readouterr().out.split()).lower()


def test_a_purge_that_keeps_the_directory_says_what_it_kept(tmp_path):
    stack = state_written_by_a_demo(tmp_path / "state")
    (tmp_path / "state" / "notes.txt").write_text("mine")  # not the stack's: never removed
    left = stack.purge()
    assert [p.name for p in left] == ["demo-controls.yaml", "notes.txt"]
    message = purged_message(tmp_path / "state", left)
    assert f"Removed {tmp_path / 'state'}" not in message
    assert "kept" in message and "demo-controls.yaml, notes.txt" in message
    assert purged_message(tmp_path / "gone", []) == f"Removed {tmp_path / 'gone'}."


def test_the_demo_help_names_the_directory_it_uses():
    from click.testing import CliRunner

    from sim.demo import demo

    text = " ".join(CliRunner().invoke(demo, ["--help"]).output.split())
    assert "<state dir>/demo" not in text  # --state-dir DIR is DIR itself, not DIR/demo
    assert "with --state-dir DIR: DIR itself" in text and ".state/demo/" in text
