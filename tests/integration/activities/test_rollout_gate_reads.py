"""check_wave_health against the emulator: the same verdict from the worker's informer cache and from
the API server (the label selector and `spec.nodeName=` field selector the uncached reads send), and
from the cache without a request reaching the server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.rollout_health import RolloutHealthActivities
from api.rollout_health_io import WaveHealthRequest
from api.rollout_policy import RolloutPolicy
from cluster.informer import ClusterCache
from cluster.reads import ClusterReads
from sim.cluster_builder import ClusterBuilder

pytestmark = pytest.mark.integration


def seeded(world: Any) -> tuple[datetime, datetime]:
    """A pool mid-wave: an old node, two new ones (one NotReady past readyTimeout), a crash-looping pod
    on the Ready one, a displaced pod nothing placed, and one pending since before the wave."""
    now = datetime.now(UTC)
    build = ClusterBuilder(now=now)
    build.nodepool("default")
    build.node("old", age=timedelta(days=2))
    build.node("fresh-ok", age=timedelta(minutes=5))
    build.node("fresh-bad", age=timedelta(minutes=15), ready=False)
    build.node("other-pool", pool="gpu", age=timedelta(minutes=15), ready=False)
    crashing = build.pod("web-1", "fresh-ok", age=timedelta(minutes=4))
    crashing["status"]["containerStatuses"] = [
        {"name": "main", "restartCount": 5, "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}
    ]
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    for name, age in (("displaced-1", 12), ("stuck-before", 120)):
        build.pod(name, None, age=timedelta(minutes=age))["status"]["conditions"] = [unschedulable]
    world.emu.store.load_objects(build.objects)
    return now, now - timedelta(minutes=20)


def gate_request(since: datetime) -> WaveHealthRequest:
    policy = RolloutPolicy.model_validate({"readyTimeout": "10m", "maxRestarts": 3})
    return WaveHealthRequest(rollout_id="r-1", nodepool="default", since=since, policy=policy)


EXPECTED = [
    "1 pods displaced by the wave are still unschedulable after readyTimeout 10m: default/displaced-1",
    "node fresh-bad is not Ready 15m after its creation (readyTimeout 10m): KubeletNotReady",
    "pod default/web-1 on node fresh-ok: container main restarted 5 times (maxRestarts 3),"
    " last exit: Error (exit code 1)",
]


async def test_the_gate_reads_the_same_wave_from_the_server_and_from_the_cache(world):
    now, since = seeded(world)
    request = gate_request(since)
    uncached = RolloutHealthActivities(world.kube, ClusterReads(world.kube), clock=lambda: now)
    from_server = await uncached.check_wave_health(request)
    assert (from_server.verdict, from_server.reasons) == ("Failed", EXPECTED)
    assert [n.name for n in from_server.nodes] == ["fresh-bad", "fresh-ok"]

    cache = ClusterCache(world.kube)
    try:
        cache.start()
        assert await cache.wait_synced(30)
        reads = ClusterReads(world.kube, cache)
        mark = world.emu.requests.query(limit=1)[-1].seq
        cached = RolloutHealthActivities(world.kube, reads, clock=lambda: now)
        from_cache = await cached.check_wave_health(request)
        reached = [
            r
            for r in world.emu.requests.query(since_seq=mark)
            if r.verb in ("list", "get") and r.resource in ("nodes", "pods")
        ]
    finally:
        await cache.stop()
    assert from_cache == from_server
    assert reached == [] and reads.served["api"] == 0
