"""The operator's controls at the moment of acting (issue 19 phase 2): a disruption started by
anything (the controller, the interruption handler, a person with `temporal workflow start`) is
refused by the taint activity when a MaintenanceWindow blocks its action or its NodeDisruptionBudgets
have no room, before any change; room is claimed in the budget's status with a resourceVersion
precondition, so two workers racing for the last slot cannot both get it. The real activities over
HTTP against the emulator, which serves karpflow's CRDs as a cluster with deploy/crds applied."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import budget_claims
from activities.controls_gate import ControlsGate, ControlsUnreadable
from activities.guards import OWNER_ANNOTATION
from activities.kubernetes import KubernetesActivities
from activities.nodeclaims import NodeClaimActivities
from api.activity_io import HandoverWait, NodeRef, TaintRequest, TerminationGateRequest, UntaintRequest
from api.constants import (
    DISRUPTED_TAINT_KEY,
    EXPIRATION_DEFERRED_ANNOTATION,
    HOLDER_REASON_ANNOTATION,
    KARPFLOW_DISRUPTED_TAINT_KEY,
)
from api.controller_io import Pause
from kube.client import KubeApi
from sim.apiserver import crds
from sim.stack import KARPFLOW_CRDS
from tests.integration.activities.conftest import CLUSTER

pytestmark = pytest.mark.integration

VOLUNTARY = "disruption/prod/default/Underutilized"


def install_crds(world: Any) -> None:
    for path in sorted(KARPFLOW_CRDS.glob("*.karpflow.dev.yaml")):
        world.emu.store.create(crds.CRDS, yaml.safe_load(path.read_text()))
    crds.sync(world.emu.store)


def ndb(world: Any, name: str, max_unavailable: int | str, labels: dict[str, str]) -> None:
    world.emu.store.create(
        "nodedisruptionbudgets",
        {
            "apiVersion": "karpflow.dev/v1alpha1",
            "kind": "NodeDisruptionBudget",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels}, "maxUnavailable": max_unavailable},
        },
    )


def window(world: Any, name: str, actions: list[str], selector: list[dict[str, Any]] | None = None) -> None:
    spec: dict[str, Any] = {"actions": actions}
    if selector:
        spec["selector"] = selector
    world.emu.store.create(
        "maintenancewindows",
        {
            "apiVersion": "karpflow.dev/v1alpha1",
            "kind": "MaintenanceWindow",
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def claims(world: Any, name: str) -> list[dict[str, Any]]:
    return list((world.emu.store.get("nodedisruptionbudgets", name).get("status") or {}).get("claims") or [])


def tainted(node: dict[str, Any] | None) -> bool:
    return node is not None and any(t["key"] == DISRUPTED_TAINT_KEY for t in node["spec"].get("taints") or ())


def ingress_nodes(world: Any, *names: str) -> None:
    world.nodepool()
    install_crds(world)
    for name in names:
        world.node(name, labels={"example.com/role": "ingress"})


async def taint(
    activities: KubernetesActivities, nodes: list[str], command: str, reason: str = "Underutilized"
):
    request = TaintRequest(nodes=nodes, command_id=f"{command}@run", reason=reason)
    return await ActivityEnvironment().run(activities.taint_disrupted, request)


class SimultaneousStatusWrites(KubeApi):
    """The real client, except that the first status write of each of `parties` callers waits until
    all of them are about to write: every one read the budget at the same resourceVersion."""

    def __init__(self, kube: KubeApi, parties: int) -> None:
        self.__dict__.update(kube.__dict__)
        self.barrier = asyncio.Barrier(parties)
        self.first: set[int] = set()

    async def replace_cluster_custom_status(self, group, version, plural, name, body):  # type: ignore[no-untyped-def]
        task = id(asyncio.current_task())
        if task not in self.first:
            self.first.add(task)
            await self.barrier.wait()
        return await super().replace_cluster_custom_status(group, version, plural, name, body)


async def test_two_workers_racing_for_the_last_slot_of_a_budget_one_wins_and_the_other_changes_nothing(world):
    ingress_nodes(world, "in-0", "in-1", "in-2")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    racing = KubernetesActivities(
        SimultaneousStatusWrites(world.kube, 2),
        poll_interval=0.01,
        ownership=world.aws().ownership,
        cluster=CLUSTER,
    )

    async def attempt(node: str) -> Any:
        try:
            return await taint(racing, [node], f"{VOLUNTARY}/{node}")
        except ApplicationError as err:
            return err

    a, b = await asyncio.gather(attempt("in-0"), attempt("in-1"))

    outcomes = sorted([isinstance(a, ApplicationError), isinstance(b, ApplicationError)])
    assert outcomes == [False, True], (a, b)
    refused = a if isinstance(a, ApplicationError) else b
    loser = "in-0" if refused is a else "in-1"
    winner = "in-1" if loser == "in-0" else "in-0"
    assert refused.type == "Refused" and refused.non_retryable
    assert "NodeDisruptionBudget ingress allows 1 unavailable (maxUnavailable 1)" in refused.message
    assert not tainted(world.get_node(loser))  # refused before any change
    assert tainted(world.get_node(winner))
    assert [(c["node"], c["holder"]) for c in claims(world, "ingress")] == [
        (winner, f"{VOLUNTARY}/{winner}@run")
    ]


async def test_a_retried_taint_keeps_its_claim_and_a_rollback_gives_it_back(world):
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    activities = world.activities()
    first = await taint(activities, ["in-0"], f"{VOLUNTARY}/a")
    again = await taint(activities, ["in-0"], f"{VOLUNTARY}/a")  # an activity retry
    assert first[0].ok and again[0].ok
    assert len(claims(world, "ingress")) == 1
    annotations = world.get_node("in-0")["metadata"]["annotations"]
    assert annotations[OWNER_ANNOTATION] == f"{VOLUNTARY}/a@run"
    assert annotations[HOLDER_REASON_ANNOTATION] == "Underutilized"

    with pytest.raises(ApplicationError, match="NodeDisruptionBudget ingress allows 1"):
        await taint(activities, ["in-1"], f"{VOLUNTARY}/b")

    released = await ActivityEnvironment().run(
        activities.untaint_disrupted, UntaintRequest(nodes=["in-0"], command_id=f"{VOLUNTARY}/a@run")
    )
    assert released == ["in-0"] and claims(world, "ingress") == []
    assert HOLDER_REASON_ANNOTATION not in (world.get_node("in-0")["metadata"].get("annotations") or {})
    assert (await taint(activities, ["in-1"], f"{VOLUNTARY}/b"))[0].ok


async def test_forceful_work_is_never_stopped_by_a_budget_but_counts(world):
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    activities = world.activities()
    interrupted = await taint(activities, ["in-0"], "interruption/prod/i-0/spot", reason="Interrupted")
    assert interrupted[0].ok and claims(world, "ingress") == []  # no claim: never waits
    # ... but its taint makes the node unavailable: a voluntary command now finds no room.
    with pytest.raises(ApplicationError, match=r"1 of 2 selected nodes are \(in-0\)"):
        await taint(activities, ["in-1"], f"{VOLUNTARY}/c")


async def test_beside_karpenter_a_node_under_karpflows_own_taint_counts_against_the_budget(world):
    """Issue 30 item 3: with --karpenter-coexistence karpflow taints `karpflow.dev/disrupted`, and the
    claims read only `karpenter.sh/disrupted`: the first node taken counted as available, so a second
    command was granted the budget's only slot."""
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    beside = KubernetesActivities(
        world.kube,
        poll_interval=0.01,
        ownership=world.aws().ownership,
        cluster=CLUSTER,
        karpenter_coexistence=True,
    )
    interrupted = await taint(beside, ["in-0"], "interruption/prod/i-0/spot", reason="Interrupted")
    keys = [t["key"] for t in world.get_node("in-0")["spec"]["taints"]]
    assert interrupted[0].ok and KARPFLOW_DISRUPTED_TAINT_KEY in keys and DISRUPTED_TAINT_KEY not in keys
    with pytest.raises(ApplicationError, match=r"1 of 2 selected nodes are \(in-0\)"):
        await taint(beside, ["in-1"], f"{VOLUNTARY}/beside")
    assert not any(
        t["key"] == KARPFLOW_DISRUPTED_TAINT_KEY for t in world.get_node("in-1")["spec"].get("taints") or ()
    )
    assert claims(world, "ingress") == []


