"""The three ways to run the emulator: a background thread, the caller's loop (see test_client_aio),
and `python -m sim.apiserver`; plus the kubeconfig they write and timeout faults."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import urllib3
import yaml

from sim.apiserver import EmulatorServer
from sim.apiserver.faults import FaultRule

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]


def test_thread_mode_serves_and_releases_its_port(tmp_path: Path) -> None:
    with EmulatorServer() as srv:
        url = srv.url
        assert urllib3.request("GET", f"{url}/version").json()["gitVersion"].startswith("v1.32")
        config = yaml.safe_load(srv.write_kubeconfig(tmp_path / "kc").read_text())
        assert config["clusters"][0]["cluster"]["server"] == url
        assert srv.call(lambda: srv.store.count("namespaces")) == 4
    with pytest.raises(urllib3.exceptions.HTTPError):
        urllib3.request("GET", f"{url}/version", retries=False, timeout=1)


def test_module_entry_point(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.apiserver", "--port", "0", "--kubeconfig", str(kubeconfig)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert "Kubernetes API emulator on http://127.0.0.1:" in line, line
        url = line.split(" on ", 1)[1].split()[0]
        assert urllib3.request("GET", f"{url}/readyz").data == b"ok"
        assert yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_timeout_fault_hangs_then_answers_504() -> None:
    with EmulatorServer() as srv:
        srv.faults.add(FaultRule(verb="get", resource="namespaces", timeout_seconds=0.3, times=1))
        started = time.monotonic()
        resp = urllib3.request("GET", f"{srv.url}/api/v1/namespaces/default")
        assert resp.status == 504 and resp.json()["reason"] == "Timeout"
        assert time.monotonic() - started >= 0.3
        assert urllib3.request("GET", f"{srv.url}/api/v1/namespaces/default").status == 200


def test_error_rate_is_a_probability() -> None:
    with EmulatorServer() as srv:
        srv.faults.add(FaultRule(verb="list", resource="nodes", status=503, error_rate=0.5))
        codes = [urllib3.request("GET", f"{srv.url}/api/v1/nodes").status for _ in range(200)]
        assert set(codes) == {200, 503} and 40 < codes.count(503) < 160
