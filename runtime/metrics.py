"""Every Prometheus series the worker exports, in one place, and the Temporal SDK's own beside them.

Served at `/metrics` on the health port (runtime/health.py). Karpenter's names and labels are used
where the meaning is the same, so its dashboards and alerts carry over; karpflow's own series are
prefixed `karpflow_`. The Temporal SDK's metrics (`temporal_*`: polls, task latencies, slots,
failures) come from the worker's Temporal runtime through a `MetricBuffer` that is drained into
this registry (`TemporalMetrics`): one endpoint, one port, no second exporter to scrape.

Labels stay bounded: NodePool, reason, method, phase, status code; never a node or pod name.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

# Seconds, from a fraction of a second (an eviction) to an hour (a drain held by PDBs).
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

# -- Karpenter's names -------------------------------------------------------------------------------

ELIGIBLE_NODES = Gauge(
    "karpenter_voluntary_disruption_eligible_nodes",
    "Nodes the last controller pass found eligible for disruption, by reason.",
    ["reason"],
    registry=REGISTRY,
)
DECISION_EVALUATION = Histogram(
    "karpenter_voluntary_disruption_decision_evaluation_duration_seconds",
    "Time a disruption method took to compute its commands, by reason and consolidation type.",
    ["reason", "consolidation_type"],
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
FAILED_VALIDATIONS = Counter(
    "karpenter_voluntary_disruption_failed_validations_total",
    "Consolidation commands that failed their re-check after the validation delay.",
    ["consolidation_type"],
    registry=REGISTRY,
)
ALLOWED_DISRUPTIONS = Gauge(
    "karpenter_nodepools_allowed_disruptions",
    "Disruptions a NodePool's budgets allow now, by reason.",
    ["nodepool", "reason"],
    registry=REGISTRY,
)
NODES_CONSUMING_BUDGETS = Gauge(
    "karpenter_nodepools_nodes_consuming_budgets",
    "Nodes of a NodePool counted against its budgets (NotReady, deleting or disrupting), by reason.",
    ["nodepool", "reason"],
    registry=REGISTRY,
)
# Both disruption counters carry Karpenter's five labels (activities/disruption_metrics.py).
DISRUPTION_LABELS = ["reason", "nodepool", "capacity_type", "consolidation_policy", "termination_mode"]
NODECLAIMS_DISRUPTED = Counter(
    "karpenter_nodeclaims_disrupted_total",
    "Nodes whose termination a disruption started, and karpflow's launches its garbage collection "
    "terminated (reason garbage_collected or registration_timeout, as Karpenter's), by reason, NodePool, "
    "capacity type, consolidation policy (consolidation only) and termination mode.",
    DISRUPTION_LABELS,
    registry=REGISTRY,
)
PODS_DISRUPTION_INITIATED = Counter(
    "karpenter_pods_disruption_initiated_total",
    "Pods on the nodes a disruption deleted, counted as it deleted each (DaemonSet and mirror pods "
    "excluded), by the same labels as karpenter_nodeclaims_disrupted_total.",
    DISRUPTION_LABELS,
    registry=REGISTRY,
)
NODES_TERMINATED = Counter(
    "karpenter_nodes_terminated_total",
    "Nodes whose termination finished (finalizer removed), by NodePool.",
    ["nodepool"],
    registry=REGISTRY,
)
NODES_TERMINATION_DURATION = Histogram(
    "karpenter_nodes_termination_duration_seconds",
    "Time from a node's deletion to the removal of its finalizer, by NodePool.",
    ["nodepool"],
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
PODS_DRAINED = Counter(
    "karpenter_pods_drained_total",
    "Pods evicted (or deleted at the deadline) by a drain, by the node's disruption reason.",
    ["reason"],
    registry=REGISTRY,
)
EVICTION_REQUESTS = Counter(
    "karpenter_pods_eviction_requests_total",
    "Calls to the Eviction API, by HTTP status code.",
    ["code"],
    registry=REGISTRY,
)
INTERRUPTION_RECEIVED = Counter(
    "karpenter_interruption_received_messages_total",
    "Interruption messages received from SQS, by message type.",
    ["message_type"],
    registry=REGISTRY,
)
INTERRUPTION_DELETED = Counter(
    "karpenter_interruption_deleted_messages_total",
    "Interruption messages deleted from SQS (handled, or unparseable).",
    registry=REGISTRY,
)
INTERRUPTION_QUEUE_DURATION = Histogram(
    "karpenter_interruption_message_queue_duration_seconds",
    "Time from an interruption event to the start of the workflow that acts on it.",
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)

# -- karpflow's own ----------------------------------------------------------------------------------

UNREMOVABLE_NODES = Gauge(
    "karpflow_unremovable_nodes",
    "Managed nodes the last controller pass could not disrupt, by what held them back "
    "(Cluster Autoscaler's unremovable_nodes_count).",
    ["reason"],
    registry=REGISTRY,
)
ESTIMATED_SAVINGS = Gauge(
    "karpflow_estimated_savings_dollars_per_hour",
    "Estimated hourly savings of the commands the last controller pass planned, by reason.",
    ["reason"],
    registry=REGISTRY,
)
CONTROLLER_PASS_DURATION = Histogram(
    "karpflow_controller_pass_duration_seconds",
    "Time one controller planning pass took (observe and plan).",
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
DRAIN_DURATION = Histogram(
    "karpflow_drain_duration_seconds",
    "Time one drain attempt ran until the node had no pod left to wait for.",
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
KUBE_CLIENT_THROTTLED = Counter(
    "karpflow_kube_client_throttle_seconds_total",
    "Seconds requests to the Kubernetes API waited for the client's token bucket (--kube-client-qps).",
    registry=REGISTRY,
)
KUBE_CLIENT_RETRY_AFTER = Counter(
    "karpflow_kube_client_retry_after_total",
    "Requests to the Kubernetes API sent again after a Retry-After, by the status that asked (429, 5xx).",
    ["code"],
    registry=REGISTRY,
)
EVENTS = Counter(
    "karpflow_events_total",
    "Kubernetes Events by reason and outcome (created, aggregated, deduplicated, rate_limited, failed).",
    ["reason", "outcome"],
    registry=REGISTRY,
)


def exposition() -> tuple[bytes, str]:
    """The registry in Prometheus' text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


