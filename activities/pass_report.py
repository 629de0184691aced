"""What a controller pass tells operators besides its result: Kubernetes Events and Prometheus series.

The pass's answer to "why is this node not disrupted?" (one reason per managed node) becomes:
- an Event on the node under the reason its kind calls for (planner/why_not.py): DisruptionBlocked
  with the reason, Unconsolidatable, DisruptionWaitingWindow, DisruptionWaitingNodeDisruptionBudget,
  NodeRepairBlocked; DisruptionBlocked on a NodePool whose budget allows none for a reason; and a
  Warning InvalidNodePoolSettings on a NodePool with a setting that does not read (a karpflow.dev/*
  annotation, a budget, a duration), naming each. No condition is written on the NodePool: its status
  is Karpenter's (beside Karpenter, its status controller owns the conditions). The
  recorder (kube/events.py) deduplicates them, so a node blocked every pass keeps one Event whose
  count grows;
- `karpflow_unremovable_nodes{reason}` by kind, and Karpenter's series of a pass: eligible nodes and
  evaluation time per method, allowed disruptions and nodes consuming budgets per NodePool, the pass
  time, the estimated savings of what it planned.

The gauges are set by the worker that ran the pass (cleared first, so a reason gone is gone); with
several workers, each shows the last pass it ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from api.constants import KARPENTER_GROUP, KARPENTER_VERSION
from kube import events
from kube.events import Event, ObjectRef
from planner import why_not
from planner.plan import Plan
from planner.repair import REPAIR
from planner.snapshot import Snapshot
from runtime import metrics


def node_ref(snapshot: Snapshot, name: str) -> ObjectRef:
    """The node as `kubectl describe` matches its Events: name and UID."""
    node = snapshot.nodes.get(name)
    return ObjectRef("Node", name, uid=node.uid if node is not None else "")


def nodepool_ref(snapshot: Snapshot, name: str) -> ObjectRef:
    pool = snapshot.nodepools.get(name)
    uid = (pool.metadata.uid or "") if pool is not None else ""
    return ObjectRef("NodePool", name, uid=uid, api_version=f"{KARPENTER_GROUP}/{KARPENTER_VERSION}")


def pass_events(result: Plan, snapshot: Snapshot, reasons: Mapping[str, str]) -> list[Event]:
    """The Events of one pass: each node held back (by its reason), a repair held off on a node whose
    main reason is another, and each NodePool budget that allows no disruption for a reason."""
    out = []
    for name, text in sorted(reasons.items()):
        chosen = why_not.event_for(text)
        if chosen is not None:
            out.append(events.held_back(node_ref(snapshot, name), *chosen))
    for blocked in result.blocked:
        if why_not.kind_of(reasons.get(blocked.node, blocked.reason)) == why_not.Kind.TOO_MANY_UNHEALTHY:
            continue  # already its main reason
        for detail in blocked.details:
            if detail.method == REPAIR and why_not.kind_of(detail.reason) == why_not.Kind.TOO_MANY_UNHEALTHY:
                out.append(events.node_repair_blocked(node_ref(snapshot, blocked.node), detail.reason))
    for pool, problems in sorted(snapshot.budget_errors.items()):
        out.append(events.invalid_nodepool_settings(nodepool_ref(snapshot, pool), list(problems)))
    for pool, allowed in sorted(result.budgets_at_start.items()):
        counted = result.budget_nodes.get(pool)
        if counted is None or counted.nodes == 0:
            continue  # a pool without nodes has nothing to block
        for reason, left in sorted(allowed.items()):
            if left == 0:
                out.append(events.nodepool_budget_blocked(nodepool_ref(snapshot, pool), reason))
    return out


def record_pass_metrics(result: Plan, reasons: Mapping[str, str], seconds: float) -> None:
    """Set the series a pass owns (cleared first: a label that is gone must not linger)."""
    metrics.CONTROLLER_PASS_DURATION.observe(seconds)
    metrics.UNREMOVABLE_NODES.clear()
    for kind, count in why_not.counts(dict(reasons)).items():
        metrics.UNREMOVABLE_NODES.labels(reason=str(kind)).set(count)
    metrics.ELIGIBLE_NODES.clear()
    eligible: dict[str, int] = {}
    for evaluation in result.evaluations:
        metrics.DECISION_EVALUATION.labels(
            reason=evaluation.reason, consolidation_type=evaluation.consolidation_type
        ).observe(evaluation.seconds)
        # Two methods share Underutilized (multi- and single-node): the larger set is the pool of both.
        eligible[evaluation.reason] = max(eligible.get(evaluation.reason, 0), evaluation.eligible)
    for reason, count in eligible.items():
        metrics.ELIGIBLE_NODES.labels(reason=reason).set(count)
    metrics.ALLOWED_DISRUPTIONS.clear()
    metrics.NODES_CONSUMING_BUDGETS.clear()
    for pool, allowed in result.budgets_at_start.items():
        counted = result.budget_nodes.get(pool)
        for reason, left in allowed.items():
            metrics.ALLOWED_DISRUPTIONS.labels(nodepool=pool, reason=reason).set(left)
            if counted is not None:
                metrics.NODES_CONSUMING_BUDGETS.labels(nodepool=pool, reason=reason).set(counted.disrupting)
    metrics.ESTIMATED_SAVINGS.clear()
    for reason, saving in savings_by_reason(result.commands_).items():
        metrics.ESTIMATED_SAVINGS.labels(reason=reason).set(saving)


def savings_by_reason(commands: Iterable[object]) -> dict[str, float]:
    out: dict[str, float] = {}
    for command in commands:
        reason = str(getattr(command, "reason", ""))
        out[reason] = round(out.get(reason, 0.0) + float(getattr(command, "savings_per_hour", 0.0) or 0.0), 6)
    return out
