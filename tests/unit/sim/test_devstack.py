"""The dev stack's bookkeeping without starting servers: settings, pid ownership, worker detection, a
part started again when a port it picked itself was taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from sim import devstack
from sim.devstack import DevSettings, DevStack, DevStackError, Part, _owned_process
from sim.ports import port_is_free


def test_flags_and_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KARPFLOW_KUBE_PORT", "16443")
    monkeypatch.setenv("KARPFLOW_STATE_DIR", str(tmp_path))
    settings = DevSettings()
    assert settings.kube_port == 16443 and settings.state_dir == tmp_path
    assert settings.temporal_port == 7233 and settings.ui_port == 8233 and settings.moto_port == 4566
    assert DevSettings(kube_port=1234).kube_port == 1234  # an explicit value wins
    env = settings.client_env()
    assert env["KUBECONFIG"] == str(tmp_path / "kubeconfig")
    assert env["KARPFLOW_TEMPORAL_ADDRESS"] == "127.0.0.1:7233"
    assert env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:4566"


def test_status_and_down_use_the_recorded_settings(tmp_path):
    (tmp_path / "dev.json").write_text(DevSettings(state_dir=tmp_path, kube_port=19999).model_dump_json())
    stack = DevStack.from_state_dir(tmp_path)
    assert stack.settings.kube_port == 19999
    assert not stack.running()
    assert stack.down() == []


def test_a_pid_file_names_only_the_process_it_was_written_for(tmp_path):
    pid_file = tmp_path / "x.pid"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file.write_text(f"{child.pid}\n")
        assert _owned_process(pid_file).pid == child.pid
        # A pid file older than the process is a recycled pid: never signalled.
        os.utime(pid_file, (time.time() - 3600, time.time() - 3600))
        assert _owned_process(pid_file) is None
    finally:
        child.kill()
        child.wait()
    pid_file.write_text(f"{child.pid}\n")
    assert _owned_process(pid_file) is None  # gone
    pid_file.write_text("garbage")
    assert _owned_process(pid_file) is None


def test_a_port_in_use_is_detected():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_is_free("127.0.0.1", sock.getsockname()[1])
    assert port_is_free("127.0.0.1", 0)


def test_the_worker_joins_once_worker_py_defines_cli(tmp_path, monkeypatch):
    module = tmp_path / "worker.py"
    monkeypatch.setattr(
        devstack.importlib.util, "find_spec", lambda name: type("S", (), {"origin": str(module)})
    )
    module.write_text('"""Entry point of the karpflow worker (see issue 3)."""\n')
    assert not devstack.worker_available()
    module.write_text("import click\n\n@click.command()\ndef cli():\n    pass\n")
    assert devstack.worker_available()
    parts = [p.name for p in DevStack(DevSettings(state_dir=tmp_path)).parts()]
    assert parts == ["temporal", "sim", "worker"]
    assert [p.name for p in DevStack(DevSettings(state_dir=tmp_path, worker=False)).parts()] == [
        "temporal",
        "sim",
    ]


def test_the_karpenter_neighbour_runs_with_the_worker_in_its_coexistence_mode(tmp_path, monkeypatch):
    monkeypatch.setattr(devstack, "worker_available", lambda: True)
    plain = {p.name: p.argv for p in DevStack(DevSettings(state_dir=tmp_path)).parts()}
    assert "--karpenter" not in plain["sim"] and "--karpenter-coexistence" not in plain["worker"]
    beside = DevStack(DevSettings(state_dir=tmp_path, karpenter_neighbour=True)).parts()
    argv = {p.name: p.argv for p in beside}
    assert "--karpenter" in argv["sim"] and "--karpenter-coexistence" in argv["worker"]


def test_a_part_whose_own_port_was_taken_is_started_again_once(tmp_path):
    """The Temporal CLI picks its HTTP API and metrics ports itself; another process can take one
    between its pick and its bind. Such an exit starts the part again, once; any other exit, or a
    second one, fails `up` with the part's log."""
    stack = DevStack(DevSettings(state_dir=tmp_path, ready_timeout=20))
    stack.settings.logs_dir.mkdir(parents=True)
    runs, ready = tmp_path / "runs", tmp_path / "ready"
    # Exits with the bind error on its first `failures` runs, then stays up and says it is ready.
    script = (
        "import pathlib, sys, time\n"
        f"runs = pathlib.Path({str(runs)!r}); n = len(runs.read_text()) if runs.exists() else 0\n"
        "runs.write_text('x' * (n + 1))\n"
        "if n < int(sys.argv[1]):\n"
        "    print('listen tcp 127.0.0.1:1: bind: address already in use'); sys.exit(1)\n"
        f"pathlib.Path({str(ready)!r}).write_text('up'); time.sleep(30)\n"
    )

    def part(failures: int) -> Part:
        return Part(
            "temporal",
            [sys.executable, "-c", script, str(failures)],
            {},
            ready.exists,
            "a part that loses its port",
            restart_if="bind: address already in use",
        )

    said: list[str] = []
    try:
        stack._start(part(1), lambda name, message: said.append(message))
        stack._await_ready(part(1), lambda name, message: said.append(message))
        assert runs.read_text() == "xx" and any("starting it again" in m for m in said)
    finally:
        stack._stop("temporal")
    runs.unlink()
    ready.unlink()
    stack._start(part(2), lambda name, message: None)
    with pytest.raises(DevStackError, match="exited while starting"):
        stack._await_ready(part(2), lambda name, message: None)
    assert runs.read_text() == "xx"  # started again once, not twice
