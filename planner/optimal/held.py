"""The Optimal plan held across passes, kept on the nodes themselves.

A target fleet is reached in several moves: the first ones may launch a large node that only pays
for itself once later moves have filled it. So the plan must outlive the pass that made it, and the
room it keeps on the nodes it launched must not be taken by anyone else meanwhile.

Where it is kept: a node annotation karpflow writes, `karpflow.io/optimal-plan`, on every node of the
plan, with the plan's id, the node's role and the plan's figures (JSON, `PlanMarker`):
- **leaving**: a node the plan removes in a later move (it also wears the `karpflow.io/leaving`
  taint, planner/optimal/leaving.py). The planner asks for these markers (`AnnotationChange`s the
  controller applies with `apply_annotations`) when a plan starts.
- **launched**: a node a move of the plan launched; the marker comes with the launch itself
  (`Replacement.annotations`, written by the DisruptionWorkflow when the node registers). Its free
  room is what the plan's later moves fill.

Why the cluster and not the controller's state: the planner stays pure (the plan is part of its
snapshot, as `karpflow plan --snapshot` sees it too), every method of the same pass sees it (Karpenter's
methods leave the plan's pools alone), the markers survive a worker, a controller run, a continue-as-new
or a lost pass, and an operator sees with kubectl which nodes are in the plan. Nothing but a
karpflow-written annotation is read, so a real cluster has all of it.

What makes it safe (`HeldPlan.ledger`): `leavingCost` is what the plan's leaving nodes cost when it
started. At any time, the plan has saved that minus what its leaving nodes still present cost, and
spent what its launched nodes present cost. Every move is checked so that spent - saved stays <= 0,
with launches at their worst-case price: the plan never leaves the cluster dearer than it found it,
at any pass, and dropping it at any point is safe. A plan whose rest no longer fits, no longer saves,
or whose leaving node can no longer be moved is dropped at once (its markers and taints removed).
A plan's moves run one at a time, so what is in flight is always visible to the next pass.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from kube.times import rfc3339
from planner.catalog import Catalog
from planner.snapshot import Node, Snapshot

PLAN_ANNOTATION = "karpflow.io/optimal-plan"
# A node's part in the plan: it leaves in a later move, or the plan launched it.
Role = Literal["leaving", "launched"]
LEAVING: Role = "leaving"
LAUNCHED: Role = "launched"


class PlanMarker(BaseModel):
    """The value of `karpflow.io/optimal-plan` on a node of the plan."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    id: str
    role: Role
    since: datetime
    start_cost: float  # $/h of the Optimal scope when the plan started (shown to people)
    leaving_cost: float  # $/h of its leaving nodes when it started: what removing them all saves
    target_cost: float  # $/h the scope should cost once the plan is done
    # The new nodes it planned when it started, "pool/instance type/capacity type" each: later moves
    # launch these rather than what a fresh solve would pick from where the kube-scheduler put pods.
    launches: list[str] = []

    def as_value(self) -> str:
        return self.model_dump_json(by_alias=True)

    def with_role(self, role: Role) -> PlanMarker:
        return self.model_copy(update={"role": role})


def read_marker(node: Node) -> PlanMarker | None:
    raw = node.annotations.get(PLAN_ANNOTATION)
    if raw is None:
        return None
    try:
        return PlanMarker.model_validate_json(raw)
    except ValidationError:
        return None


