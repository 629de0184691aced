"""CapacityBuffers read from the cluster: the worker's informer cache lists and watches them and
the PodTemplates they name, and a pass keeps the node their pods need (planner/capacity_buffers.py).

Real pieces: the emulator (the CapacityBuffer kind registered from a CRD, as `kubectl apply` of
Karpenter's autoscaling.x-k8s.io_capacitybuffers.yaml registers it) and the worker's ClusterCache.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest

from cluster.informer import ClusterCache
from planner.catalog import bundled_catalog
from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import plan
from tests.integration.workflows.conftest import Workload, node, scenario
from tests.integration.workflows.test_guards import BUFFER_CRD

pytestmark = pytest.mark.integration

A, C = node("172.31.1.10", "m5.xlarge"), node("172.31.3.30", "m5.xlarge")
PODS = [Workload("shop", "web", "100m", "128Mi", ["10"])]  # on A only: C is empty


async def _emptied(cache: ClusterCache) -> list[str]:
    snapshot = cache.snapshot(datetime.now(UTC))
    result = plan(snapshot, bundled_catalog("us-west-2"), PlanOptions(), methods=[Emptiness()])
    return sorted(n for c in result.commands for n in c.nodes)


@pytest.mark.sim_stack(scenario=scenario([A, C], PODS))
async def test_the_cache_reads_capacity_buffers_and_a_pass_keeps_the_node_their_pods_need(karpflow):
    kube = karpflow.kube
    await kube.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=BUFFER_CRD)
    # One pod too big for what A has left, so it is C the buffer needs (an m5.xlarge allocates 3920m).
    await kube.request(
        "POST",
        "/api/v1/namespaces/default/podtemplates",
        body={
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": "warm-pods", "namespace": "default"},
            "template": {
                "metadata": {"labels": {"app": "warm"}},
                "spec": {"containers": [{"name": "pause", "resources": {"requests": {"cpu": "3850m"}}}]},
            },
        },
    )
    cache = ClusterCache(kube, stale_after=60.0)
    cache.start()
    try:
        assert await cache.wait_synced(30)
        assert await _emptied(cache) == [C.name]  # no buffer yet
        path = "/apis/autoscaling.x-k8s.io/v1beta1/namespaces/default/capacitybuffers"
        created = await kube.request(
            "POST",
            path,
            body={
                "apiVersion": "autoscaling.x-k8s.io/v1beta1",
                "kind": "CapacityBuffer",
                "metadata": {"name": "warm", "namespace": "default"},
                "spec": {"podTemplateRef": {"name": "warm-pods"}, "replicas": 1},
            },
        )
        created["status"] = {
            "replicas": 1,
            "conditions": [{"type": "ReadyForProvisioning", "status": "True"}],
        }
        await kube.request("PUT", f"{path}/warm/status", body=created)
        deadline = time.monotonic() + 60
        while not cache.snapshot(datetime.now(UTC)).capacity_buffers.get("default/warm", None) or not (
            cache.snapshot(datetime.now(UTC)).capacity_buffers["default/warm"].ready
        ):
            assert time.monotonic() < deadline, "the cache never saw the ready buffer"
            await asyncio.sleep(0.5)
        snapshot = cache.snapshot(datetime.now(UTC))
        assert "default/warm-pods" in snapshot.pod_templates
        assert await _emptied(cache) == []
        result = plan(snapshot, bundled_catalog("us-west-2"), PlanOptions(), methods=[Emptiness()])
        reasons = [b.reason for b in result.blocked if b.node == C.name]
        assert any("has buffer pods (1 of a CapacityBuffer)" in r for r in reasons), reasons
    finally:
        await cache.stop()
