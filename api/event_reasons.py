"""Every reason karpflow records a Kubernetes Event under, with its type and the kinds it lands on.

Karpenter's reasons are kept where the meaning is the same, so `kubectl get events
--field-selector reason=DisruptionBlocked` and alerts written for Karpenter keep working; karpflow's
own reasons (rollback, approval, windows, node disruption budgets) say what Karpenter has no word
for. kube/events.py builds and records them; this module is only the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

EventType = Literal["Normal", "Warning"]


class Reason(StrEnum):
    # Karpenter's (kubernetes-sigs/karpenter pkg/events, the AWS provider's interruption events)
    DISRUPTION_BLOCKED = "DisruptionBlocked"
    UNCONSOLIDATABLE = "Unconsolidatable"
    DISRUPTION_LAUNCHING = "DisruptionLaunching"
    DISRUPTION_WAITING_READINESS = "DisruptionWaitingReadiness"
    DISRUPTION_TERMINATING = "DisruptionTerminating"
    DISRUPTED = "Disrupted"
    EVICTED = "Evicted"
    FAILED_DRAINING = "FailedDraining"
    TERMINATION_GRACE_PERIOD_EXPIRING = "TerminationGracePeriodExpiring"
    FAILED_TERMINATION = "FailedTermination"
    NODE_REPAIR_BLOCKED = "NodeRepairBlocked"
    SPOT_INTERRUPTED = "SpotInterrupted"
    SPOT_REBALANCE_RECOMMENDATION = "SpotRebalanceRecommendation"
    CAPACITY_RESERVATION_INSTANCE_INTERRUPTED = "CapacityReservationInstanceInterrupted"
    INSTANCE_STOPPING = "InstanceStopping"
    INSTANCE_TERMINATING = "InstanceTerminating"
    INSTANCE_UNHEALTHY = "InstanceUnhealthy"
    # karpflow's own
    DISRUPTION_ROLLED_BACK = "DisruptionRolledBack"
    DISRUPTION_AWAITING_APPROVAL = "DisruptionAwaitingApproval"
    DISRUPTION_WAITING_WINDOW = "DisruptionWaitingWindow"
    DISRUPTION_WAITING_NODE_DISRUPTION_BUDGET = "DisruptionWaitingNodeDisruptionBudget"
    INVALID_MAINTENANCE_WINDOW = "InvalidMaintenanceWindow"
    INVALID_NODE_DISRUPTION_BUDGET = "InvalidNodeDisruptionBudget"
    INVALID_NODEPOOL_SETTINGS = "InvalidNodePoolSettings"
    INSTANCE_GARBAGE_COLLECTED = "InstanceGarbageCollected"
    ROLLOUT_WAVE_STARTED = "RolloutWaveStarted"
    ROLLOUT_HALTED = "RolloutHalted"
    ROLLOUT_SUCCEEDED = "RolloutSucceeded"
    ROLLOUT_ABORTED = "RolloutAborted"


@dataclass(frozen=True)
class ReasonInfo:
    type: EventType
    kinds: tuple[str, ...]  # the objects it is recorded on
    karpenter: bool  # the same name and meaning as Karpenter's
    # Karpenter's recorder drops a repeat within this window (its DedupeTimeout; 2 min by default);
    # after it, a repeat adds to the count of the Event already written.
    dedupe: timedelta
    meaning: str


_DEFAULT_DEDUPE = timedelta(minutes=2)

CATALOG: dict[Reason, ReasonInfo] = {
    Reason.DISRUPTION_BLOCKED: ReasonInfo(
        "Normal",
        ("Node", "NodePool"),
        True,
        timedelta(minutes=1),
        "a node cannot be disrupted now (with the reason), or a NodePool's budget allows none",
    ),
    Reason.UNCONSOLIDATABLE: ReasonInfo(
        "Normal", ("Node",), True, timedelta(minutes=15), "why consolidation leaves a node alone"
    ),
    Reason.DISRUPTION_LAUNCHING: ReasonInfo(
        "Normal", ("Node",), True, _DEFAULT_DEDUPE, "a replacement for disrupted nodes is launching"
    ),
    Reason.DISRUPTION_WAITING_READINESS: ReasonInfo(
        "Normal", ("Node",), True, _DEFAULT_DEDUPE, "a replacement must become ready before the drain"
    ),
    Reason.DISRUPTION_TERMINATING: ReasonInfo(
        "Normal", ("Node",), True, _DEFAULT_DEDUPE, "a disrupted node's termination has started"
    ),
    Reason.DISRUPTED: ReasonInfo(
        "Normal", ("Pod",), True, _DEFAULT_DEDUPE, "a pod deleted at its node's grace-period deadline"
    ),
    Reason.EVICTED: ReasonInfo("Normal", ("Pod",), True, _DEFAULT_DEDUPE, "a pod evicted by a drain"),
    Reason.FAILED_DRAINING: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "pods are still waiting to be evicted"
    ),
    Reason.TERMINATION_GRACE_PERIOD_EXPIRING: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "every pod will be deleted by the deadline"
    ),
    Reason.FAILED_TERMINATION: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "a step of the node's termination failed"
    ),
    Reason.NODE_REPAIR_BLOCKED: ReasonInfo(
        "Warning", ("Node", "NodePool"), True, _DEFAULT_DEDUPE, "too many unhealthy nodes to repair"
    ),
    Reason.SPOT_INTERRUPTED: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "EC2 will reclaim the spot instance in two minutes"
    ),
    Reason.CAPACITY_RESERVATION_INSTANCE_INTERRUPTED: ReasonInfo(
        "Warning",
        ("Node",),
        True,
        _DEFAULT_DEDUPE,
        "EC2 will reclaim the interruptible capacity reservation's instance in two minutes",
    ),
    Reason.SPOT_REBALANCE_RECOMMENDATION: ReasonInfo(
        "Normal", ("Node",), True, _DEFAULT_DEDUPE, "EC2 recommends rebalancing the spot instance"
    ),
    Reason.INSTANCE_STOPPING: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "the instance is stopping or stopped"
    ),
    Reason.INSTANCE_TERMINATING: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "the instance is shutting down or terminated"
    ),
    Reason.INSTANCE_UNHEALTHY: ReasonInfo(
        "Warning", ("Node",), True, _DEFAULT_DEDUPE, "AWS Health scheduled a change for the instance"
    ),
    Reason.DISRUPTION_ROLLED_BACK: ReasonInfo(
        "Warning",
        ("Node",),
        False,
        _DEFAULT_DEDUPE,
        "a voluntary disruption failed or was cancelled: the node is untainted, replacements removed",
    ),
    Reason.DISRUPTION_AWAITING_APPROVAL: ReasonInfo(
        "Normal", ("Node", "NodePool"), False, _DEFAULT_DEDUPE, "a disruption waits for `approve`"
    ),
    Reason.DISRUPTION_WAITING_WINDOW: ReasonInfo(
        "Normal", ("Node",), False, _DEFAULT_DEDUPE, "a MaintenanceWindow does not allow the action now"
    ),
    Reason.DISRUPTION_WAITING_NODE_DISRUPTION_BUDGET: ReasonInfo(
        "Normal", ("Node",), False, _DEFAULT_DEDUPE, "a NodeDisruptionBudget allows no more nodes now"
    ),
    Reason.INVALID_MAINTENANCE_WINDOW: ReasonInfo(
        "Warning",
        ("MaintenanceWindow",),
        False,
        _DEFAULT_DEDUPE,
        "the window cannot be read as written: it fails closed (always active, blocking what it may)",
    ),
    Reason.INVALID_NODE_DISRUPTION_BUDGET: ReasonInfo(
        "Warning",
        ("NodeDisruptionBudget",),
        False,
        _DEFAULT_DEDUPE,
        "the budget cannot be read as written: it fails closed (allows nothing for what it selects)",
    ),
    Reason.INVALID_NODEPOOL_SETTINGS: ReasonInfo(
        "Warning",
        ("NodePool",),
        False,
        _DEFAULT_DEDUPE,
        "a NodePool setting karpflow reads (a karpflow.dev/* annotation, a budget, a duration) is "
        "invalid: the pool fails closed for voluntary disruption until it is fixed",
    ),
    # Karpenter's garbage collection records no Event (its instance GC only logs at debug level).
    Reason.INSTANCE_GARBAGE_COLLECTED: ReasonInfo(
        "Warning",
        ("NodePool", "Node"),
        False,
        _DEFAULT_DEDUPE,
        "an instance karpflow launched for a command that closed without it (no Node, or one that never "
        "initialized) was terminated, and its Node deleted",
    ),
    # A NodePool's rollout waves (api/rollout_policy.py, workflows/rollout.py).
    Reason.ROLLOUT_WAVE_STARTED: ReasonInfo(
        "Normal", ("NodePool",), False, _DEFAULT_DEDUPE, "a rollout marked the nodes of its next wave"
    ),
    Reason.ROLLOUT_HALTED: ReasonInfo(
        "Warning",
        ("NodePool",),
        False,
        _DEFAULT_DEDUPE,
        "a wave's health gate failed: no further node of the pool is replaced toward that target until "
        "`karpflow rollout --resume` or `--abort`",
    ),
    Reason.ROLLOUT_SUCCEEDED: ReasonInfo(
        "Normal", ("NodePool",), False, _DEFAULT_DEDUPE, "every wave of a rollout passed its gate"
    ),
    Reason.ROLLOUT_ABORTED: ReasonInfo(
        "Warning", ("NodePool",), False, _DEFAULT_DEDUPE, "an operator aborted a halted rollout"
    ),
}


class RecordEventRequest(BaseModel):
    """The `record_event` activity's input: an Event on one object, for what a workflow knows and no
    activity does at the moment it acts (a failed termination, an approval awaited)."""

    kind: Literal["Node", "Pod", "NodePool"]
    name: str
    namespace: str = ""
    uid: str = Field(
        default="", description="the object's UID (a node's pinned one); else the object of the name now"
    )
    reason: Reason
    message: str = Field(max_length=1024)


def awaiting_approval_message(command: str) -> str:
    """DisruptionAwaitingApproval's message, one wording wherever it is recorded (the approval gate, the
    controller's pass), so the recorder counts them as one Event."""
    return f"Disruption {command} waits for approval"
