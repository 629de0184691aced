"""`karpflow rollout` end to end (issue 19): the real worker and controller, the emulator, moto, the
real `karpflow` and `temporal` executables and kubectl. The rollout only marks; the controller
replaces the marked nodes as drift, within NodeDisruptionBudgets and rate budgets, and the
invariant checker judges every disruption the simulated cluster sees."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus

from api.constants import ROLLOUT_ANNOTATION
from api.rollout_io import RolloutStatus
from sim.binaries import temporal_cli
from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import FAST, scenario, status
from tests.integration.workflows.conftest import REPO, Workload, node

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ZONE_A = [node(f"172.31.1.{i}", "m5.large", "us-west-2a") for i in range(11, 17)]
ZONE_B = [node(f"172.31.2.{i}", "m5.large", "us-west-2b") for i in (21, 22)]
ONE_POD_EACH = [Workload("shop", "web", "100m", "128Mi", [str(i) for i in (*range(11, 17), 21, 22)])]
FIVE = [node(f"172.31.1.{i}", "m5.large", "us-west-2a") for i in range(11, 16)]

ONE_AT_A_TIME = """
apiVersion: karpflow.dev/v1alpha1
kind: NodeDisruptionBudget
metadata:
  name: one-at-a-time
spec:
  selector:
    matchLabels:
      karpenter.sh/nodepool: default
  maxUnavailable: 1
