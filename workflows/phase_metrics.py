"""Phase durations recorded from workflow code, replay-safe: `workflow.metric_meter()` records only
when a workflow task runs for the first time, never while a history is replayed, and the worker's
Temporal runtime hands the values to /metrics (runtime/metrics.py:
`karpflow_workflow_phase_duration_seconds`).

    started = workflow.now()
    ...                                   # the phase
    record_phase("Draining", workflow.now() - started)
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

# The SDK appends `_seconds` to a duration histogram's name on the way to Prometheus.
PHASE_DURATION = "karpflow_workflow_phase_duration"


def record_phase(phase: str, elapsed: timedelta) -> None:
    """One observation of `phase`; the SDK adds the workflow type, namespace and task queue."""
    histogram = workflow.metric_meter().create_histogram_timedelta(
        PHASE_DURATION,
        description="Time a disruption or termination spent in each phase, by workflow type and phase.",
        unit="duration",
    )
    histogram.record(max(elapsed, timedelta(0)), {"phase": phase})
