"""`karpflow worker` as a process: probes answer, SIGTERM lets a running drain finish, traces export."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
import urllib.error
import urllib.request

import pytest

from api.constants import DO_NOT_DISRUPT_ANNOTATION
from sim.chaos.processes import TemporalServer
from tests.integration.workflows.conftest import Workload, node, scenario
from workflows.termination import TerminationWorkflow

pytestmark = pytest.mark.integration

A, B = node("172.31.1.10"), node("172.31.2.20")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def probe(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)
    except OSError:
        return 0, {}


@pytest.mark.sim_stack(scenario=scenario([A, B], [Workload("shop", "web", "100m", "128Mi", ["10", "20"])]))
async def test_probes_answer_and_sigterm_stops_the_worker_cleanly(karpflow):
    port = free_port()
    process = karpflow.worker_process(KARPFLOW_HEALTH_PORT=str(port), KARPFLOW_GRACEFUL_SHUTDOWN="5")
    try:
        await karpflow.eventually(
            lambda: asyncio.to_thread(lambda: probe(port, "/readyz")[0] == 200),
            within=30,
            what=lambda: f"/readyz to answer 200\n{karpflow.worker_logs()}",
        )
        assert probe(port, "/healthz") == (200, {"status": "ok"})
        assert probe(port, "/readyz") == (200, {"ready": True})
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 30)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0 and time.monotonic() - started < 10
    assert probe(port, "/healthz")[0] == 0  # the endpoint went away with the process
    logs = karpflow.worker_logs()
    assert '"message": "worker running: task queue ' in logs and "signal received" in logs


HELD = [
    Workload(
        "ml", "trainer", "100m", "128Mi", ["10"], annotations={DO_NOT_DISRUPT_ANNOTATION: "true"}, grace=1
    )
]


@pytest.mark.sim_stack(scenario=scenario([A, B], HELD, termination_grace_period="6s"))
async def test_sigterm_during_a_drain_lets_the_next_worker_finish_it(karpflow):
    """The drain activity is cancelled by the shutdown, fails its attempt, and is retried by the
    next worker from the cluster's state; traces go to the console exporter meanwhile."""
    first = karpflow.worker_process(KARPFLOW_GRACEFUL_SHUTDOWN="0.5", KARPFLOW_OTEL_EXPORTER="console")
    handle = await karpflow.start_termination(A.name)
    await karpflow.eventually(
        lambda: _phase(handle, "Draining"), within=30, what=lambda: f"draining\n{karpflow.worker_logs()}"
    )
    first.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(first.wait, 30) == 0
    second = karpflow.worker_process()
    try:
        status = await asyncio.wait_for(handle.result(), 60)
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.to_thread(second.wait, 30)
    assert status.phase == "Succeeded" and status.pods_deleted == 1
    assert '"name": "RunActivity:drain_node"' in karpflow.worker_logs()  # an OpenTelemetry span


async def _phase(handle, phase: str) -> bool:
    try:
        return (await handle.query(TerminationWorkflow.status)).phase == phase
    except Exception:
        return False


@pytest.mark.sim_stack(scenario=scenario([A], []))
async def test_a_worker_started_while_temporal_is_down_waits_for_it(karpflow, tmp_path):
    """Found by the chaos run: a worker that started while the Temporal server restarted exited (1) at
    once, and would have waited for its pod's crash-loop backoff. It waits for the server instead."""
    server = TemporalServer(tmp_path)
    server.port, health = free_port(), free_port()
    process = karpflow.worker_process(
        KARPFLOW_TEMPORAL_ADDRESS=server.address, KARPFLOW_HEALTH_PORT=str(health)
    )
    try:
        await karpflow.eventually(
            lambda: _async("does not answer" in karpflow.worker_logs()),
            within=30,
            what=lambda: f"a retry line\n{karpflow.worker_logs()}",
        )
        assert process.poll() is None, karpflow.worker_logs()
        # Alive for the liveness probe (no restart by the kubelet), not ready for traffic.
        assert await asyncio.to_thread(probe, health, "/healthz") == (200, {"status": "ok"})
        status, body = await asyncio.to_thread(probe, health, "/readyz")
        assert (status, body.get("ready")) == (503, False), body
        assert "the Temporal worker is not running" in body.get("reasons", []), body
        await asyncio.to_thread(server.start)
        await karpflow.eventually(
            lambda: _async("worker running: task queue" in karpflow.worker_logs()),
            within=60,
            what=lambda: f"the worker to connect\n{karpflow.worker_logs()}",
        )
        assert process.poll() is None
        await karpflow.eventually(
            lambda: asyncio.to_thread(lambda: probe(health, "/readyz")[0] == 200), within=30, what="ready"
        )
    finally:
        process.kill()
        await asyncio.to_thread(process.wait, 10)
        await asyncio.to_thread(server.stop)


async def _async(value):
    return value
