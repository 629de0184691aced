"""The emulator's `/metrics`, in Prometheus' text format, from its request counts (api_stats.py).

kube-apiserver's own series, with the labels the emulator knows (staging/src/k8s.io/apiserver/pkg/
endpoints/metrics/metrics.go: `apiserver_request_total`, `apiserver_response_sizes`):
- `apiserver_request_total{verb,resource,subresource,scope,code}`: verbs upper-case as it reports
  them (LIST, WATCH, GET...); scope left empty (the counts are not kept by scope);
- `apiserver_response_sizes_sum/_count{verb,resource,subresource}`: GETs and LISTs, as it measures
  only reads; the sum and count of its histogram (one `+Inf` bucket);
and the emulator's per user, which kube-apiserver does not have (a user label is unbounded there;
APF's series name flow schemas instead):
- `emulator_requests_total{user,verb,resource,code}`, `emulator_response_bytes_total{user,verb,resource}`,
  `emulator_full_lists_total{user,resource}`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from sim.apiserver.api_stats import ApiStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _split(resource: str) -> tuple[str, str]:
    base, _, sub = resource.partition("/")
    return base, sub


class _StatsCollector(Collector):
    def __init__(self, stats: ApiStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "apiserver_request",
            "Counter of apiserver requests broken out for each verb, resource and HTTP response code.",
            labels=["verb", "resource", "subresource", "scope", "code"],
        )
        per_user = CounterMetricFamily(
            "emulator_requests",
            "Requests the emulator answered, by the caller's user, verb, resource and code.",
            labels=["user", "verb", "resource", "code"],
        )
        totals: dict[tuple[str, str, str, str], int] = defaultdict(int)
        for key, code, count in self.stats.by_code():
            base, sub = _split(key.resource)
            totals[(key.verb.upper(), base, sub, str(code))] += count
            per_user.add_metric([key.user, key.verb, key.resource, str(code)], count)
        for (verb, base, sub, code), count in sorted(totals.items()):
            requests.add_metric([verb, base, sub, "", code], count)
        sizes = HistogramMetricFamily(
            "apiserver_response_sizes",
            "Response size distribution in bytes for each verb, resource and subresource.",
            labels=["verb", "resource", "subresource"],
        )
        user_bytes = CounterMetricFamily(
            "emulator_response_bytes",
            "Response bytes the emulator sent (watches as they stream), by user, verb and resource.",
            labels=["user", "verb", "resource"],
        )
        full_lists = CounterMetricFamily(
            "emulator_full_lists",
            "Cluster-wide LISTs without a selector (first pages), by user and resource.",
            labels=["user", "resource"],
        )
        by_resource: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
        for row in self.stats.rows():
            if row.verb in ("get", "list"):
                base, sub = _split(row.resource)
                entry = by_resource[(row.verb.upper(), base, sub)]
                entry[0] += row.requests
                entry[1] += row.response_bytes
            user_bytes.add_metric([row.user, row.verb, row.resource], row.response_bytes)
            if row.full_lists:
                full_lists.add_metric([row.user, row.resource], row.full_lists)
        for labels, (count, total) in sorted(by_resource.items()):
            sizes.add_metric(list(labels), buckets=[("+Inf", count)], sum_value=total)
        yield requests
        yield sizes
        yield per_user
        yield user_bytes
        yield full_lists


def exposition(stats: ApiStats) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StatsCollector(stats))
    return generate_latest(registry)