"""


def cli_env(karpflow: Any) -> dict[str, str]:
    """What `source .state/env` sets for the `karpflow` and `temporal` commands."""
    return {
        "KARPFLOW_CLUSTER_NAME": karpflow.stack.cluster_name,
        "KARPFLOW_TEMPORAL_ADDRESS": karpflow.temporal_address,
        "KARPFLOW_TASK_QUEUE": karpflow.task_queue,
        "TEMPORAL_ADDRESS": karpflow.temporal_address,
        "KUBECONFIG": str(karpflow.stack.kubeconfig_path),
        "PATH": os.pathsep.join(
            [os.path.dirname(temporal_cli()), os.path.dirname(sys.executable), os.environ["PATH"]]
        ),
    }


def readme_rollout_blocks() -> list[str]:
    text = Path(REPO, "README.md").read_text()
    section = text.split("<!-- rollout-commands:begin -->")[1].split("<!-- rollout-commands:end -->")[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


async def rollout_status(karpflow: Any, rollout_id: str) -> RolloutStatus:
    return await karpflow.client.get_workflow_handle(rollout_id).query("status", result_type=RolloutStatus)


async def marks(karpflow: Any) -> dict[str, str]:
    return {
        name: n["metadata"]["annotations"][ROLLOUT_ANNOTATION]
        for name, n in (await karpflow.nodes()).items()
        if ROLLOUT_ANNOTATION in (n["metadata"].get("annotations") or {})
    }


async def disruptions_started(karpflow: Any) -> list[str]:
    query = f"WorkflowType = 'DisruptionWorkflow' AND TaskQueue = '{karpflow.task_queue}'"
    return [e.id async for e in karpflow.client.list_workflows(query)]


@pytest.mark.sim_stack(scenario=scenario(ZONE_A + ZONE_B, ONE_POD_EACH, consolidate_after="Never"))
async def test_a_rollout_of_six_and_two_kubectl_deletes_never_pass_a_node_budget_of_one(karpflow, tmp_path):
    path = tmp_path / "ndb.yaml"
    path.write_text(ONE_AT_A_TIME)
    kubectl(karpflow.stack, "apply", "-f", str(path))
    env = cli_env(karpflow)
    before = set(await karpflow.nodes())
    async with karpflow.worker(**FAST):
        started = await karpflow.run(
            "karpflow", "rollout", "default", "--selector", "topology.kubernetes.io/zone=us-west-2a",
            "--poll-interval", "1", **env,
        )  # fmt: skip
        rollout_id = started.stdout.strip()
        assert rollout_id.startswith(f"rollout/{karpflow.stack.cluster_name}/default/"), started
        await karpflow.eventually(
            lambda: _marked(karpflow, rollout_id, 6), within=30, what="six nodes marked"
        )
        for victim in ZONE_B:  # the NodeDisruptionBudget selects them too: they wait their turn
            await karpflow.run("kubectl", "delete", "node", victim.name, "--wait=false", **env)
        handle = karpflow.client.get_workflow_handle(rollout_id, result_type=RolloutStatus)
        done = await asyncio.wait_for(handle.result(), timeout=150)
        assert (done.phase, done.total, done.replaced, done.remaining) == ("Succeeded", 6, 6, [])
        await karpflow.eventually(
            lambda: _none_left(karpflow, before), within=60, what="the deleted nodes gone"
        )
        shown = await karpflow.run("karpflow", "rollout", "--status", rollout_id, **env)
        assert f"{rollout_id}: Succeeded, 6/6 replaced" in shown.stdout
    assert await marks(karpflow) == {}
    assert_no_violations(karpflow.stack)


@pytest.mark.sim_stack(scenario=scenario(FIVE, [], consolidate_after="Never"))
async def test_a_rate_of_two_per_hour_starts_exactly_two_of_a_rollout_of_five(karpflow):
    """With the README's commands as written: `karpflow rollout`, `--status`, then a rollout started
    and cancelled with the `temporal` CLI, which leaves the first rollout's marks alone."""
    kubectl(karpflow.stack, "annotate", "nodepool", "default", "karpflow.dev/max-disruptions-per-hour=2")
    start, by_hand = readme_rollout_blocks()
    env = cli_env(karpflow)
    async with karpflow.worker(**FAST):
        shown = await karpflow.run("bash", "-euo", "pipefail", "-c", start, **env)
        rollout_id = re.search(r"^(rollout/\S+):", shown.stdout, re.M).group(1)  # type: ignore[union-attr]
        held = await karpflow.eventually(
            lambda: _rate_holds(karpflow, 3), within=90, what=lambda: f"3 held by the rate: {LAST}"
        )
        await asyncio.sleep(3)  # several more passes: nothing else starts within the hour
        assert len(await disruptions_started(karpflow)) == 2, held
        progress = await karpflow.eventually(
            lambda: _replaced(karpflow, rollout_id, 2), within=30, what="2 replaced"
        )
        assert progress.total == 5 and len(progress.remaining) == 3
        assert set((await marks(karpflow)).values()) == {rollout_id}
        # Issue 31 item 5: --status says why each remaining node waits (here: the rate budget).
        waiting = await karpflow.run("karpflow", "rollout", "--status", rollout_id, **env)
        lines = {line.split(": ", 1)[0].strip(): line for line in waiting.stdout.splitlines()[1:]}
        assert set(lines) == set(progress.remaining), waiting.stdout
        assert all("rate" in line or "per hour" in line for line in lines.values()), waiting.stdout
        listed = await karpflow.run("karpflow", "status", **{**env, "COLUMNS": "200"})
        assert f"rollout {rollout_id}: Rolling, 2/5 replaced, 3 remaining" in listed.stdout, listed.stdout
        as_json = json.loads((await karpflow.run("karpflow", "status", "-o", "json", **env)).stdout)
        assert {"id": rollout_id, "phase": "Rolling", "replaced": 2, "total": 5, "remaining": 3} in as_json[
            "rollouts"
        ], as_json["rollouts"]

        await karpflow.run("bash", "-euo", "pipefail", "-c", by_hand, **env)
        manual = karpflow.client.get_workflow_handle(f"rollout/{karpflow.stack.cluster_name}/default/by-hand")
        await karpflow.eventually(
            lambda: _closed(manual, WorkflowExecutionStatus.CANCELED), within=30, what="by-hand cancelled"
        )
        assert set((await marks(karpflow)).values()) == {rollout_id}  # another rollout's marks stay

        cancelled = await karpflow.run("karpflow", "rollout", "--cancel", rollout_id, **env)
        assert f"{rollout_id}: Canceled, 2/5 replaced" in cancelled.stdout
        assert await marks(karpflow) == {}
        assert len(await disruptions_started(karpflow)) == 2
    assert_no_violations(karpflow.stack)


async def _marked(karpflow: Any, rollout_id: str, count: int) -> bool:
    return list((await marks(karpflow)).values()).count(rollout_id) == count


async def _none_left(karpflow: Any, before: set[str]) -> bool:
    return not set(await karpflow.nodes()) & before


LAST: dict[str, Any] = {}


async def _rate_holds(karpflow: Any, count: int) -> Any:
    shown = LAST["status"] = await status(karpflow)
    held = [why for why in shown.blocked.values() if "rate budget for Drifted is used up" in why]
    return shown if len(held) == count and not shown.in_flight else None


async def _replaced(karpflow: Any, rollout_id: str, count: int) -> RolloutStatus | None:
    progress = await rollout_status(karpflow, rollout_id)
    return progress if progress.replaced == count else None


async def _closed(handle: Any, wanted: WorkflowExecutionStatus) -> bool:
    return (await handle.describe()).status == wanted