async def test_a_node_handed_to_karpenter_gives_its_claim_back_once_karpenter_is_done_with_it(world):
    """Issue 30 item 9: beside Karpenter a termination hands the node over and never removes its
    finalizer itself, where karpflow's own termination releases the claims: they stayed until the
    controller's sweep."""
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    (taken,) = await taint(world.activities(), ["in-0"], f"{VOLUNTARY}/handed-over", reason="Drifted")
    assert taken.ok and [c["node"] for c in claims(world, "ingress")] == ["in-0"]
    # Karpenter drains the node, terminates its instance and lets the API server remove it.
    node = world.get_node("in-0")
    world.emu.store.update("nodes", {**node, "metadata": {**node["metadata"], "finalizers": []}})
    world.emu.store.delete("nodes", "in-0")
    wait = HandoverWait(node="in-0", uid=taken.uid, poll_interval_seconds=0.01)
    done = await ActivityEnvironment().run(NodeClaimActivities(world.kube).await_karpenter_termination, wait)
    assert "Karpenter drained and terminated node in-0" in done
    assert claims(world, "ingress") == []
    assert (await taint(world.activities(), ["in-1"], f"{VOLUNTARY}/next", reason="Drifted"))[0].ok


async def test_a_node_selected_by_two_budgets_needs_room_in_both_and_keeps_no_half_claim(world):
    ingress_nodes(world, "in-0", "in-1", "in-2")
    world.node("other", labels={"example.com/role": "ingress", "zone-pair": "b"})
    ndb(world, "a-roomy", 2, {"example.com/role": "ingress"})
    ndb(world, "b-full", 0, {"zone-pair": "b"})
    activities = world.activities()
    with pytest.raises(ApplicationError, match="NodeDisruptionBudget b-full allows 0"):
        await taint(activities, ["other"], f"{VOLUNTARY}/d")
    assert claims(world, "a-roomy") == [] and not tainted(world.get_node("other"))
    assert (await taint(activities, ["in-0"], f"{VOLUNTARY}/e"))[0].ok  # a-roomy only
    assert [c["node"] for c in claims(world, "a-roomy")] == ["in-0"]


