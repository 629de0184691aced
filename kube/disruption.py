"""Is this node disrupting? One answer for everyone who counts nodes against a budget: the planner's
NodePool budgets and NodeDisruptionBudgets (planner/budgets.py, planner/node_disruption_budgets.py),
the interruption poller's rebalance check (through the planner's budget map), and the
NodeDisruptionBudget claims taken at the moment of acting (activities/budget_claims.py).

A node is disrupting when it is NotReady, being deleted, or carries a taint that says a disruption is
in flight, whoever wrote it: Karpenter's `karpenter.sh/disrupted`, karpflow's own
`karpflow.dev/disrupted` (its key beside Karpenter, --karpenter-coexistence), or v1beta1's
`karpenter.sh/disruption=disrupting` left by an older controller. Either controller's disruption takes
the node away, so a budget counts both.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from api.constants import (
    DISRUPTION_TAINT_KEYS,
    LEGACY_DISRUPTION_TAINT_KEY,
    LEGACY_DISRUPTION_TAINT_VALUE,
)

Json = Mapping[str, Any]


def disruption_taint(taints: Iterable[tuple[str, str | None]]) -> str | None:
    """The taint (as `key` or `key=value`) among (key, value) pairs that says a disruption is in
    flight; None when there is none."""
    for key, value in taints:
        if key in DISRUPTION_TAINT_KEYS:
            return key
        if key == LEGACY_DISRUPTION_TAINT_KEY and value == LEGACY_DISRUPTION_TAINT_VALUE:
            return f"{key}={value}"
    return None


def raw_taints(node: Json) -> Iterator[tuple[str, str | None]]:
    """(key, value) of a Node object's taints, as the API serves it."""
    for taint in (node.get("spec") or {}).get("taints") or ():
        if isinstance(taint, Mapping):
            yield str(taint.get("key") or ""), taint.get("value")


def raw_disruption_taint(node: Json) -> str | None:
    return disruption_taint(raw_taints(node))


class DisruptionState(Protocol):
    """What the rule needs of a node (planner.snapshot.Node has it, and RawNodeState for an object)."""

    @property
    def ready(self) -> bool: ...

    @property
    def is_deleting(self) -> bool: ...

    @property
    def has_disrupted_taint(self) -> bool: ...


def is_disrupting(node: DisruptionState, *, counting_deleting: bool = True) -> bool:
    """NotReady, being deleted, or tainted by a disruption in flight.

    `counting_deleting=False` is for a NodeDisruptionBudget claim only: a node that is only deleting
    (a `kubectl delete node` whose termination waits for that very claim) still runs its pods; counted
    as down, its own claim would be granted at once, and two such deletions would each count the
    other and wait for ever."""
    return not node.ready or node.has_disrupted_taint or (counting_deleting and node.is_deleting)


@dataclass(frozen=True)
class RawNodeState:
    """The rule's view of a Node object read from the API (no NodeClaim: what the node says)."""

    ready: bool
    is_deleting: bool
    has_disrupted_taint: bool

    @classmethod
    def of(cls, node: Json) -> RawNodeState:
        conditions = (node.get("status") or {}).get("conditions") or ()
        ready = any(
            isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
            for c in conditions
        )
        deleting = bool((node.get("metadata") or {}).get("deletionTimestamp"))
        return cls(ready, deleting, raw_disruption_taint(node) is not None)
