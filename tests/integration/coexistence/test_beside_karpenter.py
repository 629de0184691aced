"""karpflow beside Karpenter (docs/running-beside-karpenter.md), judged by the simulator's own
Karpenter (sim/controllers/karpenter/): it garbage-collects instances tagged for a NodePool that no
NodeClaim names, removes `karpenter.sh/disrupted` from nodes outside its queue, launches and
terminates the nodes of NodeClaims. With `--karpenter-coexistence` a consolidation, a drift
replacement and a spot interruption complete with no instance garbage-collected, no taint lost and
the invariants clean; without it, the same neighbour catches karpflow out.

Real parts: the worker (as its ServiceAccount, deploy/base's ClusterRole) and its controller, the
Temporal dev server, the emulator, moto, EventBridge and SQS in moto."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest

from activities.nodeclaims import REPLACEMENT_FOR_ANNOTATION
from api.constants import DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY, NODEPOOL_LABEL
from api.hashes import nodepool_hash_annotations
from api.nodepool import NodePool
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations, kubectl
from tests.integration.controller.test_controller import FAST, until_quiet
from tests.integration.workflows.conftest import Workload, node

pytestmark = pytest.mark.integration


def beside_karpenter(nodes: list[Any], workloads: list[Any], policy: str = "WhenEmptyOrUnderutilized") -> Any:
    """The demo's shape with the NodePool set up as the docs say: Karpenter's own disruption zeroed
    in the spec, karpflow's in `karpflow.dev/*` annotations."""
    nodes = [dataclasses.replace(n, pods=[]) for n in nodes]
    listing = copy.deepcopy(gen.scenario_list(nodes, workloads))
    stamps = {}
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["spec"]["disruption"] = {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": "Never",
                "budgets": [{"nodes": "0"}],
            }
            item["spec"]["template"]["spec"]["expireAfter"] = "Never"
            item["metadata"].setdefault("annotations", {}).update(
                {
                    "karpflow.dev/consolidation-policy": policy,
                    "karpflow.dev/consolidate-after": "1s",
                    "karpflow.dev/budgets": json.dumps([{"nodes": "100%"}]),
                }
            )
            # The template changed: the nodes were launched from this one (nothing has drifted).
            stamps[item["metadata"]["name"]] = nodepool_hash_annotations(NodePool.model_validate(item))
            item["metadata"]["annotations"].update(stamps[item["metadata"]["name"]])
    for item in listing["items"]:
        if item["kind"] == "Node":
            item["metadata"]["annotations"].update(stamps[item["metadata"]["labels"][NODEPOOL_LABEL]])
    return scenario_from_documents([listing], "beside Karpenter")


A, B = node("172.31.1.10", "m5.xlarge"), node("172.31.2.20", "m5.xlarge")
TWENTY_PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 10 + ["20"] * 10, pdb={"maxUnavailable": 2})]
COEXIST = {**FAST, "karpenter_coexistence": True}


def karpenter(karpflow: Any) -> dict[str, Any]:
    return karpflow.stack.controllers.controllers["karpenter"].status()


def nodeclaims(karpflow: Any) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in karpflow.stack.store.list("nodeclaims").items}


def no_disruption_taints(nodes: dict[str, dict[str, Any]]) -> None:
    keys = {t.get("key") for n in nodes.values() for t in n["spec"].get("taints") or []}
    assert not keys & {DISRUPTED_TAINT_KEY, KARPFLOW_DISRUPTED_TAINT_KEY}, keys


