"""A stale informer cache stops planning and says so, and recovers on its own (issue 18 item 6).

Real pieces: the emulator with its fault injection (sim/apiserver/faults.py: watches cut, 500s, a
410 on re-watch), the worker's ClusterCache and planning activity, and for the end-to-end case the
worker with its controller on the Temporal dev server and its /readyz endpoint.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.errors import STALE_VIEW
from activities.planning import PlanningActivities
from api.controller_io import PassRequest
from cluster.heap import HeapFreezer
from cluster.informer import ClusterCache
from sim.apiserver.faults import FaultRule
from tests.integration.controller.test_controller import FAST, TWENTY_PODS, A, B, scenario, status

pytestmark = pytest.mark.integration

SCENARIO = scenario([A, B], TWENTY_PODS)


async def eventually(check: Callable[[], Awaitable[bool] | bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        outcome = check()
        if isinstance(outcome, Awaitable):
            outcome = await outcome
        if outcome:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"not within {within}s: {what}")


def new_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }


def pod_names(cache: ClusterCache) -> set[str]:
    return {pod.name for pod in cache.snapshot(datetime.now(UTC)).pods}


def broken_pods(karpflow: Any) -> list[FaultRule]:
    """Every pod listing and watch fails with a 500."""
    faults = karpflow.stack.api_faults
    return [
        faults.add(FaultRule(verb=verb, resource="pods", status=500, message="etcd is down"))
        for verb in ("list", "watch")
    ]


@pytest.mark.sim_stack(scenario=SCENARIO, secure=False)
async def test_cut_watches_and_a_410_on_rewatch_keep_the_cache_current(karpflow):
    faults = karpflow.stack.api_faults
    # Every pod watch is cut after one event; the first re-watch is answered 410 Gone.
    faults.add(FaultRule(verb="watch", resource="pods", watch_disconnect_after_events=1))
    cache = ClusterCache(karpflow.kube, stale_after=1.0)
    cache.start()
    try:
        assert await cache.wait_synced(30)
        pods = cache.informers[1]
        assert pods.resource.kind == "Pod"
        faults.add(FaultRule(verb="watch", resource="pods", status=410, times=1))
        for index in range(4):
            await karpflow.kube.request(
                "POST", "/api/v1/namespaces/default/pods", body=new_pod(f"cut-{index}")
            )
            await asyncio.sleep(0.4)
        await eventually(lambda: {f"cut-{i}" for i in range(4)} <= pod_names(cache), 15, "every new pod seen")
        # Cut watches were resumed, and the 410 (sent as the watch cache sends it: an ERROR event in a
        # 200 stream) made the informer list again.
        assert pods.stats.watches >= 3 and pods.stats.relists_gone >= 1
        assert pods.stats.lists >= 2
        assert cache.stale() == []
    finally:
        await cache.stop()


@pytest.mark.sim_stack(scenario=SCENARIO, secure=False)
async def test_a_pass_waits_for_the_parsed_cache_and_the_heap_is_frozen_once_it_is_planned(karpflow):
    """The first pass used to start at the sync, while the cache parsed what it listed, with the
    collector walking the freshly synced heap; the parse and the first pass now run without it, and
    the heap they made is frozen right after."""
    freezer, thresholds = HeapFreezer(), gc.get_threshold()
    cache = ClusterCache(karpflow.kube, heap=freezer)
    cache.start()
    try:
        assert await cache.wait_ready(30)
        assert cache.synced and freezer.freezes == 0 and not gc.isenabled()
        # Parsed for the planner: the first snapshot has nothing left to parse.
        parsed = cache.builder.parsed
        assert len(cache.snapshot(datetime.now(UTC)).pods) == len(cache.objects_of("Pod")) > 0
        assert cache.builder.parsed == parsed
        cache.pass_planned()
        await eventually(lambda: freezer.freezes == 1, 10, "the heap frozen once the pass is planned")
        assert gc.isenabled()
    finally:
        await cache.stop()
        gc.unfreeze()  # the worker's collector policy, not this test process's
        gc.set_threshold(*thresholds)
    assert gc.isenabled()
    assert not await cache.wait_ready(0.1)  # a stopped cache is ready again only after a new sync


@pytest.mark.sim_stack(scenario=SCENARIO, secure=False)
async def test_a_kind_that_cannot_be_watched_or_listed_goes_stale_stops_planning_and_recovers(karpflow):
    faults = karpflow.stack.api_faults
    # Watches end every second, so that a broken pod watch shows at once.
    cut = faults.add(FaultRule(verb="watch", resource="pods", watch_disconnect_after_seconds=1.0))
    cache = ClusterCache(karpflow.kube, stale_after=2.0)
    cache.start()
    planning = PlanningActivities(cache, karpflow.kube, karpflow.client, task_queue=karpflow.task_queue)
    env = ActivityEnvironment()
    try:
        assert await cache.wait_synced(30)
        assert (await env.run(planning.plan_pass, PassRequest())).nodes == 2
        broken = broken_pods(karpflow)
        await eventually(lambda: bool(cache.stale()), 20, "the pod view to go stale")
        [why] = cache.stale()
        assert why.startswith("Pod not watched for ") and "500" in why and "etcd is down" in why
        with pytest.raises(ApplicationError) as refused:
            await env.run(planning.plan_pass, PassRequest())
        assert refused.value.type == STALE_VIEW and not refused.value.non_retryable
        assert "the cluster cache is stale, no decision on it: Pod not watched for" in str(refused.value)

        # Meanwhile the cluster moves on; once the API server answers again the cache catches up.
        await karpflow.kube.request("POST", "/api/v1/namespaces/default/pods", body=new_pod("while-stale"))
        for rule in [*broken, cut]:
            faults.remove(rule.id)
        await eventually(lambda: not cache.stale(), 40, "the cache to recover")
        assert "while-stale" in pod_names(cache)
        assert (await env.run(planning.plan_pass, PassRequest())).nodes == 2
    finally:
        await cache.stop()


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    """Asynchronous: the health server answers from this test's own event loop."""
    timeout = aiohttp.ClientTimeout(total=2)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"http://127.0.0.1:{port}/readyz") as response,
    ):
        return response.status, await response.json()


