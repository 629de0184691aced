"""`karpflow dev up | status | down` against real processes, on free ports and a temporary state dir
(so a developer's own stack on the default ports is never touched)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import pytest

from sim.devstack import DevStack, worker_available
from sim.interruption_queue import MOTO_KEYS
from sim.testing import SMALL

pytestmark = pytest.mark.integration


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def karpflow(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **env},
        check=False,
    )


@pytest.mark.slow(seconds=60)
def test_dev_up_status_down(tmp_path: Path):
    temporal, ui, kube, moto = free_ports(4)
    state = tmp_path / "state"
    env = {
        "KARPFLOW_STATE_DIR": str(state),
        "KARPFLOW_TEMPORAL_PORT": str(temporal),
        "KARPFLOW_UI_PORT": str(ui),
        "KARPFLOW_MOTO_PORT": str(moto),
    }
    # Flags win over variables: the emulator port comes as a flag.
    up = karpflow(
        "dev", "up", "--kube-port", str(kube), "--scenario", str(SMALL), "--time-scale", "0.1", env=env
    )
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in up.stdout
        assert f"http://127.0.0.1:{kube}" in up.stdout and f"http://127.0.0.1:{ui}" in up.stdout
        recorded = json.loads((state / "dev.json").read_text())
        assert recorded["kube_port"] == kube and recorded["temporal_port"] == temporal

        # Real clients against what it started.
        nodes = subprocess.run(
            ["kubectl", "--kubeconfig", str(state / "kubeconfig"), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()
        assert len(nodes) == 3 and all(n.startswith("node/ip-172-31-") for n in nodes)
        health = subprocess.run(
            [
                str(Path(sys.prefix) / "bin" / "temporal"),
                "operator",
                "cluster",
                "health",
                "--address",
                f"127.0.0.1:{temporal}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert "SERVING" in health.stdout
        attributes = subprocess.run(
            [
                str(Path(sys.prefix) / "bin" / "temporal"),
                "operator",
                "search-attribute",
                "list",
                "--address",
                f"127.0.0.1:{temporal}",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        assert "KarpflowNodes" in attributes and "KeywordList" in attributes
        assert urllib.request.urlopen(f"http://127.0.0.1:{ui}", timeout=10).status == 200
        # The interruption queue exists in moto, fed by EventBridge, and the worker is told its URL.
        queue_url = f"http://127.0.0.1:{moto}/123456789012/karpflow-dev-interruption"
        assert f"export KARPFLOW_INTERRUPTION_QUEUE={queue_url}" in (state / "env").read_text()
        sqs = boto3.client(
            "sqs", endpoint_url=f"http://127.0.0.1:{moto}", region_name="us-west-2", **MOTO_KEYS
        )
        assert sqs.get_queue_url(QueueName="karpflow-dev-interruption")["QueueUrl"] == queue_url
        if worker_available():  # the worker polls it: an unparseable message is consumed and deleted
            sqs.send_message(QueueUrl=queue_url, MessageBody="not an event")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                depth = sqs.get_queue_attributes(
                    QueueUrl=queue_url,
                    AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
                )["Attributes"]
                if (
                    depth["ApproximateNumberOfMessages"]
                    == depth["ApproximateNumberOfMessagesNotVisible"]
                    == "0"
                ):
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("the dev worker did not consume the interruption queue")
        stack = DevStack.from_state_dir(state)
        pids = {name: stack.process(name).pid for name in ("temporal", "sim")}
        assert all((state / f"{name}.pid").is_file() for name in pids)
        expected = {"temporal", "sim", "worker"} if worker_available() else {"temporal", "sim"}

        status = karpflow("dev", "status", env={"KARPFLOW_STATE_DIR": str(state)})
        assert status.returncode == 0, status.stdout
        for name in expected:
            assert f"{name} " in status.stdout and "healthy" in status.stdout

        # Starting twice is safe: nothing new starts, the same processes keep running.
        again = karpflow("dev", "up", env={"KARPFLOW_STATE_DIR": str(state)})
        assert again.returncode == 0 and "already running" in again.stdout
        assert {name: stack.process(name).pid for name in pids} == pids

        # A port held by someone else is a clear error that names it, and starts nothing.
        other = tmp_path / "other"
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", 0))
            squatter.listen()
            taken = squatter.getsockname()[1]
            clash = karpflow(
                "dev", "up", "--no-worker", "--state-dir", str(other), "--temporal-port", str(taken), env={}
            )
        assert clash.returncode == 1
        assert f"port {taken} (Temporal frontend)" in " ".join(clash.stdout.split())
        assert not DevStack.from_state_dir(other).running()
    finally:
        down = karpflow("dev", "down", env={"KARPFLOW_STATE_DIR": str(state)})
    assert down.returncode == 0 and "Stopped" in down.stdout
    assert all(DevStack.from_state_dir(state).process(name) is None for name in ("temporal", "sim", "worker"))
    assert (state / "temporal.db").is_file()  # kept without --purge
    status = karpflow("dev", "status", env={"KARPFLOW_STATE_DIR": str(state)})
    assert status.returncode == 1 and "stopped" in status.stdout
    purged = karpflow("dev", "down", "--purge", env={"KARPFLOW_STATE_DIR": str(state)})
    assert purged.returncode == 0 and "Nothing was running" in purged.stdout
    assert not (state / "temporal.db").exists()


@pytest.mark.slow
@pytest.mark.skipif(not worker_available(), reason="needs the worker's dependencies (make install)")
def test_dev_up_secure_runs_the_worker_as_its_service_account(tmp_path: Path):
    temporal, kube, moto = free_ports(3)
    state = tmp_path / "state"
    env = {
        "KARPFLOW_STATE_DIR": str(state),
        "KARPFLOW_TEMPORAL_PORT": str(temporal),
        "KARPFLOW_KUBE_PORT": str(kube),
        "KARPFLOW_MOTO_PORT": str(moto),
        "KARPFLOW_UI": "false",
        # A shell that sourced an admin's env must not hand the worker the admin's kubeconfig.
        "KARPFLOW_KUBECONFIG": str(tmp_path / "admin-kubeconfig"),
    }
    (tmp_path / "admin-kubeconfig").write_text("{}")
    up = karpflow("dev", "up", "--secure", "--scenario", str(SMALL), "--time-scale", "0.1", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        url = f"https://127.0.0.1:{kube}"
        assert url in up.stdout and "ServiceAccount karpflow/karpflow-worker" in " ".join(up.stdout.split())
        ca = state / "tls" / "ca.crt"
        # The admin kubeconfig works over HTTPS; no token is 401, as on a real cluster.
        nodes = subprocess.run(
            ["kubectl", "--kubeconfig", str(state / "kubeconfig"), "get", "nodes", "-o", "name"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
        assert len(nodes) == 3
        context = ssl.create_default_context(cafile=str(ca))
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"{url}/api/v1/nodes", context=context, timeout=10)
        assert anonymous.value.code == 401
        # The worker's calls: every one as the ServiceAccount, none refused.
        deadline = time.monotonic() + 60
        calls: list[dict] = []
        while time.monotonic() < deadline and not calls:
            with urllib.request.urlopen(f"{url}/sim/requests", context=context, timeout=10) as response:
                log = json.loads(response.read())["items"]
            calls = [r for r in log if (r.get("user_agent") or "").startswith("karpflow-worker")]
            time.sleep(0.2)
        assert calls, "the worker made no Kubernetes request"
        assert {r["user"] for r in calls} == {"system:serviceaccount:karpflow:karpflow-worker"}, [
            (r["method"], r["path"], r["status"]) for r in calls if r["user"] is None
        ]
        assert not [r for r in calls if r["status"] in (401, 403)]
        assert (state / "serviceaccount" / "token").stat().st_mode & 0o077 == 0
    finally:
        down = karpflow("dev", "down", "--purge", env={"KARPFLOW_STATE_DIR": str(state)})
    assert down.returncode == 0, down.stdout