@pytest.mark.sim_stack(scenario=beside_karpenter([A, B], TWENTY_PODS), karpenter=True)
async def test_a_consolidation_beside_karpenter_replaces_two_nodes_with_a_nodeclaim(karpflow):
    before = {i["InstanceId"] for i in karpflow.instances()}
    seeded = set(nodeclaims(karpflow))
    assert len(seeded) == 2  # the scenario's nodes are Karpenter's
    async with karpflow.worker(**COEXIST):
        await until_quiet(karpflow, after_passes=3)
        nodes = await karpflow.nodes()
    assert len(nodes) == 1 and not set(nodes) & {A.name, B.name}, nodes
    (new,) = nodes.values()
    claims = nodeclaims(karpflow)
    assert not set(claims) & seeded  # the candidates' NodeClaims went with them
    (claim,) = claims.values()
    assert claim["metadata"]["annotations"][REPLACEMENT_FOR_ANNOTATION].startswith("disruption/")
    assert claim["status"]["nodeName"] == new["metadata"]["name"]
    no_disruption_taints(nodes)
    running = {i["InstanceId"] for i in karpflow.instances()}
    assert len(running) == 1 and not running & before
    status = karpenter(karpflow)
    assert status["garbage_collected"] == [] and status["taints_removed"] == [], status
    assert status["evictions"].get(201) or status["evictions"].get(200), status  # Karpenter drained them
    assert_no_violations(karpflow.stack)


DRIFTING = node("172.31.1.10", "m5.large")
ONE_NODE_OF_PODS = [Workload("shop", "web", "250m", "256Mi", ["10"] * 4, pdb={"maxUnavailable": 1})]