# -- the Temporal SDK's metrics -----------------------------------------------------------------------

_SECONDS_UNITS = {"s", "seconds", "duration"}

# Recorded by workflow code through `workflow.metric_meter()` (workflows/workflow_metrics.py), which
# the SDK skips on replay, so they reach this registry through the SDK's buffer. Declared here so
# the endpoint lists them before the first workflow records one (counters without `_total`: it is
# added on the way out, as for every SDK counter).
WORKFLOW_PHASE_DURATION = "karpflow_workflow_phase_duration_seconds"
DECISIONS = "karpenter_voluntary_disruption_decisions"
ROLLBACKS = "karpflow_disruption_rollbacks"
ROLLOUT_WAVES = "karpflow_rollout_waves"
SDK_DECLARED: dict[str, tuple[str, str]] = {
    WORKFLOW_PHASE_DURATION: (
        "histogram",
        "Time a disruption or termination spent in each phase, by workflow type and phase.",
    ),
    DECISIONS: (
        "counter",
        "Voluntary disruption commands the controller started, by decision (delete or replace), reason "
        "and consolidation type.",
    ),
    ROLLBACKS: (
        "counter",
        "Voluntary disruptions rolled back (candidates untainted, replacements removed), by reason.",
    ),
    ROLLOUT_WAVES: (
        "counter",
        "Rollout waves by NodePool and outcome: started, passed (the gate held through the soak) or "
        "halted (the gate failed).",
    ),
}


@dataclass
class _Histogram:
    buckets: list[int]
    total: float = 0.0
    count: int = 0


