"""NodeDisruptionBudgets: the nodes a budget selects, those unavailable, and how many more may go
(docs/operator-controls.md).

Rules (Karpenter's graceful termination design, with PodDisruptionBudget arithmetic):
- A budget selects the nodes whose labels match its label `selector`. A null or empty selector
  selects NO node (unlike a PodDisruptionBudget's, whose empty selector selects everything).
- A selected node is unavailable when it is NotReady, being deleted, tainted `karpenter.sh/disrupted`
  (its drain started, or a command holds it: the controller shows the nodes of workflows in flight to
  the planner with that taint), claimed in the budget's status (a termination is about to take it:
  activities/budget_claims.py), or disrupted by an earlier command of the same pass.
- Allowed unavailable: `maxUnavailable`, or the selected count minus `minAvailable`. Percentages are of
  the selected nodes, rounded up (as a PodDisruptionBudget's). Remaining = allowed - unavailable,
  never below 0.
- Voluntary commands (emptiness, drift, consolidation) take only nodes every budget selecting them
  still has room for; forceful ones (expiration, interruption, repair, NodePool deletion) are never
  stopped by a budget but their nodes count as unavailable.
- A budget that does not fit its schema (both or neither of minAvailable / maxUnavailable, a percent
  over 100, a selector that cannot be read) allows nothing for the nodes it selects (every node when
  its selector cannot be read), and is reported as a problem.

This module reads nodes through the small `NodeState` protocol, so the snapshot can use it to read
the objects without an import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import ValidationError

from api.node_disruption_budget import NodeDisruptionBudget
from kube.disruption import is_disrupting
from kube.selectors import LabelSelector


class NodeState(Protocol):
    """What a budget needs to know of a node (planner.snapshot.Node has it)."""

    name: str
    uid: str
    labels: dict[str, str]
    ready: bool

    @property
    def is_deleting(self) -> bool: ...

    @property
    def has_disrupted_taint(self) -> bool: ...


@dataclass(frozen=True)
class Ndb:
    """A NodeDisruptionBudget as the planner applies it."""

    name: str
    # None: selects no node (a null or empty selector).
    selector: LabelSelector | None
    min_available: int | str | None = None
    max_unavailable: int | str | None = None
    # A selector that cannot be read: the budget fails closed for every node.
    selects_every_node: bool = False
    problems: tuple[str, ...] = ()
    # (node, uid) of the claims in its status: nodes a termination is taking down under it.
    claims: tuple[tuple[str, str], ...] = ()

    @property
    def broken(self) -> bool:
        return bool(self.problems)

    def selects(self, labels: Mapping[str, str]) -> bool:
        if self.selects_every_node:
            return True
        return self.selector is not None and self.selector.matches(labels)

    def claimed(self, node: NodeState) -> bool:
        """Whether a claim in the status holds this node (a claim of an earlier node of the name
        does not: a node name is not an identity)."""
        return any(name == node.name and (not uid or uid == node.uid) for name, uid in self.claims)

    def allowed_unavailable(self, selected: int) -> int:
        if self.broken:
            return 0
        if self.max_unavailable is not None:
            return scaled(self.max_unavailable, selected)
        if self.min_available is not None:
            return max(selected - scaled(self.min_available, selected), 0)
        return 0

    def describe(self) -> str:
        if self.broken:
            return "invalid: allows nothing"
        if self.max_unavailable is not None:
            return f"maxUnavailable {self.max_unavailable}"
        return f"minAvailable {self.min_available}"


def scaled(value: int | str, total: int) -> int:
    """An integer, or a percentage of `total` rounded up."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def unavailable(node: NodeState) -> bool:
    """NotReady, being deleted or tainted by a disruption: the planner's rule (kube/disruption.py)."""
    return is_disrupting(node)


