"""The worker's /metrics, scraped from a real `karpflow worker` process after a real termination:
Karpenter's series moved with their labels, the Temporal SDK's own series on the same endpoint,
the drain's Events listed by kubectl, and every query of the Grafana dashboard naming a metric the
worker exports."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.ports import free_port
from sim.testing import assert_no_violations, kubectl
from tests.integration.workflows.conftest import REPO, Workload, node, scenario

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DASHBOARD = Path(REPO, "deploy", "grafana", "karpflow-dashboard.json")
A, B = node("172.31.1.10"), node("172.31.2.20")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10"] * 3, pdb={"maxUnavailable": 1})]
PREFIXES = ("karpenter_", "karpflow_", "temporal_")
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain"), response.headers["Content-Type"]
        return response.read().decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def queryable(text: str) -> set[str]:
    """Every name a PromQL query may use for what the endpoint exports (families with no sample yet
    included: a counter nobody has incremented is still exported, with its HELP and TYPE)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + suffix for suffix in SAMPLE_SUFFIXES.get(family.type, ("",))}
        names |= {s.name for s in family.samples}
    return names


def dashboard_metrics(dashboard: dict[str, Any]) -> dict[str, str]:
    """metric name -> the panel that queries it."""
    found: dict[str, str] = {}
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            for token in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", target["expr"]):
                if token.startswith(PREFIXES):
                    found[token] = panel["title"]
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls))


@pytest.mark.sim_stack(scenario=scenario([A, B], PODS), time_scale=0.05)
async def test_a_termination_moves_karpenters_series_and_the_dashboard_only_queries_exported_ones(karpflow):
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    worker = karpflow.worker_process(KARPFLOW_HEALTH_PORT=str(port), KARPFLOW_HEALTH_HOST="127.0.0.1")
    try:
        before = await karpflow.eventually(
            lambda: asyncio.to_thread(_try_scrape, url), within=60, what=karpflow.worker_logs
        )
        assert value(samples(before), "karpenter_pods_eviction_requests_total", code="200") == 0
        # Under the id every part of karpflow derives for the node: the deletion watcher finds it
        # running instead of starting a second termination (another id would drain twice).
        status = await (await karpflow.start_termination(A.name)).result()
        assert status.phase == "Succeeded", status

        async def moved() -> str | None:
            text = await asyncio.to_thread(scrape, url)
            found = samples(text)
            done = value(found, "temporal_workflow_completed_total", workflow_type="TerminationWorkflow")
            return text if done >= 1 else None

        text = await karpflow.eventually(moved, within=30, what="the SDK's workflow_completed")
    finally:
        worker.terminate()
        await asyncio.to_thread(worker.wait, 30)
    found = samples(text)
    # Karpenter's names, with labels, moved by the drain of three pods under a PDB allowing one
    assert value(found, "karpenter_pods_eviction_requests_total", code="200") == 3
    assert value(found, "karpenter_pods_drained_total", reason="Drifted") == 3
    assert value(found, "karpflow_drain_duration_seconds_count") == 1
    assert value(found, "karpflow_events_total", reason="Evicted", outcome="created") == 3
    # the termination's own: the node deleted for a disruption, then gone, and each phase timed
    assert value(found, "karpenter_nodeclaims_disrupted_total", reason="Drifted") == 1
    # its three web pods, counted as it was deleted (no DaemonSet pod), with Karpenter's labels:
    # no consolidation policy for drift, and the pool's unbounded drain is graceful (#3015, #3179)
    drifted = {"reason": "Drifted", "consolidation_policy": "", "termination_mode": "graceful"}
    assert value(found, "karpenter_nodeclaims_disrupted_total", **drifted) == 1
    assert value(found, "karpenter_pods_disruption_initiated_total", **drifted) == 3
    assert value(found, "karpenter_nodes_terminated_total") == 1
    assert value(found, "karpenter_nodes_termination_duration_seconds_count") == 1
    phases = "karpflow_workflow_phase_duration_seconds_count"
    for phase in ("Starting", "Draining", "RemovingFinalizer"):
        assert value(found, phases, workflow_type="TerminationWorkflow", phase=phase) == 1, phase
    # the Temporal SDK's own, on the same endpoint
    assert value(found, "temporal_activity_execution_latency_seconds_count", activity_type="drain_node") >= 1
    assert value(found, "temporal_worker_task_slots_available", worker_type="ActivityWorker") > 0
    # the Events an operator reads with kubectl
    listed = json.loads(kubectl(karpflow.stack, "get", "events", "-A", "-o", "json"))["items"]
    evicted = {e["involvedObject"]["name"] for e in listed if e["reason"] == "Evicted"}
    assert len(evicted) == 3 and all(name.startswith("web-") for name in evicted), evicted
    on_node = {e["reason"] for e in listed if e["involvedObject"]["name"] == A.name}
    assert "DisruptionTerminating" in on_node, on_node

    # The dashboard: every query names something this worker exports.
    dashboard = json.loads(await asyncio.to_thread(DASHBOARD.read_text))
    queried = dashboard_metrics(dashboard)
    exported = queryable(text)
    missing = {name: panel for name, panel in queried.items() if name not in exported}
    assert not missing, f"the dashboard queries metrics the worker does not export: {missing}"
    assert sum(name.startswith("karpenter_") for name in queried) >= 14, sorted(queried)
    assert any(name.startswith("temporal_") for name in queried)
    assert_no_violations(karpflow.stack)


def _try_scrape(url: str) -> str | None:
    try:
        return scrape(url)
    except OSError:
        return None
