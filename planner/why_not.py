""" "Why is this node not disrupted?": the planner's reason for a node, as one of a few kinds.

The planner explains every managed node it leaves alone in words (`Plan.blocked`, the controller's
`status` query). Operators also want it counted and alerted on (`karpflow_unremovable_nodes{reason}`,
modelled on Cluster Autoscaler's `unremovable_nodes_count`), recorded as a Kubernetes Event under the
reason Karpenter would use, and named in `karpflow status --node`. `kind_of(text)` reads the kind off
the text; the unit tests build each kind with the real planner, so a reworded reason that no longer
classifies fails there.

Pure: used by the planning activity, the CLI and the tests.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import lru_cache

from api.event_reasons import Reason, awaiting_approval_message

# The DisruptionWorkflow phase (KarpflowPhase) of a command held for an operator's approval.
AWAITING_APPROVAL_PHASE = "AwaitingApproval"


class Kind(StrEnum):
    """What holds a node back (the `reason` label of karpflow_unremovable_nodes)."""

    MAINTENANCE_WINDOW = "MaintenanceWindow"
    NODE_DISRUPTION_BUDGET = "NodeDisruptionBudget"
    AWAITING_APPROVAL = "AwaitingApproval"
    BACKOFF = "Backoff"
    IN_PROGRESS = "InProgress"  # a disruption or termination holds it already
    NOT_INITIALIZED = "NotInitialized"
    DO_NOT_DISRUPT = "DoNotDisrupt"  # a pod's or the node's do-not-disrupt (or older) annotation
    POD_DISRUPTION_BUDGET = "PodDisruptionBudget"
    BUDGET = "Budget"  # the NodePool's disruption budgets (count, rate, or invalid: fail closed)
    CONSOLIDATE_AFTER = "ConsolidateAfter"
    CONSOLIDATION_POLICY = "ConsolidationPolicy"  # WhenEmpty, consolidateAfter Never
    NO_CHEAPER_PLACEMENT = "NoCheaperPlacement"  # nothing cheaper, pods fit nowhere, under the floor
    TOO_MANY_UNHEALTHY = "TooManyUnhealthy"  # node repair holds off
    NOT_CHOSEN = "NotChosen"  # eligible, but another command ends the pass: next pass
    STATIC_NODEPOOL = "StaticNodePool"  # never consolidated; its drift waits while over its replicas
    LIMITS = "Limits"  # the NodePool's spec.limits (nodes or resources) leave no room for a replacement
    NODE_OVERLAY = "NodeOverlay"  # a NodeOverlay that may price the pool is not applied: fails closed
    # the capacity reservations a reserved replacement could use have no instance left in the pass
    CAPACITY_RESERVATION = "CapacityReservation"
    OTHER = "Other"


# First match wins: the more specific phrases come before the ones they contain.
_RULES: tuple[tuple[Kind, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE))
    for kind, pattern in (
        (Kind.NODE_OVERLAY, r"\bNodeOverlay \S+ is not applied\b"),
        (Kind.MAINTENANCE_WINDOW, r"\bMaintenanceWindows?\b"),
        (Kind.NODE_DISRUPTION_BUDGET, r"\bNodeDisruptionBudget\b"),
        (Kind.AWAITING_APPROVAL, r"\bapproval\b"),
        (Kind.BACKOFF, r"\bbacks off\b"),
        (Kind.IN_PROGRESS, r"disruption (already )?in progress|being deleted|termination in progress"),
        (Kind.NOT_INITIALIZED, r"\bnot initialized\b"),
        (Kind.DO_NOT_DISRUPT, r"\bdo-not-(disrupt|evict|consolidate)\b"),
        (Kind.POD_DISRUPTION_BUDGET, r"\bpdbs?\b"),
        (Kind.TOO_MANY_UNHEALTHY, r"\bunhealthy \(more than\b"),
        (Kind.STATIC_NODEPOOL, r"static NodePool: never consolidated|over its \d+ replicas"),
        (Kind.LIMITS, r"\blimits\.nodes \S+ leaves no room|\bspec\.limits\b"),
        (Kind.CAPACITY_RESERVATION, r"^reserved capacity: "),
        (Kind.BUDGET, r"\bbudget\b"),
        # Its own window, or a destination's (pods kept off a node inside its window, Karpenter v1.14).
        (Kind.CONSOLIDATE_AFTER, r"\bnot consolidatable until\b|\bconsolidateAfter window\b"),
        (Kind.CONSOLIDATION_POLICY, r"consolidationPolicy|consolidation is disabled"),
        (
            Kind.NOT_CHOSEN,
            r"not chosen this pass|per pass|left to emptiness|timed out before this node|not evaluated",
        ),
        (
            Kind.NO_CHEAPER_PLACEMENT,
            r"cheaper|cannot be rescheduled|can't remove without|no instance type|SpotToSpot"
            r"|savings floor|target fleet|Filtering|cannot price it|needed for pricing",
        ),
    )
)


@lru_cache(maxsize=16384)
def kind_of(reason: str) -> Kind:
    """The kind of one reason text (`Plan.blocked[].reason`, or the status query's `blocked`).
    Memoised: a pass classifies thousands of reasons, mostly the same texts as the pass before,
    each twice (its Events and its metrics), and a dozen regular expressions per text add up."""
    for kind, pattern in _RULES:
        if pattern.search(reason):
            return kind
    return Kind.OTHER


@dataclass(frozen=True)
class EventChoice:
    reason: Reason
    prefix: str = ""  # Karpenter's DisruptionBlocked messages start "Cannot disrupt Node: "


# The Event a node gets for each kind; None: no Event (it is already being worked on, or goes next).
EVENTS: dict[Kind, EventChoice | None] = {
    Kind.MAINTENANCE_WINDOW: EventChoice(Reason.DISRUPTION_WAITING_WINDOW),
    Kind.NODE_DISRUPTION_BUDGET: EventChoice(Reason.DISRUPTION_WAITING_NODE_DISRUPTION_BUDGET),
    # The same words as the approval gate's own Event (api.event_reasons.awaiting_approval_message).
    Kind.AWAITING_APPROVAL: EventChoice(Reason.DISRUPTION_AWAITING_APPROVAL),
    Kind.BACKOFF: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.IN_PROGRESS: None,
    Kind.NOT_INITIALIZED: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.DO_NOT_DISRUPT: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.POD_DISRUPTION_BUDGET: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.BUDGET: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.CONSOLIDATE_AFTER: EventChoice(Reason.UNCONSOLIDATABLE),
    Kind.CONSOLIDATION_POLICY: EventChoice(Reason.UNCONSOLIDATABLE),
    Kind.NO_CHEAPER_PLACEMENT: EventChoice(Reason.UNCONSOLIDATABLE),
    Kind.TOO_MANY_UNHEALTHY: EventChoice(Reason.NODE_REPAIR_BLOCKED),
    Kind.NOT_CHOSEN: None,
    # Karpenter skips a static pool's node without an Event (emptiness.go, consolidation.go ShouldDisrupt).
    Kind.STATIC_NODEPOOL: None,
    Kind.LIMITS: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.NODE_OVERLAY: EventChoice(Reason.UNCONSOLIDATABLE),
    Kind.CAPACITY_RESERVATION: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
    Kind.OTHER: EventChoice(Reason.DISRUPTION_BLOCKED, "Cannot disrupt Node: "),
}


def event_for(reason: str) -> tuple[Reason, str] | None:
    """The Event reason and message for a node held back by `reason` (None: no Event)."""
    choice = EVENTS[kind_of(reason)]
    if choice is None:
        return None
    return choice.reason, f"{choice.prefix}{reason}"


def counts(reasons: dict[str, str]) -> dict[Kind, int]:
    """How many nodes each kind holds back (every kind present, zero included)."""
    out = dict.fromkeys(Kind, 0)
    for text in reasons.values():
        out[kind_of(text)] += 1
    return out


def in_flight_reason(workflow_id: str, phase: str) -> str:
    """What holds a node a running workflow owns: that workflow (and the approval it waits for)."""
    if phase == AWAITING_APPROVAL_PHASE:
        return awaiting_approval_message(workflow_id)
    return f"disruption in progress: {workflow_id}"