async def test_a_window_refuses_its_action_at_the_moment_of_acting(world):
    world.nodepool()
    install_crds(world)
    world.node("n1")
    window(world, "no-drift", ["Drift"])
    activities = world.activities()
    with pytest.raises(ApplicationError, match="MaintenanceWindow no-drift blocks Drift") as refused:
        await taint(activities, ["n1"], "disruption/prod/default/Drifted/by-hand", reason="Drifted")
    assert refused.value.type == "Refused" and not tainted(world.get_node("n1"))
    # The interruption handler's rebalance replacement is the Rebalance action, not Drift.
    assert (await taint(activities, ["n1"], "interruption/prod/i-1/rebalance", reason="Drifted"))[0].ok


async def test_a_window_blocking_expiration_refuses_a_hand_started_expiration(world):
    world.nodepool()
    install_crds(world)
    world.node("n1")
    window(world, "soft-expiry", ["Expiration"])
    with pytest.raises(ApplicationError, match="MaintenanceWindow soft-expiry blocks Expiration"):
        await taint(world.activities(), ["n1"], "disruption/prod/default/Expired/x", reason="Expired")
    assert not tainted(world.get_node("n1"))


async def test_an_expiration_a_window_deferred_is_paced_by_budgets(world):
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    for name in ("in-0", "in-1"):
        node = world.get_node(name)
        node["metadata"].setdefault("annotations", {})[EXPIRATION_DEFERRED_ANNOTATION] = (
            "2026-01-01T00:00:00Z"
        )
        world.emu.store.update("nodes", node)
    activities = world.activities()
    assert (await taint(activities, ["in-0"], "disruption/prod/default/Expired/a", reason="Expired"))[0].ok
    with pytest.raises(ApplicationError, match="NodeDisruptionBudget ingress allows 1"):
        await taint(activities, ["in-1"], "disruption/prod/default/Expired/b", reason="Expired")


async def test_a_kubectl_delete_waits_for_its_budget_with_an_event_then_goes(world):
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 1, {"example.com/role": "ingress"})
    activities = world.activities()
    assert (await taint(activities, ["in-0"], f"{VOLUNTARY}/f"))[0].ok
    request = TerminationGateRequest(
        node="in-1",
        uid=world.get_node("in-1")["metadata"]["uid"],
        reason="Manual",
        holder="termination/prod/in-1/u@r",
    )
    gate = await ActivityEnvironment().run(activities.termination_gate, request)
    assert not gate.go and gate.waiting_for == "NodeDisruptionBudget ingress", gate
    events = world.emu.store.list("events").items
    assert any(
        e["reason"] == "DisruptionWaitingNodeDisruptionBudget" and e["involvedObject"]["name"] == "in-1"
        for e in events
    ), events

    # in-0's termination ends: its claim goes with its finalizer, and in-1 may go.
    world.emu.store.delete("nodes", "in-0")
    await ActivityEnvironment().run(activities.remove_finalizer, NodeRef(node="in-0", uid=None))
    assert world.get_node("in-0") is None
    assert claims(world, "ingress") == []
    gate = await ActivityEnvironment().run(activities.termination_gate, request)
    assert gate.go and [c["holder"] for c in claims(world, "ingress")] == ["termination/prod/in-1/u@r"]
    # A node its command already holds is not counted twice.
    held = TerminationGateRequest(
        node="in-1",
        reason="Underutilized",
        holder="termination/prod/in-1/u@r2",
        command_id=f"{VOLUNTARY}/g@run",
    )
    await ActivityEnvironment().run(
        activities.taint_for_termination,
        NodeRef(node="in-1", holder="termination/prod/in-1/u@r", reason="Manual"),
    )
    assert (await ActivityEnvironment().run(activities.termination_gate, held)).go
    annotations = world.get_node("in-1")["metadata"]["annotations"]
    assert annotations[OWNER_ANNOTATION] == "termination/prod/in-1/u@r"
    assert annotations[HOLDER_REASON_ANNOTATION] == "Manual"