# WhenEmpty: no consolidation to a cheaper type first, only the drift.
@pytest.mark.sim_stack(scenario=beside_karpenter([DRIFTING], ONE_NODE_OF_PODS, "WhenEmpty"), karpenter=True)
async def test_a_drift_replacement_beside_karpenter(karpflow):
    async with karpflow.worker(**COEXIST):
        await until_quiet(karpflow, after_passes=2)

        def relabel(pool: dict[str, Any]) -> None:  # a template change: every node of the pool drifts
            pool["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {})["team"] = "shop"

        karpflow.stack.store.mutate("nodepools", "default", relabel)

        async def replaced() -> dict[str, Any] | None:
            nodes = await karpflow.nodes()
            pods = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
            if DRIFTING.name in nodes or len(nodes) != 1 or len(pods) != 4:
                return None
            ready = all(
                p["spec"].get("nodeName") in nodes and p["status"].get("phase") == "Running" for p in pods
            )
            return nodes if ready else None

        nodes = await karpflow.eventually(replaced, within=60, what=lambda: str(karpenter(karpflow)))
        await until_quiet(karpflow)
    (new,) = nodes.values()
    assert new["metadata"]["labels"]["team"] == "shop"  # Karpenter synced the NodeClaim's labels
    (claim,) = nodeclaims(karpflow).values()
    assert claim["metadata"]["annotations"][REPLACEMENT_FOR_ANNOTATION].split("/")[3] == "Drifted"
    # Ready follows Launched, Registered and Initialized, as operatorpkg's ConditionSet derives it.
    conditions = {c["type"]: c for c in claim["status"]["conditions"]}
    assert [conditions[t]["status"] for t in ("Launched", "Registered", "Initialized")] == ["True"] * 3
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("True", "Ready")
    header, row = kubectl(karpflow.stack, "get", "nodeclaims").splitlines()
    assert dict(zip(header.split(), row.split(), strict=True))["READY"] == "True"
    # The candidate's Events say what replaces it and that it waits for it, as on the direct path.
    listed = json.loads(kubectl(karpflow.stack, "get", "events", "-A", "-o", "json"))["items"]
    on_node = {e["reason"]: e["message"] for e in listed if e["involvedObject"]["name"] == DRIFTING.name}
    name = claim["metadata"]["name"]
    assert f"Launching NodeClaim {name} to replace it: Drifted" == on_node.get("DisruptionLaunching"), on_node
    assert f"NodeClaim {name}" in on_node.get("DisruptionWaitingReadiness", ""), on_node
    no_disruption_taints(nodes)
    status = karpenter(karpflow)
    assert status["garbage_collected"] == [] and status["taints_removed"] == [], status
    assert_no_violations(karpflow.stack)


SPOT, ON_DEMAND = node("172.31.1.10", "m5.large", capacity="spot"), node("172.31.2.20", "m5.large")
# ON_DEMAND is nearly full: SPOT's pods need a replacement.
SPOT_PODS = [
    Workload("shop", "web", "100m", "128Mi", ["10", "10", "20"], pdb={"maxUnavailable": 1}),
    Workload("batch", "filler", "1700m", "256Mi", ["20"]),
]


@pytest.mark.sim_stack(scenario=beside_karpenter([SPOT, ON_DEMAND], SPOT_PODS), karpenter=True)
async def test_a_spot_interruption_beside_karpenter_hands_the_node_over_with_its_deadline(karpflow, queue):
    instance = (await karpflow.nodes())[SPOT.name]["spec"]["providerID"].rsplit("/", 1)[-1]
    provider_id = (await karpflow.nodes())[SPOT.name]["spec"]["providerID"]
    async with karpflow.worker(
        interruption_queue=queue.name, interruption_wait=1, karpenter_coexistence=True
    ):
        queue.put_spot_interruption(instance)

        async def replaced() -> dict[str, Any] | None:
            nodes = await karpflow.nodes()
            pods = [p for p in await karpflow.pods() if p["metadata"]["namespace"] == "shop"]
            if SPOT.name in nodes or len(nodes) != 2:
                return None
            ok = all(
                p["spec"].get("nodeName") in nodes and p["status"].get("phase") == "Running" for p in pods
            )
            return nodes if ok and len(pods) == 3 else None

        nodes = await karpflow.eventually(replaced, within=60, what=lambda: str(karpenter(karpflow)))
    assert instance in {i["InstanceId"] for i in karpflow.instances(("shutting-down", "terminated"))}
    # The interruption's deadline went to Karpenter on the NodeClaim it drained the node by.
    assert provider_id in karpflow.stack.invariants.claim_deadlines
    claims = nodeclaims(karpflow)
    new = [c for c in claims.values() if REPLACEMENT_FOR_ANNOTATION in c["metadata"]["annotations"]]
    assert len(new) == 1 and new[0]["status"]["nodeName"] in nodes
    no_disruption_taints(nodes)
    status = karpenter(karpflow)
    assert status["garbage_collected"] == [] and status["taints_removed"] == [], status
    assert_no_violations(karpflow.stack)


@pytest.mark.sim_stack(scenario=beside_karpenter([A, B], TWENTY_PODS), karpenter=True)
async def test_without_the_mode_karpenter_garbage_collects_the_replacement_and_strips_the_taint(karpflow):
    """The failure the mode prevents: karpflow launches the replacement itself, tagged for the
    NodePool, and taints `karpenter.sh/disrupted`; the neighbour terminates the instance (no
    NodeClaim names it) and removes the taint from the candidates (they have NodeClaims and are not
    in its queue)."""
    async with karpflow.worker(**FAST):
        reported = await karpflow.eventually(
            lambda: _both(karpflow), within=60, what=lambda: str(karpenter(karpflow))
        )
        await _stop_commands(karpflow)
    assert {"garbage-collected", "taint-stripped"} <= reported
    status = karpenter(karpflow)
    assert status["garbage_collected"] and all(
        e["nodepool"] == "default" for e in status["garbage_collected"]
    )
    assert {e["node"] for e in status["taints_removed"]} & {A.name, B.name}


async def _both(karpflow: Any) -> set[str] | None:
    found = {v.invariant for v in karpflow.stack.invariants.violations}
    return found if {"garbage-collected", "taint-stripped"} <= found else None


async def _stop_commands(karpflow: Any) -> None:
    """The commands still waiting for their garbage-collected replacements: terminated, test over."""
    query = f"TaskQueue = '{karpflow.task_queue}' AND ExecutionStatus = 'Running'"
    async for execution in karpflow.client.list_workflows(query):
        await karpflow.client.get_workflow_handle(execution.id, run_id=execution.run_id).terminate(
            "test over"
        )