@dataclass
class NdbStatus:
    """One budget at one moment: who it selects, who is unavailable, and what is left."""

    ndb: Ndb
    selected: list[str]
    unavailable: list[str]
    allowed: int
    # Nodes taken by the commands of this pass so far (they are unavailable from now on).
    taken: list[str] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        return max(self.allowed - len(self.unavailable) - len(self.taken), 0)

    def message(self) -> str:
        down = len(self.unavailable) + len(self.taken)
        return (
            f"NodeDisruptionBudget {self.ndb.name} allows {self.remaining} "
            f"({self.ndb.describe()}; {down} of {len(self.selected)} selected nodes unavailable)"
        )


def statuses(
    budgets: Iterable[Ndb], nodes: Iterable[NodeState], disrupted: Iterable[str] = ()
) -> list[NdbStatus]:
    """Every budget's status over `nodes`; `disrupted`: nodes this pass's commands already took."""
    nodes = list(nodes)
    down_now = {n.name for n in nodes if unavailable(n)} | set(disrupted)
    out = []
    for ndb in sorted(budgets, key=lambda b: b.name):
        selected = [n for n in nodes if ndb.selects(n.labels)]
        down = [n.name for n in selected if n.name in down_now or ndb.claimed(n)]
        allowed = ndb.allowed_unavailable(len(selected))
        out.append(NdbStatus(ndb, sorted(n.name for n in selected), sorted(down), allowed))
    return out


class NdbLedger:
    """The budgets of one pass, spent as voluntary commands take nodes."""

    def __init__(self, status: list[NdbStatus]) -> None:
        self.status = status
        # node -> the budgets selecting it that still count it as available
        self._available_in: dict[str, list[NdbStatus]] = {}
        for item in status:
            down = set(item.unavailable) | set(item.taken)
            for name in item.selected:
                if name not in down:
                    self._available_in.setdefault(name, []).append(item)

    def blocking(self, nodes: Iterable[str]) -> NdbStatus | None:
        """The first budget that has no room for all of `nodes` (None: they may all go)."""
        need: dict[int, tuple[NdbStatus, int]] = {}
        for name in dict.fromkeys(nodes):
            for item in self._available_in.get(name, ()):
                need[id(item)] = (item, need.get(id(item), (item, 0))[1] + 1)
        for item, count in need.values():
            if item.remaining < count:
                return item
        return None

    def take(self, nodes: Iterable[str]) -> None:
        for name in dict.fromkeys(nodes):
            for item in self._available_in.pop(name, ()):
                item.taken.append(name)


# --- Reading the object (fail closed) -------------------------------------------------------------


def read_ndb(raw: Mapping[str, Any]) -> Ndb:
    """The budget an object describes; one that does not fit the schema allows nothing (never raises)."""
    meta = raw.get("metadata")
    name = str(meta.get("name") or "<no name>") if isinstance(meta, Mapping) else "<no name>"
    claims = read_claims(raw)
    try:
        model = NodeDisruptionBudget.model_validate(raw)
    except ValidationError as err:
        problems = tuple(_message(e) for e in err.errors())
        spec = raw.get("spec")
        if not isinstance(spec, Mapping):
            spec = {}
        try:
            selector = _selector(spec.get("selector"))
        except (ValueError, AttributeError, TypeError):
            return Ndb(name, None, selects_every_node=True, problems=problems, claims=claims)
        return Ndb(name, selector, problems=problems, claims=claims)
    spec = model.spec
    selector = None
    if spec.selector is not None and not spec.selector.is_empty:
        selector = LabelSelector.from_dict(spec.selector.to_wire())
    return Ndb(name, selector, spec.min_available, spec.max_unavailable, claims=claims)


def read_claims(raw: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(node, uid) of every readable claim in the object's status (the status of a budget whose spec
    is broken still counts: its claims are nodes going down)."""
    status = raw.get("status")
    items = status.get("claims") if isinstance(status, Mapping) else None
    if not isinstance(items, list):
        return ()
    return tuple(
        (str(item["node"]), str(item.get("uid") or ""))
        for item in items
        if isinstance(item, Mapping) and isinstance(item.get("node"), str)
    )


def _selector(raw: Any) -> LabelSelector | None:
    if raw is None:
        return None
    selector = LabelSelector.from_dict(raw, "spec.selector")
    return None if selector.is_empty else selector


def _message(error: Any) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    text = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{where}: {text}" if where else text