class PausedController(ControlsGate):
    """The controller's `pauses` query answered (or failing) as the test says; no recent starts."""

    def __init__(self, pauses: list[Pause] | None) -> None:
        super().__init__(None, CLUSTER, "tq")  # type: ignore[arg-type]
        self.answer = pauses

    async def pauses(self) -> list[Pause]:
        if self.answer is None:
            raise ControlsUnreadable("the controller's pauses cannot be read: deadline exceeded")
        return self.answer

    async def starts(self, since: Any) -> list[Any]:
        return []


def gated(world: Any, pauses: list[Pause] | None) -> KubernetesActivities:
    return KubernetesActivities(
        world.kube,
        poll_interval=0.01,
        ownership=world.aws().ownership,
        cluster=CLUSTER,
        controls=PausedController(pauses),
    )


async def test_a_termination_started_by_hand_waits_while_the_controller_is_paused(world):
    """Issue 30 item 6: every voluntary path passes the same gate; a TerminationWorkflow started by hand
    with a voluntary reason waits (its node is deleting already) while a pause covers it, or while
    the pauses cannot be read; a `kubectl delete node` is no voluntary disruption and goes."""
    world.nodepool()
    install_crds(world)
    world.node("n1")
    uid = world.get_node("n1")["metadata"]["uid"]
    drifted = TerminationGateRequest(node="n1", uid=uid, reason="Drifted", holder="termination/prod/n1/u@r")
    paused = Pause(scope="global", reason="incident", by="ops", since=datetime.now(UTC))
    env = ActivityEnvironment()

    gate = await env.run(gated(world, [paused]).termination_gate, drifted)
    assert not gate.go and gate.waiting_for == "a controller pause", gate
    assert "paused (everything by ops: incident)" in gate.message
    unreadable = await env.run(gated(world, None).termination_gate, drifted)
    assert not unreadable.go and "cannot be read" in unreadable.message, unreadable
    manual = drifted.model_copy(update={"reason": "Manual"})
    assert (await env.run(gated(world, None).termination_gate, manual)).go
    assert (await env.run(gated(world, []).termination_gate, drifted)).go


async def test_a_taint_is_refused_while_the_controller_is_paused_and_retried_while_it_cannot_say(world):
    world.nodepool()
    install_crds(world)
    world.node("n1")
    paused = Pause(scope="action", action="Drift", by="ops", since=datetime.now(UTC))
    with pytest.raises(ApplicationError, match=r"paused \(Drift by ops\)") as refused:
        await taint(gated(world, [paused]), ["n1"], "disruption/prod/default/Drifted/x", reason="Drifted")
    assert refused.value.non_retryable and not tainted(world.get_node("n1"))
    with pytest.raises(ApplicationError, match="cannot be read") as unreadable:
        await taint(gated(world, None), ["n1"], "disruption/prod/default/Drifted/x", reason="Drifted")
    assert not unreadable.value.non_retryable and not tainted(world.get_node("n1"))
    # Forceful work does not wait for the controller.
    spot = await taint(gated(world, None), ["n1"], "interruption/prod/i-1/spot", reason="Interrupted")
    assert spot[0].ok


async def test_the_sweep_drops_claims_of_gone_nodes_and_of_holders_that_stopped_before_tainting(world):
    ingress_nodes(world, "in-0", "in-1")
    ndb(world, "ingress", 2, {"example.com/role": "ingress"})
    kube = world.kube
    nodes = [world.get_node("in-0"), world.get_node("in-1")]
    assert await budget_claims.claim(kube, nodes[:1], "disruption/x/running@r", "Drifted") is None
    assert await budget_claims.claim(kube, nodes[1:], "disruption/x/crashed@r", "Drifted") is None
    assert await budget_claims.sweep(kube, running={"disruption/x/running"}, older_than_seconds=3600) == 0
    assert await budget_claims.sweep(kube, running={"disruption/x/running"}, older_than_seconds=0) == 1
    assert [c["node"] for c in claims(world, "ingress")] == ["in-0"]
    world.emu.store.delete("nodes", "in-0")
    node = world.get_node("in-0")
    if node is not None:  # the finalizer holds it: release it as a termination would
        node["metadata"]["finalizers"] = []
        world.emu.store.update("nodes", node)
    assert await budget_claims.sweep(kube, running={"disruption/x/running"}, older_than_seconds=3600) == 1
    assert claims(world, "ingress") == []
