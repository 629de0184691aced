"""The metrics registry: Karpenter's series names and labels, the Temporal SDK's buffered updates
turned into Prometheus series, and the drain's instrumentation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BUFFERED_METRIC_KIND_HISTOGRAM,
)

from activities.drain import Drainer
from kube.events import EventRecorder
from runtime import metrics
from runtime.metrics import TemporalMetrics
from tests.unit.observe.test_events import Clock, FakeEventsApi
from tests.unit.workflows.test_drain_rules import NOW, FakeApi, pod

KARPENTER_SERIES = {
    "karpenter_voluntary_disruption_eligible_nodes": {"reason"},
    "karpenter_voluntary_disruption_decision_evaluation_duration_seconds": {"reason", "consolidation_type"},
    "karpenter_voluntary_disruption_failed_validations": {"consolidation_type"},
    "karpenter_nodepools_allowed_disruptions": {"nodepool", "reason"},
    "karpenter_nodepools_nodes_consuming_budgets": {"nodepool", "reason"},
    # Karpenter #3015 and #3179 (main after v1.14.1): pkg/metrics/metrics.go
    "karpenter_nodeclaims_disrupted": {
        "reason",
        "nodepool",
        "capacity_type",
        "consolidation_policy",
        "termination_mode",
    },
    "karpenter_pods_disruption_initiated": {
        "reason",
        "nodepool",
        "capacity_type",
        "consolidation_policy",
        "termination_mode",
    },
    "karpenter_nodes_terminated": {"nodepool"},
    "karpenter_nodes_termination_duration_seconds": {"nodepool"},
    "karpenter_pods_drained": {"reason"},
    "karpenter_pods_eviction_requests": {"code"},
    "karpenter_interruption_received_messages": {"message_type"},
    "karpenter_interruption_deleted_messages": set(),
    "karpenter_interruption_message_queue_duration_seconds": set(),
}


def families() -> dict[str, Any]:
    body, _ = metrics.exposition()
    return {family.name: family for family in text_string_to_metric_families(body.decode())}


def label_names(collector: Any) -> set[str]:
    return set(collector._labelnames)


def test_karpenters_series_are_exported_with_karpenters_labels():
    exported = families()
    by_name = {c._name: c for c in metrics.REGISTRY._collector_to_names if hasattr(c, "_name")}
    for name, labels in KARPENTER_SERIES.items():
        assert name in exported, name
        assert label_names(by_name[name]) == labels, name


def test_karpflows_own_series_are_exported():
    exported = families()
    for name in (
        "karpflow_unremovable_nodes",
        "karpflow_estimated_savings_dollars_per_hour",
        "karpflow_controller_pass_duration_seconds",
        "karpflow_events",
        "karpflow_kube_client_throttle_seconds",
        "karpflow_kube_client_retry_after",
    ):
        assert name in exported, name


@dataclass
class FakeMetric:
    name: str
    kind: int
    unit: str | None = None
    description: str | None = None


@dataclass
class FakeUpdate:
    metric: FakeMetric
    value: float
    attributes: dict[str, str]


class FakeBuffer:
    def __init__(self) -> None:
        self.pending: list[FakeUpdate] = []

    def retrieve_updates(self) -> list[FakeUpdate]:
        taken, self.pending = self.pending, []
        return taken


def test_sdk_updates_become_counters_gauges_and_histograms():
    buffer = FakeBuffer()
    bridge = TemporalMetrics(buffer)
    requests = FakeMetric("temporal_request", BUFFERED_METRIC_KIND_COUNTER, description="requests")
    slots = FakeMetric("temporal_worker_task_slots_available", BUFFERED_METRIC_KIND_GAUGE)
    latency = FakeMetric("temporal_activity_execution_latency", BUFFERED_METRIC_KIND_HISTOGRAM, "duration")
    queue = {"task_queue": "karpflow"}
    buffer.pending = [
        FakeUpdate(requests, 2, {"operation": "Poll", **queue}),
        FakeUpdate(requests, 3, {"operation": "Poll", **queue}),
        FakeUpdate(slots, 10, queue),
        FakeUpdate(slots, 7, queue),
        FakeUpdate(latency, 0.2, queue),
        FakeUpdate(latency, 4.0, queue),
    ]
    bridge.drain()
    assert buffer.pending == []
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in bridge.collect()
        for s in family.samples
    }
    assert samples[("temporal_request_total", (("operation", "Poll"), ("task_queue", "karpflow")))] == 5
    assert samples[("temporal_worker_task_slots_available", (("task_queue", "karpflow"),))] == 7
    name = "temporal_activity_execution_latency_seconds"
    assert samples[(f"{name}_count", (("task_queue", "karpflow"),))] == 2
    assert samples[(f"{name}_sum", (("task_queue", "karpflow"),))] == 4.2
    assert samples[(f"{name}_bucket", (("le", "0.25"), ("task_queue", "karpflow")))] == 1
    assert samples[(f"{name}_bucket", (("le", "5"), ("task_queue", "karpflow")))] == 2
    # what workflows record (phases, decisions, rollbacks) is listed before any workflow records one,
    # and only there: prometheus-client must not define the same name
    declared = {f.name: f.type for f in TemporalMetrics(FakeBuffer()).collect()}
    assert declared[metrics.WORKFLOW_PHASE_DURATION] == "histogram"
    assert declared["karpenter_voluntary_disruption_decisions"] == "counter"
    assert declared["karpflow_disruption_rollbacks"] == "counter"
    # (only prometheus-client's own collectors: a worker started earlier in this process registered
    # the SDK's bridge, which lists these names, in the same registry)
    own = {
        family.name
        for collector in list(metrics.REGISTRY._collector_to_names)
        if not isinstance(collector, TemporalMetrics)
        for family in collector.collect()
    }
    assert not set(metrics.SDK_DECLARED) & own


def value(collector: Any, **labels: str) -> float:
    return collector.labels(**labels)._value.get()


async def test_the_drain_counts_evictions_by_code_and_records_evicted_and_failed_draining():
    class Api(FakeApi, FakeEventsApi):
        def __init__(self) -> None:
            FakeApi.__init__(self, [pod(f"web-{i}", labels={"app": "web"}) for i in range(3)], allowed=1)
            FakeEventsApi.__init__(self)

        async def find_node(self, name: str) -> dict[str, Any]:
            return {"metadata": {"name": name, "uid": "uid-of-n"}}

    api = Api()
    ok, refused = value(metrics.EVICTION_REQUESTS, code="200"), value(metrics.EVICTION_REQUESTS, code="429")
    drained = value(metrics.PODS_DRAINED, reason="Underutilized")
    recorder = EventRecorder(api, clock=Clock())  # type: ignore[arg-type]
    progress = await Drainer(
        api, "n", None, poll_interval=0.001, clock=lambda: NOW, reason="Underutilized", recorder=recorder
    ).run()
    assert progress.evicted == 3
    assert value(metrics.EVICTION_REQUESTS, code="200") - ok == 3
    assert value(metrics.EVICTION_REQUESTS, code="429") - refused == api.refused > 0
    assert value(metrics.PODS_DRAINED, reason="Underutilized") - drained == 3
    recorded = list(api.events.values())
    evicted = sorted(e["involvedObject"]["name"] for e in recorded if e["reason"] == "Evicted")
    assert evicted == ["web-0", "web-1", "web-2"]
    (failed,) = [e for e in recorded if e["reason"] == "FailedDraining"]
    assert failed["involvedObject"]["uid"] == "uid-of-n" and failed["type"] == "Warning"
    assert "PodDisruptionBudget" in failed["message"]