@pytest.mark.slow
@pytest.mark.sim_stack(scenario=SCENARIO)
async def test_the_worker_goes_unready_and_the_controller_says_why_until_the_watch_is_back(karpflow):
    faults = karpflow.stack.api_faults
    cut = faults.add(FaultRule(verb="watch", resource="pods", watch_disconnect_after_seconds=1.0))
    async with karpflow.worker(**FAST, health=True, health_port=0, cache_stale_after=2.0) as worker:
        port = worker.health_port
        assert port is not None
        await eventually(lambda: _readyz_is(port, 200), 30, "ready")
        await eventually(lambda: _passes(karpflow, 1), 60, "a first pass")

        broken = broken_pods(karpflow)
        await eventually(lambda: _readyz_is(port, 503), 20, "/readyz to turn red")
        _, body = await readyz(port)
        assert body["ready"] is False
        assert any(r.startswith("the cluster cache is stale: Pod not watched for") for r in body["reasons"])
        await eventually(
            lambda: _error_has(karpflow, "the cluster cache is stale"), 60, "the controller to say so"
        )

        for rule in [*broken, cut]:
            faults.remove(rule.id)
        await eventually(lambda: _readyz_is(port, 200), 40, "/readyz green again")
        assert await readyz(port) == (200, {"ready": True})
        passes = (await status(karpflow)).passes
        await eventually(lambda: _passes(karpflow, passes + 1, no_error=True), 60, "a pass without error")


async def _readyz_is(port: int, code: int) -> bool:
    return (await readyz(port))[0] == code


async def _passes(karpflow: Any, at_least: int, no_error: bool = False) -> bool:
    try:
        now = await status(karpflow)
    except Exception:
        return False
    return now.passes >= at_least and (not no_error or not now.error)


async def _error_has(karpflow: Any, text: str) -> bool:
    try:
        return text in ((await status(karpflow)).error or "")
    except Exception:
        return False
