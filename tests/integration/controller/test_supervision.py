"""A controller that cannot die (issue 17 item 5), end to end: real Temporal dev server, the
emulator, moto, karpflow's worker (in process, or as processes that are killed), the real
`karpflow` and `temporal` commands.

- a controller that is terminated (or failed) is started again by the running workers;
- `karpflow controller stop` stops it for good: the workers leave it stopped, across restarts,
  until `karpflow controller start`;
- workers killed at random points and malformed signals leave it running and working.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from api.controller_io import ControllerStatus
from api.workflow_ids import controller_workflow_id
from sim.binaries import temporal_cli
from sim.testing import assert_no_violations
from tests.integration.controller.test_controller import scenario
from tests.integration.workflows.conftest import DemoNode, Workload, node

pytestmark = pytest.mark.integration

KARPFLOW = os.path.join(os.path.dirname(sys.executable), "karpflow")
A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
TWO_NODES = scenario([A, B], [Workload("shop", "web", "100m", "128Mi", ["10"] * 4 + ["20"] * 4)])
SUPERVISED = {"controller": True, "controller_interval": 0.5, "controller_supervise_interval": 0.5}


async def latest(karpflow: Any) -> tuple[WorkflowExecutionStatus | None, str | None]:
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    try:
        described = await handle.describe()
    except Exception:
        return None, None
    return described.status, described.run_id


async def karpflow_cli(karpflow: Any, *argv: str, check: bool = True) -> Any:
    return await karpflow.run(
        KARPFLOW,
        *argv,
        "--cluster-name",
        karpflow.stack.cluster_name,
        check=check,
        KARPFLOW_TEMPORAL_ADDRESS=karpflow.temporal_address,
        KARPFLOW_TASK_QUEUE=karpflow.task_queue,
        KUBECONFIG=str(karpflow.stack.kubeconfig_path),  # `pause --nodepool` checks the pool exists
    )


@pytest.mark.sim_stack(scenario=TWO_NODES)
async def test_a_terminated_controller_is_started_again_by_the_running_worker(karpflow):
    process = karpflow.worker_process(
        KARPFLOW_CONTROLLER="true",
        KARPFLOW_CONTROLLER_INTERVAL="0.5",
        KARPFLOW_CONTROLLER_SUPERVISE_INTERVAL="0.5",
    )
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    try:

        async def running(other_than: str | None = None) -> str | None:
            now, run = await latest(karpflow)
            return run if now == WorkflowExecutionStatus.RUNNING and run != other_than else None

        first_run = await karpflow.eventually(running, within=60, what=karpflow.worker_logs)
        await handle.terminate("an operator's mistake")
        await karpflow.eventually(lambda: running(other_than=first_run), within=20, what=karpflow.worker_logs)
        assert "was TERMINATED: started it again" in karpflow.worker_logs()
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 30)
        with contextlib.suppress(Exception):
            await handle.terminate("test over")


@pytest.mark.slow  # about 40 s: started late, it was the run's tail
@pytest.mark.sim_stack(scenario=TWO_NODES)
async def test_a_stopped_controller_stays_stopped_until_an_operator_starts_it(karpflow):
    async with karpflow.worker(**SUPERVISED):
        await karpflow.eventually(
            lambda: _is(karpflow, WorkflowExecutionStatus.RUNNING), within=20, what="the controller"
        )
        stopped = await karpflow_cli(karpflow, "controller", "stop", "--reason", "maintenance window")
        assert "stopped" in stopped.stdout
        await asyncio.sleep(3)  # six supervision checks
        assert (await latest(karpflow))[0] == WorkflowExecutionStatus.COMPLETED
        shown = json.loads((await karpflow_cli(karpflow, "status", "--output", "json")).stdout)
        assert shown["stopping"].startswith("stopped by ") and ": maintenance window;" in shown["stopping"]
    # A worker that starts while the controller is stopped leaves it stopped too.
    async with karpflow.worker(**SUPERVISED):
        await asyncio.sleep(2)
        assert (await latest(karpflow))[0] == WorkflowExecutionStatus.COMPLETED
        started = await karpflow_cli(karpflow, "controller", "start")
        assert "running" in started.stdout
        await karpflow.eventually(
            lambda: _passes_at_least(karpflow, 1), within=30, what="a pass of the started controller"
        )
        await karpflow.client.get_workflow_handle(
            controller_workflow_id(karpflow.stack.cluster_name)
        ).terminate("test over")


@pytest.mark.slow  # about 40 s: two restarts of the controller, each after a supervision check
@pytest.mark.sim_stack(scenario=TWO_NODES)
async def test_a_pause_survives_every_way_the_controller_ends_and_starts_again(karpflow):
    """Issue 31 item 3: a pause was lost on `controller stop` + `controller start`."""

    async def pauses() -> list[str]:
        shown = await _status(karpflow)
        return [p.nodepool or p.scope for p in shown.pauses] if shown is not None else []

    async with karpflow.worker(**SUPERVISED):
        await karpflow.eventually(lambda: _passes_at_least(karpflow, 1), within=30, what="a first pass")
        await karpflow_cli(karpflow, "pause", "--nodepool", "default", "--reason", "driver upgrade")
        assert await pauses() == ["default"]
        await karpflow_cli(karpflow, "controller", "stop", "--reason", "maintenance")
        started = await karpflow_cli(karpflow, "controller", "start")
        assert "carried over from the last run: 1 pause(s) (NodePool default" in started.stdout, (
            started.stdout
        )
        assert await karpflow.eventually(pauses, within=20, what="the pause after the start") == ["default"]

        # Terminated by accident: the workers' supervision starts it again, with the pause.
        handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
        first = (await latest(karpflow))[1]
        await handle.terminate("an operator's mistake")

        async def restarted() -> bool:
            status, run = await latest(karpflow)
            return status == WorkflowExecutionStatus.RUNNING and run != first

        await karpflow.eventually(restarted, within=20, what="the supervision's restart")
        assert await karpflow.eventually(pauses, within=20, what="the pause after the restart") == ["default"]
        await handle.terminate("test over")


async def _is(karpflow: Any, status: WorkflowExecutionStatus) -> bool:
    return (await latest(karpflow))[0] == status


async def _status(karpflow: Any) -> ControllerStatus | None:
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    try:
        return await handle.query("status", result_type=ControllerStatus)
    except Exception:
        return None


async def _passes_at_least(karpflow: Any, count: int) -> ControllerStatus | None:
    status = await _status(karpflow)
    return status if status is not None and status.passes >= count else None


# -- killed workers and malformed signals ------------------------------------------------------------

FRAGMENTED = [
    DemoNode(f"172.31.1.{10 + i}", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=3), "k")
    for i in range(8)
]
LOAD = [
    Workload("shop", f"svc-{i}", "500m", "1Gi", [n.ip.rsplit(".", 1)[-1]] * 2, pdb={"maxUnavailable": 1})
    for i, n in enumerate(FRAGMENTED)
]
NAIVE_TIME = '{"instance_type": "m5.large", "zone": "us-west-2a", "until": "2099-01-01T00:00:00"}'
BAD_SIGNALS = [
    ("offering_unavailable", [NAIVE_TIME]),
    ("offering_unavailable", ['"garbage"']),
    ("offering_unavailable", ['{"zone": "us-west-2a"}']),
    ("offering_unavailable", [NAIVE_TIME, NAIVE_TIME]),
    ("wake", ["[1, 2]"]),
    ("stop", ['"please"']),
    ("no_such_signal", ["{}"]),
]


async def send_bad_signals(karpflow: Any) -> None:
    """With the real `temporal` CLI, as an operator (or a script gone wrong) would."""
    for name, inputs in BAD_SIGNALS:
        argv = [temporal_cli(), "workflow", "signal", "--address", karpflow.temporal_address]
        argv += ["--workflow-id", controller_workflow_id(karpflow.stack.cluster_name), "--name", name]
        for value in inputs:
            argv += ["--input", value]
        await karpflow.run(*argv)


@pytest.mark.slow  # about 50 s: started late, it was the run's tail
@pytest.mark.sim_stack(scenario=scenario(FRAGMENTED, LOAD, consolidate_after="0s"), time_scale=0.01)
async def test_workers_killed_at_random_points_and_bad_signals_leave_the_controller_working(karpflow):
    env = {
        "KARPFLOW_CONTROLLER": "true",
        "KARPFLOW_CONTROLLER_INTERVAL": "0.3",
        "KARPFLOW_CONTROLLER_VALIDATION": "1",
        "KARPFLOW_CONTROLLER_SUPERVISE_INTERVAL": "1",
    }
    cluster = karpflow.stack.cluster_name
    rng = random.Random(17)
    workers = [karpflow.worker_process(**env)]
    try:
        await karpflow.eventually(lambda: _passes_at_least(karpflow, 1), within=60, what=karpflow.worker_logs)
        for _ in range(4):
            await asyncio.sleep(rng.uniform(0.2, 4.0))  # anywhere in a pass, a validation, a command
            await send_bad_signals(karpflow)
            workers[-1].send_signal(signal.SIGKILL)
            await asyncio.to_thread(workers[-1].wait)
            workers.append(karpflow.worker_process(**env))
        await send_bad_signals(karpflow)
        before = await karpflow.eventually(lambda: _status(karpflow), within=60, what=karpflow.worker_logs)

        async def quiet_and_on() -> ControllerStatus | None:
            status = await _status(karpflow)
            return status if status and status.quiet and status.passes > before.passes + 2 else None

        final = await karpflow.eventually(quiet_and_on, within=180, what=karpflow.worker_logs)
        assert (await latest(karpflow))[0] == WorkflowExecutionStatus.RUNNING
    finally:
        for process in workers:
            if process.poll() is None:
                process.terminate()
                await asyncio.to_thread(process.wait, 30)
        await karpflow.client.get_workflow_handle(controller_workflow_id(cluster)).terminate("test over")

    # Every bad signal of the last round is listed (earlier rounds may be in an earlier run).
    assert len(final.bad_signals) >= len(BAD_SIGNALS), final.bad_signals
    last_round = [entry.split(" ", 1)[1].split(":", 1)[0] for entry in final.bad_signals[-len(BAD_SIGNALS) :]]
    assert last_round == [name for name, _ in BAD_SIGNALS]
    query = f"TaskQueue = '{karpflow.task_queue}' AND WorkflowType = 'DisruptionWorkflow'"
    runs = [(e.id, e.status.name) async for e in karpflow.client.list_workflows(query)]
    ids = [workflow_id for workflow_id, _ in runs]
    assert runs and len(ids) == len(set(ids)), f"a command was started twice: {sorted(ids)}"
    assert len(await karpflow.nodes()) < len(FRAGMENTED)
    assert_no_violations(karpflow.stack)
