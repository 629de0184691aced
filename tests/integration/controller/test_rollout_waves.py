"""Waves with a health gate stop a bad AMI (issue 35 item 2's acceptance), on the local stack.

A pool of three with `karpflow.dev/rollout-policy: {"canary": 1, "soak": "2m", ...}`. The
EC2NodeClass moves to an AMI whose containers crash-loop (`sim faults bad-ami --pods-crash`): the
controller starts the pool's drift rollout, exactly one node is replaced, the gate sees the crash
loop on the new node and halts the rollout, with an Event on the NodePool and a notification to a
local webhook; passes go by and no other node of the pool is drifted. The EC2NodeClass then moves to
a good AMI: the halted rollout is superseded, and the new target's rollout replaces the pool in two
waves (the canary, then two), each held through its soak, to the end.

Real parts: the worker with its controller (as the Deployment's ServiceAccount), the Temporal dev
server, the emulator with its kubelet, scheduler and workload controllers, moto, kubectl. The
EC2NodeClass's `status.amis` is written as Karpenter's nodeclass controller would after the user's
amiSelectorTerms change (the emulator runs no such controller)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

import pytest
import yaml
from aiohttp import web

from api.constants import NODEPOOL_LABEL
from api.rollout_io import RolloutStatus
from api.rollout_policy import ROLLOUT_POLICY_ANNOTATION, ROLLOUT_STATE_ANNOTATION
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import FAST
from tests.integration.controller.test_controller import status as controller_status
from tests.integration.workflows.conftest import REPO, Workload, node

pytestmark = [pytest.mark.integration, pytest.mark.slow(seconds=360), pytest.mark.timeout(720)]

NODES = [node(f"172.31.8.{i}", "m5.large") for i in (11, 12, 13)]
# One big pod a node: a displaced pod fits only on its replacement, so the new node runs it.
BIG = Workload("shop", "web", "1500m", "512Mi", ["11", "12", "13"])
POLICY = {"canary": 1, "soak": "2m", "growth": 2, "maxRestarts": 2, "readyTimeout": "90s"}


def waves_scenario() -> Any:
    listing = copy.deepcopy(gen.scenario_list(NODES, [BIG]))
    for item in listing["items"]:
        if item["kind"] == "NodePool" and item["metadata"]["name"] == "default":
            item["spec"]["disruption"] = {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": "Never",
                "budgets": [{"nodes": "100%"}],
            }
            item["metadata"].setdefault("annotations", {})[ROLLOUT_POLICY_ANNOTATION] = json.dumps(POLICY)
    return scenario_from_documents([listing], "rollout waves scenario")


class Webhook:
    """A local receiver for the operator's notifications (json format)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        async def take(request: web.Request) -> web.Response:
            self.received.append(await request.json())
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/hook", take)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/hook"

    def events(self) -> list[str]:
        return [str(m.get("event")) for m in self.received]


def grant_notifications(karpflow: Any, url: str, tmp_path: Any) -> None:
    """The webhook's Secret and deploy/base's Role that lets the worker read it, as installed."""
    rendered = kubectl(karpflow.stack, "kustomize", f"{REPO}/deploy/base")
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in ("Role", "RoleBinding")]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "karpflow-notifications", "namespace": "karpflow"},
        "data": {"url": base64.b64encode(url.encode()).decode()},
    }
    path = tmp_path / "notify.yaml"
    path.write_text(yaml.safe_dump_all([*docs, secret]))
    kubectl(karpflow.stack, "apply", "-f", str(path))


def other_images(karpflow: Any, current: set[str]) -> list[str]:
    """Two x86_64 images moto knows that the EC2NodeClass does not use yet."""
    images = karpflow.stack.ec2_client().describe_images(
        Filters=[{"Name": "architecture", "Values": ["x86_64"]}]
    )["Images"]
    found = sorted({i["ImageId"] for i in images} - current)
    assert len(found) >= 2, found
    return found[:2]


async def move_amis(karpflow: Any, image: str) -> None:
    """What Karpenter's nodeclass controller writes once amiSelectorTerms name `image`."""
    raw = await karpflow.kube.get_cluster_custom("karpenter.k8s.aws", "v1", "ec2nodeclasses", "default")
    raw["status"]["amis"] = [
        {
            "id": image,
            "name": image,
            "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
        }
    ]
    await karpflow.kube.replace_cluster_custom_status(
        "karpenter.k8s.aws", "v1", "ec2nodeclasses", "default", raw
    )


