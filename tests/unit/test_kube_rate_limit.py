"""kube/rate_limit.py and the client around it: a token bucket in front of every request, and a
429 (or 5xx) with Retry-After sent again after that many seconds, as client-go does."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kube.client import KubeApi, KubeError
from kube.rate_limit import MAX_RETRY_AFTER, TokenBucket, retry_after
from runtime import metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_the_bucket_lets_a_burst_through_then_one_request_per_tick():
    clock = FakeClock()
    bucket = TokenBucket(qps=10, burst=3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        await bucket.acquire()
    assert clock.slept == []  # the burst
    for _ in range(5):
        await bucket.acquire()
    assert clock.slept == pytest.approx([0.1] * 5)  # then qps
    clock.now += 10.0  # idle: the bucket refills to its burst, no more
    for _ in range(3):
        await bucket.acquire()
    assert len(clock.slept) == 5
    await bucket.acquire()
    assert clock.slept[-1] == pytest.approx(0.1)


def test_waiting_callers_reserve_in_turn():
    clock = FakeClock()
    bucket = TokenBucket(qps=2, burst=1, clock=clock, sleep=clock.sleep)
    assert [bucket.reserve() for _ in range(4)] == pytest.approx([0.0, 0.5, 1.0, 1.5])


def test_which_answers_are_retried_and_after_how_long():
    assert retry_after(429, {"Retry-After": "1"}) == 1.0
    assert retry_after(503, {"Retry-After": "3"}) == 3.0
    assert retry_after(429, {"Retry-After": "3600"}) == MAX_RETRY_AFTER
    assert retry_after(429, {}) is None  # client-go's checkWait: only with the header
    assert retry_after(500, {}) is None
    assert retry_after(409, {"Retry-After": "1"}) is None
    assert retry_after(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None


@pytest.fixture
async def throttling_server() -> AsyncIterator[tuple[TestServer, list[str]]]:
    """Answers the first two GETs of /api/v1/nodes with APF's 429 and Retry-After: 0, then 200; an
    eviction always with a PDB's 429 and Retry-After: 10."""
    seen: list[str] = []

    async def nodes(request: web.Request) -> web.Response:
        seen.append("nodes")
        if seen.count("nodes") <= 2:
            return web.json_response(
                {"kind": "Status", "code": 429, "message": "too many requests"},
                status=429,
                headers={"Retry-After": "0"},
            )
        return web.json_response({"kind": "NodeList", "items": []})

    async def eviction(request: web.Request) -> web.Response:
        seen.append("eviction")
        return web.json_response(
            {"kind": "Status", "code": 429, "message": "Cannot evict pod as it would violate a PDB."},
            status=429,
            headers={"Retry-After": "10"},
        )

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_post("/api/v1/namespaces/default/pods/web/eviction", eviction)
    server = TestServer(app)
    await server.start_server()
    yield server, seen
    await server.close()


async def test_the_client_backs_off_on_429_with_retry_after_but_leaves_an_evictions_to_the_drain(
    throttling_server: tuple[TestServer, list[str]],
):
    server, seen = throttling_server
    kube = KubeApi.for_host(str(server.make_url("")).rstrip("/"))
    counted = (
        metrics.REGISTRY.get_sample_value("karpflow_kube_client_retry_after_total", {"code": "429"}) or 0
    )
    try:
        assert (await kube.list_nodes())["kind"] == "NodeList"
        assert seen == ["nodes"] * 3 and kube.retried_after == 2
        after = metrics.REGISTRY.get_sample_value("karpflow_kube_client_retry_after_total", {"code": "429"})
        assert after == counted + 2
        with pytest.raises(KubeError) as err:
            await kube.evict({"metadata": {"name": "web", "namespace": "default", "uid": "u1"}})
        assert err.value.status == 429 and seen.count("eviction") == 1
    finally:
        await kube.close()


async def test_every_request_takes_a_token_from_the_clients_bucket(
    throttling_server: tuple[TestServer, list[str]],
):
    server, _ = throttling_server
    clock = FakeClock()
    bucket = TokenBucket(qps=5, burst=1, clock=clock, sleep=clock.sleep)
    kube = KubeApi.for_host(str(server.make_url("")).rstrip("/"))
    kube.limiter = bucket
    try:
        await kube.list_nodes()  # two 429s, then the answer: three requests, three tokens
        assert clock.slept == pytest.approx([0.2, 0.2])
    finally:
        await kube.close()


async def test_the_worker_settings_default_to_karpenters_and_reach_the_client():
    from runtime.connections import connect_kubernetes
    from runtime.settings import WorkerSettings

    defaults = WorkerSettings(cluster_name="c")
    assert (defaults.kube_client_qps, defaults.kube_client_burst) == (200.0, 300)
    settings = WorkerSettings(
        cluster_name="c", kube_api_server="http://127.0.0.1:1", kube_client_qps=7, kube_client_burst=9
    )
    kube = await connect_kubernetes(settings)
    try:
        assert (kube.limiter.qps, kube.limiter.burst) == (7.0, 9)
    finally:
        await kube.close()


async def test_retry_afters_longer_than_the_requests_timeout_are_left_to_the_caller(
    throttling_server: tuple[TestServer, list[str]],
):
    server, seen = throttling_server
    kube = KubeApi.for_host(str(server.make_url("")).rstrip("/"))
    try:
        with pytest.raises(KubeError) as err:  # the eviction's Retry-After: 10 > a 5 s timeout
            await kube.request(
                "POST", "/api/v1/namespaces/default/pods/web/eviction", body={}, request_timeout=5
            )
        assert err.value.status == 429 and seen == ["eviction"] and kube.retried_after == 0
    finally:
        await kube.close()
