"""The controller carries out Optimal consolidation on the local stack (planner/optimal/).

A fragmented 12-node pool annotated `karpflow.dev/consolidation-strategy: Optimal`, budget 3: the
target removes most nodes, so the plan is held across passes. Its leaving nodes carry the plan's
marker (`karpflow.io/optimal-plan`, written by the controller's `apply_annotations`) and the
`karpflow.io/leaving:PreferNoSchedule` taint while earlier moves run (the simulated kube-scheduler
then prefers the nodes that stay); the nodes its moves launch join with the marker (written by the
DisruptionWorkflow at registration). The controller must converge to a cheaper fleet, within the
budget, with the invariant checker at zero and no leaving taint or plan marker left behind.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from api.controller_io import ControllerStatus
from api.workflow_ids import controller_workflow_id
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations

from .test_controller import LOAD, SMALL, disrupting, hourly_cost

pytestmark = pytest.mark.integration

BUDGET = 3
LEAVING = "karpflow.io/leaving"
PLAN = "karpflow.io/optimal-plan"


def optimal_scenario() -> Any:
    listing = copy.deepcopy(gen.scenario_list(list(SMALL), LOAD[:12]))
    for item in listing["items"]:
        if item["kind"] == "NodePool":
            item["metadata"].setdefault("annotations", {})["karpflow.dev/consolidation-strategy"] = "Optimal"
            item["spec"]["disruption"]["consolidateAfter"] = "0s"
            item["spec"]["disruption"]["budgets"] = [{"nodes": str(BUDGET)}]
    return scenario_from_documents([listing], "fragmented-12-optimal")


def marked(nodes: dict[str, dict[str, Any]], role: str | None = None) -> set[str]:
    out = set()
    for name, node in nodes.items():
        raw = (node["metadata"].get("annotations") or {}).get(PLAN)
        if raw is not None and (role is None or json.loads(raw)["role"] == role):
            out.add(name)
    return out


def leaving(nodes: dict[str, dict[str, Any]]) -> set[str]:
    return {
        name
        for name, node in nodes.items()
        if any(t.get("key") == LEAVING for t in node["spec"].get("taints") or ())
    }


@pytest.mark.sim_stack(scenario=optimal_scenario(), time_scale=0.01)
async def test_the_controller_walks_an_optimal_pool_to_a_cheaper_fleet(karpflow):
    before = hourly_cost(karpflow.instances())
    seen_leaving: set[str] = set()
    seen_marked: set[str] = set()
    seen_launched: set[str] = set()
    now_disrupting = set(disrupting(await karpflow.nodes()))
    worst = sorted(now_disrupting)

    def watch(event: Any) -> None:
        # Every change to a Node as the emulator stores it, not a poll of the API every 20 ms.
        nonlocal worst
        if event.resource.plural != "nodes":
            return
        if event.type == "DELETED":
            now_disrupting.discard(event.name)
            return
        node = {event.name: event.object}
        seen_leaving.update(leaving(node))
        seen_marked.update(marked(node, "leaving"))
        seen_launched.update(marked(node, "launched"))
        if disrupting(node):
            now_disrupting.add(event.name)
        else:
            now_disrupting.discard(event.name)
        if len(now_disrupting) > len(worst):
            worst = sorted(now_disrupting)

    stop_watching = karpflow.stack.store.add_listener(watch)
    handle = karpflow.client.get_workflow_handle(controller_workflow_id(karpflow.stack.cluster_name))
    status = ControllerStatus()
    try:
        async with karpflow.worker(controller=True, controller_interval=0.3, controller_validation=0.5):

            async def converged() -> bool:
                nonlocal status
                try:
                    status = await handle.query("status", result_type=ControllerStatus)
                except Exception:
                    return False
                return status.passes > 1 and status.quiet

            await karpflow.eventually(converged, within=240, what=lambda: status.model_dump_json(indent=1))
            await handle.terminate("test over")
    finally:
        stop_watching()

    after = hourly_cost(karpflow.instances())
    nodes = await karpflow.nodes()
    assert after < before * 0.6, (before, after, sorted(nodes))
    assert seen_leaving, "the nodes of later moves were never tainted karpflow.io/leaving"
    assert not leaving(nodes), "a leaving taint outlived the moves"
    assert seen_leaving <= seen_marked, "a node was tainted leaving without the plan's marker"
    assert seen_launched, "no node joined with the plan's marker"
    assert not marked(nodes), "a plan marker outlived its plan"
    assert 0 < len(worst) <= BUDGET, worst
    assert_no_violations(karpflow.stack)
    print(
        f"optimal, 12 nodes: ${before:.3f}/h -> ${after:.3f}/h on {len(nodes)} nodes; "
        f"{len(seen_leaving)} tainted leaving at some point, {len(seen_launched)} launched by the plan"
    )