@dataclass
class HeldPlan:
    marker: PlanMarker  # the plan's figures (role: leaving)
    leaving: list[str] = field(default_factory=list)  # present, not being deleted
    launched: list[str] = field(default_factory=list)  # present, not being deleted
    busy: list[str] = field(default_factory=list)  # its nodes in flight: being deleted or disrupted
    pools: set[str] = field(default_factory=set)

    @property
    def id(self) -> str:
        return self.marker.id

    @property
    def nodes(self) -> set[str]:
        return {*self.leaving, *self.launched, *self.busy}

    def still_to_launch(self, snapshot: Snapshot) -> Counter[str]:
        """The planned new nodes its moves have not launched yet (launched ones present subtracted)."""
        left = Counter(self.marker.launches)
        left.subtract(launch_key(snapshot.nodes[n]) for n in self.launched)
        return +left

    def ledger(self, snapshot: Snapshot, catalog: Catalog) -> float:
        """$/h this plan has added to the cluster so far (<= 0 when it has saved): its launched nodes
        present, minus what its leaving nodes no longer cost (gone or on their way out)."""
        still = sum(node_price(snapshot.nodes[n], catalog) for n in self.leaving)
        spent = sum(node_price(snapshot.nodes[n], catalog) for n in self.launched)
        return spent - (self.marker.leaving_cost - still)


def launch_key(node: Node) -> str:
    return f"{node.nodepool}/{node.instance_type}/{node.capacity_type}"


def node_price(node: Node, catalog: Catalog) -> float:
    """The node's own offering (type, zone, capacity type) as its NodePool sees it; 0 when the catalog
    cannot price it."""
    kind = catalog.for_pool(node.nodepool).get(node.instance_type)
    if kind is None:
        return 0.0
    return kind.price(node.zone or "", node.capacity_type or "") or 0.0


def read_plans(snapshot: Snapshot, optimal_pools: Collection[str]) -> tuple[HeldPlan | None, list[str]]:
    """The plan held by the nodes of Optimal pools, and the nodes whose markers must go: markers of
    another plan (only one is held at a time: the oldest wins), unreadable ones, or on nodes of pools
    that no longer use the strategy."""
    plans: dict[str, HeldPlan] = {}
    stale: list[str] = []
    # Few nodes hold a marker: filter before sorting (a pass reads this at 5,000 nodes).
    for name in sorted(n for n, node in snapshot.nodes.items() if PLAN_ANNOTATION in node.annotations):
        node = snapshot.nodes[name]
        marker = read_marker(node)
        if marker is None or node.nodepool not in optimal_pools:
            stale.append(name)
            continue
        plan = plans.get(marker.id)
        if plan is None:
            plan = plans[marker.id] = HeldPlan(marker.with_role(LEAVING))
        plan.pools.add(node.nodepool or "")
        if node.is_deleting or node.has_disrupted_taint:
            plan.busy.append(name)
        elif marker.role == LEAVING:
            plan.leaving.append(name)
        else:
            plan.launched.append(name)
    if not plans:
        return None, stale
    kept = min(plans.values(), key=lambda p: (p.marker.since, p.id))
    for plan in plans.values():
        if plan is not kept:
            stale.extend(plan.nodes)
    return kept, sorted(stale)


def plan_id(now: datetime, leaving: Iterable[str]) -> str:
    """A short id, the same for the same pass and nodes (the planner is deterministic)."""
    text = rfc3339(now) + "\n" + "\n".join(sorted(leaving))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def marker_changes(
    snapshot: Snapshot, wanted: dict[str, PlanMarker], unwanted: Iterable[str]
) -> list[tuple[str, str | None]]:
    """(node, value or None) changes that put `wanted` markers on and take `unwanted` ones off; nodes
    being deleted are left as they are."""
    out: list[tuple[str, str | None]] = []
    for name, marker in sorted(wanted.items()):
        node = snapshot.nodes.get(name)
        if node is None or node.is_deleting:
            continue
        if read_marker(node) != marker:
            out.append((name, marker.as_value()))
    for name in sorted(set(unwanted) - set(wanted)):
        node = snapshot.nodes.get(name)
        if node is not None and not node.is_deleting and PLAN_ANNOTATION in node.annotations:
            out.append((name, None))
    return out


__all__ = [
    "LAUNCHED",
    "LEAVING",
    "PLAN_ANNOTATION",
    "HeldPlan",
    "PlanMarker",
    "launch_key",
    "marker_changes",
    "node_price",
    "plan_id",
    "read_marker",
    "read_plans",
]