async def pool_nodes(karpflow: Any) -> dict[str, dict[str, Any]]:
    return {
        name: n
        for name, n in (await karpflow.nodes()).items()
        if (n["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) == "default"
        and not n["metadata"].get("deletionTimestamp")
    }


def image_of(karpflow: Any, node: dict[str, Any]) -> str:
    instance = node["spec"]["providerID"].rsplit("/", 1)[-1]
    described = karpflow.stack.ec2_client().describe_instances(InstanceIds=[instance])
    return str(described["Reservations"][0]["Instances"][0]["ImageId"])


async def rollouts(karpflow: Any) -> dict[str, Any]:
    query = f"WorkflowType = 'RolloutWorkflow' AND TaskQueue = '{karpflow.task_queue}'"
    return {e.id: e async for e in karpflow.client.list_workflows(query)}


async def drift_commands(karpflow: Any) -> list[str]:
    query = f"WorkflowType = 'DisruptionWorkflow' AND TaskQueue = '{karpflow.task_queue}'"
    return [e.id async for e in karpflow.client.list_workflows(query) if "/Drifted/" in e.id]


async def rollout_status(karpflow: Any, rollout_id: str) -> RolloutStatus:
    return await karpflow.client.get_workflow_handle(rollout_id).query("status", result_type=RolloutStatus)


async def nodepool_events(karpflow: Any) -> list[dict[str, Any]]:
    listed = await karpflow.kube.request("GET", "/api/v1/namespaces/default/events")
    return [e for e in listed.get("items") or [] if e["involvedObject"].get("kind") == "NodePool"]


@pytest.mark.sim_stack(scenario=waves_scenario())
async def test_a_bad_ami_halts_at_the_canary_and_a_good_one_rolls_in_waves(karpflow, tmp_path):
    webhook = Webhook()
    await webhook.start()
    grant_notifications(karpflow, webhook.url, tmp_path)
    seeded = await pool_nodes(karpflow)
    assert len(seeded) == 3
    current = {image_of(karpflow, n) for n in seeded.values()}
    bad, good = other_images(karpflow, current)
    karpflow.stack.faults.add_bad_image(bad, crash_loop=True)
    # A pass every 2 s, not FAST's 0.5 s: the test lasts its two soaks, and CI's two cores pay for
    # every pass; the halt's check still sees five passes go by.
    settings = {
        **FAST,
        "controller_interval": 2.0,
        "notify_webhook_secret": "karpflow/karpflow-notifications",
        "notify_format": "json",
    }
    async with karpflow.worker(**settings):
        await move_amis(karpflow, bad)

        seen: dict[str, Any] = {}

        async def halted() -> tuple[str, RolloutStatus] | None:
            await asyncio.sleep(2)  # visibility and a query per rollout: every other second is enough
            seen["controller"] = (await controller_status(karpflow)).blocked
            for rollout_id in await rollouts(karpflow):
                status = await rollout_status(karpflow, rollout_id)
                seen[rollout_id] = status
                if status.phase == "Halted":
                    return rollout_id, status
            return None

        first, status = await karpflow.eventually(
            halted, within=180, what=lambda: f"the rollout halted by its gate; saw {seen}"
        )
        assert status.mode == "drift" and status.wave == 1
        assert "restart" in status.halted, status.halted
        assert len(await drift_commands(karpflow)) == 1
        now = await pool_nodes(karpflow)
        assert len(set(now) - set(seeded)) == 1 and len(set(seeded) - set(now)) == 1
        (canary,) = set(now) - set(seeded)
        assert image_of(karpflow, now[canary]) == bad
        # The NodePool says so, for the planner and for kubectl; an Event; the operator's webhook.
        pool = await karpflow.kube.get_cluster_custom("karpenter.sh", "v1", "nodepools", "default")
        state = json.loads(pool["metadata"]["annotations"][ROLLOUT_STATE_ANNOTATION])
        assert (state["id"], state["phase"]) == (first, "Halted")
        await karpflow.eventually(
            lambda: _has_event(karpflow, "RolloutHalted"), within=30, what="a RolloutHalted Event"
        )
        await karpflow.eventually(
            lambda: _received(webhook, "RolloutHalted"), within=60, what="the webhook told"
        )
        # Passes go by: nothing else of the pool is drifted toward the bad target.
        await asyncio.sleep(10)
        assert len(await drift_commands(karpflow)) == 1
        assert set(await pool_nodes(karpflow)) == set(now)

        await move_amis(karpflow, good)

        async def next_rollout() -> str | None:
            await asyncio.sleep(1)
            return next((r for r in await rollouts(karpflow) if r != first), None)

        second = await karpflow.eventually(next_rollout, within=60, what="the good target's rollout")
        handle = karpflow.client.get_workflow_handle(second, result_type=RolloutStatus)
        done = await asyncio.wait_for(handle.result(), timeout=480)
        assert (done.phase, done.wave, done.total, done.replaced) == ("Succeeded", 2, 3, 3), done
        superseded = await rollout_status(karpflow, first)
        assert superseded.phase == "Superseded", superseded
        final = await pool_nodes(karpflow)
        assert len(final) == 3 and not set(final) & (set(seeded) | {canary})
        assert {image_of(karpflow, n) for n in final.values()} == {good}
        assert len(await drift_commands(karpflow)) == 4
        await karpflow.eventually(
            lambda: _received(webhook, "RolloutFinished"), within=60, what="the finish told"
        )
    await webhook.runner.cleanup()  # type: ignore[union-attr]
    assert_no_violations(karpflow.stack)


async def _has_event(karpflow: Any, reason: str) -> bool:
    return any(e["reason"] == reason for e in await nodepool_events(karpflow))


async def _received(webhook: Webhook, event: str) -> bool:
    return event in webhook.events()
