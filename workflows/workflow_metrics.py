"""Metrics recorded from workflow code, replay-safe: `workflow.metric_meter()` records only when a
workflow task runs for the first time, never while a history is replayed, so a decision or a
rollback is counted once however often its history is replayed. The worker's Temporal runtime hands
the values to /metrics (runtime/metrics.py lists these names in SDK_DECLARED; prometheus-client never
defines them too).

    started = workflow.now()
    ...                                   # the phase
    record_phase("Draining", workflow.now() - started)

Workflow code must not import runtime.metrics or kube.events: prometheus-client fails inside the
workflow sandbox. The SDK adds the workflow type, namespace and task queue to every series.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

# The SDK appends `_seconds` to a duration histogram's name, and `_total` to a counter's, on the way
# to Prometheus (runtime/metrics.py `_prometheus_name`).
PHASE_DURATION = "karpflow_workflow_phase_duration"
DECISIONS = "karpenter_voluntary_disruption_decisions"
ROLLBACKS = "karpflow_disruption_rollbacks"
ROLLOUT_WAVES = "karpflow_rollout_waves"

PHASE_HELP = "Time a disruption or termination spent in each phase, by workflow type and phase."
DECISIONS_HELP = (
    "Voluntary disruption commands the controller started, by decision (delete or replace), reason "
    "and consolidation type."
)
ROLLOUT_WAVES_HELP = (
    "Rollout waves by NodePool and outcome: started, passed (the gate held through the soak) or "
    "halted (the gate failed)."
)
ROLLBACKS_HELP = "Voluntary disruptions rolled back (candidates untainted, replacements removed), by reason."


def record_phase(phase: str, elapsed: timedelta) -> None:
    """One observation of `phase`."""
    histogram = workflow.metric_meter().create_histogram_timedelta(
        PHASE_DURATION, description=PHASE_HELP, unit="duration"
    )
    histogram.record(max(elapsed, timedelta(0)), {"phase": phase})


def count_decision(decision: str, reason: str, consolidation_type: str) -> None:
    """A voluntary command the controller started (Karpenter's decisions_total)."""
    counter = workflow.metric_meter().create_counter(DECISIONS, description=DECISIONS_HELP)
    counter.add(1, {"decision": decision, "reason": reason, "consolidation_type": consolidation_type})


def count_rollback(reason: str) -> None:
    """A voluntary disruption that rolled back (failure or cancellation)."""
    counter = workflow.metric_meter().create_counter(ROLLBACKS, description=ROLLBACKS_HELP)
    counter.add(1, {"reason": reason})


def count_wave(nodepool: str, outcome: str) -> None:
    """A rollout wave started, passed its gate, or halted the rollout."""
    counter = workflow.metric_meter().create_counter(ROLLOUT_WAVES, description=ROLLOUT_WAVES_HELP)
    counter.add(1, {"nodepool": nodepool, "outcome": outcome})
