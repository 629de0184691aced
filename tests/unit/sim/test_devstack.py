"""The dev stack's bookkeeping without starting servers: settings, pid ownership, worker detection."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from sim import devstack
from sim.devstack import DevSettings, DevStack, _owned_process
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