@dataclass(eq=False)  # the registry keys its collectors by identity
class TemporalMetrics(Collector):
    """The SDK's metric updates (counter deltas, gauge values, histogram observations) from a
    `MetricBuffer`, accumulated and exposed as Prometheus series. Drained at every scrape and by
    the health server every second, so the SDK's bounded buffer never overflows."""

    buffer: Any  # temporalio.runtime.MetricBuffer
    buckets: tuple[float, ...] = DURATION_BUCKETS
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _meta: dict[str, tuple[str, str]] = field(  # name -> kind, help
        default_factory=lambda: dict(SDK_DECLARED)
    )
    _counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    _gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    _histograms: dict[tuple[str, tuple[tuple[str, str], ...]], _Histogram] = field(default_factory=dict)

    def drain(self) -> int:
        from temporalio.runtime import BUFFERED_METRIC_KIND_COUNTER, BUFFERED_METRIC_KIND_GAUGE

        with self._lock:
            updates = self.buffer.retrieve_updates()
            for update in updates:
                metric = update.metric
                name = _prometheus_name(metric.name, metric.unit, metric.kind)
                labels = _labels(update.attributes)
                key = (name, labels)
                if metric.kind == BUFFERED_METRIC_KIND_COUNTER:
                    self._meta.setdefault(name, ("counter", metric.description or metric.name))
                    self._counters[key] = self._counters.get(key, 0.0) + float(update.value)
                elif metric.kind == BUFFERED_METRIC_KIND_GAUGE:
                    self._meta.setdefault(name, ("gauge", metric.description or metric.name))
                    self._gauges[key] = float(update.value)
                else:
                    self._meta.setdefault(name, ("histogram", metric.description or metric.name))
                    histogram = self._histograms.get(key)
                    if histogram is None:
                        histogram = self._histograms[key] = _Histogram([0] * len(self.buckets))
                    value = float(update.value)
                    for index, bound in enumerate(self.buckets):
                        if value <= bound:
                            histogram.buckets[index] += 1
                    histogram.total += value
                    histogram.count += 1
            return len(updates)

    def collect(self) -> Iterator[Metric]:
        self.drain()
        with self._lock:
            for name, (kind, documentation) in sorted(self._meta.items()):
                family = Metric(name, documentation, kind)
                if kind == "counter":
                    for (metric, labels), value in self._counters.items():
                        if metric == name:
                            family.add_sample(f"{name}_total", dict(labels), value)
                elif kind == "gauge":
                    for (metric, labels), value in self._gauges.items():
                        if metric == name:
                            family.add_sample(name, dict(labels), value)
                else:
                    for (metric, labels), histogram in self._histograms.items():
                        if metric != name:
                            continue
                        for bound, count in zip(self.buckets, histogram.buckets, strict=True):
                            family.add_sample(f"{name}_bucket", {**dict(labels), "le": str(bound)}, count)
                        family.add_sample(f"{name}_bucket", {**dict(labels), "le": "+Inf"}, histogram.count)
                        family.add_sample(f"{name}_count", dict(labels), histogram.count)
                        family.add_sample(f"{name}_sum", dict(labels), histogram.total)
                yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families appear as the SDK records them


def _prometheus_name(name: str, unit: str | None, kind: int) -> str:
    from temporalio.runtime import BUFFERED_METRIC_KIND_HISTOGRAM

    name = name.replace(".", "_").replace("-", "_")
    seconds = kind == BUFFERED_METRIC_KIND_HISTOGRAM and (unit or "") in _SECONDS_UNITS
    if seconds and not name.endswith("_seconds"):
        name += "_seconds"
    return name.removesuffix("_total")


def _labels(attributes: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k).replace(".", "_"), str(v)) for k, v in attributes.items()))


_runtime_lock = threading.Lock()
_runtime: Any = None
_temporal_metrics: TemporalMetrics | None = None


def temporal_runtime() -> Any:
    """The process's Temporal runtime, with its metrics buffered into REGISTRY (created once: each
    runtime has its own threads, and one process needs one)."""
    global _runtime, _temporal_metrics
    with _runtime_lock:
        if _runtime is None:
            from temporalio.runtime import MetricBuffer, MetricBufferDurationFormat, Runtime, TelemetryConfig

            buffer = MetricBuffer(100_000, MetricBufferDurationFormat.SECONDS)
            _runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
            _temporal_metrics = TemporalMetrics(buffer)
            REGISTRY.register(_temporal_metrics)
        return _runtime


def drain_temporal_metrics() -> None:
    """Move what the SDK buffered into REGISTRY (the health server calls this every second)."""
    if _temporal_metrics is not None:
        _temporal_metrics.drain()
