"""check_wave_health (activities/rollout_health.py): one test per rule of the rollout gate, on a fake
cluster read, and the Prometheus check against a real HTTP server on localhost."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from temporalio.exceptions import ApplicationError

from activities.rollout_health import RolloutHealthActivities
from api.rollout_health_io import WaveHealth, WaveHealthRequest
from api.rollout_policy import RolloutPolicy
from cluster.reads import ClusterReads
from kube.client import Json, KubeError
from kube.times import rfc3339
from tests.unit.test_cluster_reads import synced

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
SINCE = NOW - timedelta(minutes=30)
POOL = "general"


def at(minutes_ago: float) -> str:
    return rfc3339(NOW - timedelta(minutes=minutes_ago))


def node(
    name: str,
    *,
    created: float = 5,
    ready: str = "True",
    changed: float | None = None,
    pool: str = POOL,
    deleting: bool = False,
    reason: str = "KubeletReady",
) -> Json:
    meta: Json = {
        "name": name,
        "uid": f"uid-{name}",
        "creationTimestamp": at(created),
        "labels": {"karpenter.sh/nodepool": pool},
    }
    if deleting:
        meta["deletionTimestamp"] = at(0)
    condition = {
        "type": "Ready",
        "status": ready,
        "reason": reason,
        "lastTransitionTime": at(created if changed is None else changed),
    }
    return {"metadata": meta, "spec": {}, "status": {"conditions": [condition]}}


def pod(
    name: str,
    on: str | None = "n1",
    *,
    created: float = 4,
    started: float | None = 4,
    ready: bool = True,
    phase: str = "Running",
    restarts: int = 0,
    init_restarts: int | None = None,
    scheduled: str | None = None,
    deleting: bool = False,
) -> Json:
    meta: Json = {"name": name, "namespace": "shop", "uid": f"uid-{name}", "creationTimestamp": at(created)}
    if deleting:
        meta["deletionTimestamp"] = at(0)
    status: Json = {"phase": phase, "conditions": []}
    if started is not None:
        status["startTime"] = at(started)
    if on is not None:
        status["conditions"].append({"type": "Ready", "status": "True" if ready else "False"})
        if not ready:
            status["conditions"][-1]["reason"] = "ContainersNotReady"
        status["containerStatuses"] = [
            {
                "name": "app",
                "restartCount": restarts,
                "lastState": {"terminated": {"reason": "Error", "exitCode": 1}} if restarts else {},
            }
        ]
        if init_restarts is not None:
            status["initContainerStatuses"] = [
                {
                    "name": "setup",
                    "restartCount": init_restarts,
                    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                }
            ]
    if scheduled is not None:
        status["conditions"].append({"type": "PodScheduled", "status": "False", "reason": scheduled})
    return {"metadata": meta, "spec": {"nodeName": on} if on else {}, "status": status}


class FakeReads:
    """The three reads the gate makes, over a list of nodes and pods (what the cache would hold)."""

    def __init__(self, nodes: list[Json], pods: list[Json] = (), fail: KubeError | None = None) -> None:  # type: ignore[assignment]
        self.node_list = nodes
        self.pod_list = list(pods)
        self.fail = fail

    async def nodes_with_label(self, key: str, value: str) -> list[Json]:
        if self.fail:
            raise self.fail
        return [n for n in self.node_list if n["metadata"]["labels"].get(key) == value]

    async def pods_on_node(self, name: str, fresh: bool = False) -> list[Json]:
        return [p for p in self.pod_list if (p.get("spec") or {}).get("nodeName") == name]

    async def unbound_pods(self) -> list[Json]:
        return [p for p in self.pod_list if not (p.get("spec") or {}).get("nodeName")]


def request(soak: float | None = None, **policy: Any) -> WaveHealthRequest:
    return WaveHealthRequest(
        rollout_id="r-1",
        nodepool=POOL,
        since=SINCE,
        policy=RolloutPolicy.model_validate({"readyTimeout": "10m", "maxRestarts": 3, **policy}),
        soak_started=None if soak is None else NOW - timedelta(minutes=soak),
    )


async def check(nodes: list[Json], pods: list[Json] = (), req: WaveHealthRequest | None = None) -> WaveHealth:  # type: ignore[assignment]
    gate = RolloutHealthActivities(None, FakeReads(nodes, pods), clock=lambda: NOW)  # type: ignore[arg-type]
    return await gate.check_wave_health(req or request())


# -- the wave's nodes -----------------------------------------------------------------------------


async def test_a_healthy_wave_names_its_nodes_and_counts_what_it_judged():
    health = await check([node("n1"), node("n2")], [pod("a"), pod("b", on="n2")])
    assert health.verdict == "Healthy" and health.reasons == []
    assert [(n.name, n.uid) for n in health.nodes] == [("n1", "uid-n1"), ("n2", "uid-n2")]
    assert (health.ready_nodes, health.pods, health.checked_at) == (2, 2, NOW)


async def test_no_new_node_yet_is_waiting():
    health = await check([node("old", created=60), node("other", pool="gpu")])
    assert (health.verdict, health.reasons, health.nodes) == ("Waiting", ["no node of the wave yet"], [])


async def test_a_soaking_wave_that_launched_no_node_is_judged_by_its_displaced_pods_alone():
    # The wave's old nodes are gone and nothing new was launched: their pods fit on nodes already there.
    assert (await check([node("old", created=60)], req=request(soak=1))).verdict == "Healthy"
    stuck = pod("a", on=None, created=11, phase="Pending", scheduled="Unschedulable")
    assert (await check([], [stuck], req=request(soak=1))).verdict == "Failed"


async def test_only_the_pools_nodes_created_since_the_wave_and_not_leaving_are_judged():
    nodes = [
        node("new"),
        node("old", created=60, ready="False"),  # the wave replaces it: not its own
        node("leaving", ready="False", deleting=True),
        node("elsewhere", ready="False", pool="gpu"),
    ]
    health = await check(nodes)
    assert health.verdict == "Healthy" and [n.name for n in health.nodes] == ["new"]


async def test_a_node_not_ready_past_the_ready_timeout_fails_the_gate():
    health = await check([node("n1", created=12, ready="False", reason="KubeletNotReady")])
    assert health.verdict == "Failed"
    assert health.reasons == [
        "node n1 is not Ready 12m after its creation (readyTimeout 10m): KubeletNotReady"
    ]


async def test_a_node_not_ready_within_the_ready_timeout_is_waiting():
    health = await check([node("n1", created=3, ready="Unknown", reason="NodeStatusNeverUpdated")])
    assert health.verdict == "Waiting" and health.ready_nodes == 0
    assert health.reasons == ["node n1 is not Ready yet (3m old): NodeStatusNeverUpdated"]


async def test_a_node_that_went_not_ready_during_the_soak_fails_the_gate():
    # Young enough for the readyTimeout; what fails it is leaving Ready after the soak began.
    went = node("n1", created=5, ready="Unknown", changed=1, reason="NodeStatusUnknown")
    health = await check([went], req=request(soak=2))
    assert health.verdict == "Failed"
    assert health.reasons == ["node n1 went NotReady during the soak, 1m ago: NodeStatusUnknown"]
    # The same node before any soak is only not Ready yet.
    assert (await check([went])).verdict == "Waiting"


# -- the pods on them -----------------------------------------------------------------------------


async def test_a_container_restarted_more_than_max_restarts_fails_the_gate():
    health = await check([node("n1")], [pod("web", restarts=4)])
    assert health.verdict == "Failed"
    assert health.reasons == [
        "pod shop/web on node n1: container app restarted 4 times (maxRestarts 3),"
        " last exit: Error (exit code 1)"
    ]
    assert (await check([node("n1")], [pod("web", restarts=3)])).verdict == "Healthy"


async def test_init_container_restarts_count_too():
    health = await check([node("n1")], [pod("web", init_restarts=5)])
    assert health.verdict == "Failed"
    assert health.reasons == [
        "pod shop/web on node n1: init container setup restarted 5 times (maxRestarts 3),"
        " last exit: OOMKilled (exit code 137)"
    ]


async def test_restarts_on_a_node_that_is_not_ready_still_fail_the_gate():
    health = await check([node("n1", created=2, ready="False")], [pod("web", restarts=9, ready=False)])
    assert health.verdict == "Failed" and "restarted 9 times" in health.reasons[0]


async def test_a_pod_not_ready_past_the_ready_timeout_fails_the_gate():
    health = await check([node("n1", created=20)], [pod("web", created=15, started=11, ready=False)])
    assert health.verdict == "Failed"
    assert health.reasons == [
        "pod shop/web on node n1 is not Ready 11m after it started (readyTimeout 10m): ContainersNotReady"
    ]


async def test_a_pod_not_ready_within_the_ready_timeout_is_waiting():
    # Created long before the node (a pending pod placed on it), not started yet: counted from the node.
    health = await check([node("n1", created=4)], [pod("web", created=25, started=None, ready=False)])
    assert health.verdict == "Waiting"
    assert health.reasons == ["pod shop/web on node n1 is not Ready yet: ContainersNotReady"]


async def test_finished_and_terminating_pods_are_not_judged():
    pods = [
        pod("done", phase="Succeeded", ready=False, started=20, restarts=7),
        pod("crashed", phase="Failed", ready=False, started=20),
        pod("going", deleting=True, ready=False, started=20, restarts=7),
    ]
    health = await check([node("n1", created=25)], pods)
    assert (health.verdict, health.pods) == ("Healthy", 0)


# -- pods the wave displaced ------------------------------------------------------------------------


async def test_displaced_pods_unschedulable_past_the_ready_timeout_fail_the_gate():
    pods = [
        pod("b", on=None, created=12, phase="Pending", scheduled="Unschedulable"),
        pod("a", on=None, created=11, phase="Pending", scheduled="Unschedulable"),
        pod("young", on=None, created=2, phase="Pending", scheduled="Unschedulable"),
        pod("before-the-wave", on=None, created=45, phase="Pending", scheduled="Unschedulable"),
        pod("gated", on=None, created=12, phase="Pending", scheduled="SchedulingGated"),
        pod("not-tried-yet", on=None, created=12, phase="Pending"),
    ]
    health = await check([node("n1")], pods)
    assert health.verdict == "Failed"
    assert health.reasons == [
        "2 pods displaced by the wave are still unschedulable after readyTimeout 10m: shop/a shop/b"
    ]


# -- the answer -------------------------------------------------------------------------------------


async def test_failures_are_the_reasons_sorted_and_capped():
    nodes = [node(f"n{i:02}", created=15, ready="False") for i in range(25)]
    health = await check([*nodes, node("fine")], [pod("slow", on="fine", started=1, ready=False)])
    assert health.verdict == "Failed" and len(health.reasons) == 20
    assert health.reasons[0].startswith("node n00 ") and health.reasons[18].startswith("node n18 ")
    assert health.reasons[-1] == "and 6 more"
    assert not any("not Ready yet" in r for r in health.reasons)  # the waiting line is not the halt's


async def test_kubernetes_errors_are_classified():
    gate = RolloutHealthActivities(None, FakeReads([], fail=KubeError(503, "Unavailable")))  # type: ignore[arg-type]
    with pytest.raises(ApplicationError) as raised:
        await gate.check_wave_health(request())
    assert not raised.value.non_retryable and "nodes of NodePool general" in str(raised.value)


class ApiServer:
    """The API server's side for ClusterReads without a cache: what the gate's reads ask for."""

    def __init__(self, nodes: list[Json], pods: list[Json]) -> None:
        self.nodes, self.pods = nodes, pods
        self.asked: list[str] = []

    async def list_nodes(self, label_selector: str | None = None, **_: Any) -> Json:
        self.asked.append(f"nodes {label_selector}")
        key, _, value = (label_selector or "").partition("=")
        return {"items": [n for n in self.nodes if n["metadata"]["labels"].get(key) == value]}

    async def pods_on_node(self, name: str) -> list[Json]:
        return [p for p in self.pods if p["spec"].get("nodeName") == name]

    async def request(self, method: str, path: str, query: dict[str, str] | None = None, **_: Any) -> Json:
        self.asked.append(f"{method} {path} {(query or {}).get('fieldSelector')}")
        return {"items": [p for p in self.pods if not p["spec"].get("nodeName")]}


async def test_without_a_cache_the_reads_ask_the_api_server_for_the_pool_and_the_unbound_pods():
    api = ApiServer(
        [node("n1", created=12, ready="False")],
        [pod("a", on=None, created=11, phase="Pending", scheduled="Unschedulable")],
    )
    gate = RolloutHealthActivities(api, ClusterReads(api), clock=lambda: NOW)  # type: ignore[arg-type]
    health = await gate.check_wave_health(request())
    assert health.verdict == "Failed" and len(health.reasons) == 2
    assert api.asked == [
        "nodes karpenter.sh/nodepool=general",
        "GET /api/v1/pods spec.nodeName=,status.phase=Pending",
    ]


async def test_the_unbound_pods_come_from_the_cache_a_slice_at_a_time():
    unbound = [pod(f"u{i}", on=None, phase="Pending", scheduled="Unschedulable") for i in range(5)]
    others = [pod("bound"), pod("finished", on=None, phase="Succeeded")]
    api = ApiServer([], [])
    reads = ClusterReads(api, synced(api, [], [*unbound, *others]))  # type: ignore[arg-type]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    running = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    found = await reads.unbound_pods(slice_size=2)
    running.cancel()
    assert sorted(p["metadata"]["name"] for p in found) == ["u0", "u1", "u2", "u3", "u4"]
    assert ticks >= 3 and api.asked == []  # the loop ran between the slices; no request


# -- Prometheus -------------------------------------------------------------------------------------

Answer = tuple[int, Any]


@pytest.fixture
async def prometheus() -> AsyncIterator[Callable[[Answer], Awaitable[tuple[str, list[str]]]]]:
    runners: list[web.AppRunner] = []

    async def start(answer: Answer) -> tuple[str, list[str]]:
        queries: list[str] = []

        async def query(req: web.Request) -> web.Response:
            queries.append(req.query.get("query", ""))
            return web.json_response(answer[1], status=answer[0])

        app = web.Application()
        app.router.add_get("/api/v1/query", query)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/", queries

    yield start
    for runner in runners:
        await runner.cleanup()


def vector(*values: str) -> Answer:
    result = [{"metric": {}, "value": [1764676800.0, v]} for v in values]
    return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}


QUERY = 'sum(rate(http_requests_total{code=~"5.."}[5m]))'


async def gated(url: str) -> WaveHealth:
    return await check([node("n1")], [pod("a")], request(prometheus={"url": url, "query": QUERY, "max": 0.5}))


async def test_prometheus_above_its_max_fails_the_gate(prometheus):
    url, queries = await prometheus(vector("0.75", "0.1"))
    health = await gated(url)
    assert queries == [QUERY]
    assert (health.verdict, health.reasons) == (
        "Failed",
        [f"Prometheus query {QUERY!r} = 0.75, above max 0.5"],
    )


async def test_prometheus_at_or_below_its_max_passes(prometheus):
    url, _ = await prometheus(vector("0.5"))
    assert (await gated(url)).verdict == "Healthy"
    url, _ = await prometheus(
        (200, {"status": "success", "data": {"resultType": "scalar", "result": [0, "0.2"]}})
    )
    assert (await gated(url)).verdict == "Healthy"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (vector(), "returned no sample"),
        (vector("NaN"), "returned no sample"),
        (
            (400, {"status": "error", "errorType": "bad_data", "error": "parse error"}),
            "answered 400: parse error",
        ),
        ((503, "overloaded"), "answered 503"),
    ],
)
async def test_prometheus_without_an_answer_keeps_the_gate_waiting(prometheus, answer, why):
    url, _ = await prometheus(answer)
    health = await gated(url)
    assert health.verdict == "Waiting" and len(health.reasons) == 1 and why in health.reasons[0]


async def test_prometheus_unreachable_keeps_the_gate_waiting():
    health = await gated("http://127.0.0.1:9")
    assert health.verdict == "Waiting" and "did not answer" in health.reasons[0]
