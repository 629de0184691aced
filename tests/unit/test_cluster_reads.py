"""cluster/reads.py: the activities' hot reads come from the worker's cache while it is current, and
the API server has the last word where "nothing is left" ends a step."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from activities.drain import Drainer
from cluster.informer import INDEXES, ClusterCache, Resource
from cluster.reads import ClusterReads
from kube.client import Json, KubeApi, KubeError

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
KINDS = (
    Resource("Node", "v1", "nodes"),
    Resource("Pod", "v1", "pods"),
    Resource("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets"),
)


def node(name: str, uid: str = "n-uid", provider: str = "aws:///us-west-2a/i-1") -> Json:
    return {"metadata": {"name": name, "uid": uid, "resourceVersion": "1"}, "spec": {"providerID": provider}}


def pod(name: str, on: str = "n") -> Json:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"u-{name}",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True}],
        },
        "spec": {"nodeName": on, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


class CountingApi:
    """The API server's side: its pods, and every call the drain makes to it."""

    def __init__(self, pods: list[Json], cache: ClusterCache | None = None) -> None:
        self.pods = {p["metadata"]["uid"]: p for p in pods}
        self.cache = cache
        self.calls: list[str] = []

    async def pods_on_node(self, name: str) -> list[Json]:
        self.calls.append("list pods")
        return [p for p in self.pods.values() if p["spec"]["nodeName"] == name]

    async def find_node(self, name: str) -> Json | None:
        self.calls.append("get node")
        return node(name)

    async def pdbs(self, namespace: str) -> list[Json]:
        self.calls.append("list pdbs")
        return []

    async def evict(self, raw: Json) -> None:
        self.calls.append("evict")
        gone = self.pods.pop(raw["metadata"]["uid"], None)
        if gone is None:
            raise KubeError(404, "NotFound")
        if self.cache is not None:  # the watch brings the deletion
            informer = self.cache.informer("Pod")
            assert informer is not None
            informer._drop(f"default/{raw['metadata']['name']}")


def synced(api: Any, nodes: list[Json], pods: list[Json]) -> ClusterCache:
    cache = ClusterCache(api, resources=KINDS)
    cache._tasks = [object()]  # type: ignore[list-item]  # "started": nothing runs here
    objects = {"Node": nodes, "Pod": pods, "PodDisruptionBudget": []}
    for informer in cache.informers:
        informer.index_key = INDEXES.get(informer.resource.kind)
        informer._listed(
            {
                f"{o['metadata'].get('namespace') or ''}/{o['metadata']['name']}": o
                for o in objects[informer.resource.kind]
            },
            missing=False,
        )
        informer.watching = True
    return cache


async def test_a_drain_on_the_cache_lists_the_pods_from_the_server_only_to_confirm_the_end():
    pods = [pod(f"web-{i}") for i in range(3)]
    api = CountingApi(pods)
    cache = synced(api, [node("n")], pods)
    api.cache = cache
    reads = ClusterReads(api, cache)  # type: ignore[arg-type]
    progress = await Drainer(api, "n", None, poll_interval=0.001, clock=lambda: NOW, reads=reads).run()  # type: ignore[arg-type]
    assert progress.evicted == 3 and progress.pods_left == 0
    assert api.calls.count("list pods") == 1 and api.calls.count("evict") == 3
    assert "list pdbs" not in api.calls and "get node" not in api.calls


async def test_a_pod_the_cache_has_not_seen_yet_is_found_before_the_drain_ends():
    late = pod("late")
    api = CountingApi([late])
    cache = synced(api, [node("n")], [])  # bound a moment ago: not in the cache yet
    api.cache = cache
    reads = ClusterReads(api, cache)  # type: ignore[arg-type]
    progress = await Drainer(api, "n", None, poll_interval=0.001, clock=lambda: NOW, reads=reads).run()  # type: ignore[arg-type]
    assert progress.evicted == 1 and api.pods == {}


async def test_a_stale_or_missing_cache_sends_the_reads_to_the_server():
    api = CountingApi([pod("a")])
    cache = synced(api, [node("n")], [pod("a")])
    pods = cache.informer("Pod")
    assert pods is not None
    pods.watching, pods.current_at = False, float("-inf")  # its watch failed long ago
    reads = ClusterReads(api, cache)  # type: ignore[arg-type]
    assert [p["metadata"]["name"] for p in await reads.pods_on_node("n")] == ["a"]
    assert await reads.node("n") is not None and api.calls == ["list pods"]  # nodes: still cached
    assert reads.served == {"api": 1, "cache": 1}
    no_cache = ClusterReads(api)  # type: ignore[arg-type]
    await no_cache.node("n")
    assert api.calls[-1] == "get node"


async def test_nodes_are_found_by_provider_id_in_the_cache():
    api = CountingApi([])
    cache = synced(api, [node("ip-10-0-0-1", provider="aws:///z/i-abc")], [])
    reads = ClusterReads(api, cache)  # type: ignore[arg-type]
    found = await reads.node_with_provider_id("aws:///z/i-abc", "wrong-name")
    assert found is not None and found["metadata"]["name"] == "ip-10-0-0-1"
    assert await reads.node_with_provider_id("aws:///z/i-zzz") is None and api.calls == []


class WritingApi(KubeApi):
    """A KubeApi whose server holds one node at resourceVersion `server_rv`."""

    def __init__(self, server_rv: str) -> None:
        super().__init__(KubeApi.for_host("http://127.0.0.1:1")._client)
        self.server = {**node("n"), "metadata": {**node("n")["metadata"], "resourceVersion": server_rv}}
        self.calls: list[str] = []

    async def request(self, method: str, path: str, **kwargs: Any) -> Json:
        self.calls.append(method)
        if method == "GET":
            return dict(self.server)
        body = kwargs["body"]
        if body["metadata"]["resourceVersion"] != self.server["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict")
        return body


def label(n: Json) -> bool:
    labels = n["metadata"].setdefault("labels", {})
    if labels.get("x") == "y":
        return False
    labels["x"] = "y"
    return True


async def test_a_write_on_the_cached_version_reads_only_when_it_conflicts():
    cached = node("n")  # resourceVersion 1
    current = WritingApi("1")
    await current.update_node("n", label, current=cached)
    assert current.calls == ["PUT"] and "labels" not in cached["metadata"]  # the cache's copy untouched
    behind = WritingApi("2")
    await behind.update_node("n", label, current=cached)
    assert behind.calls == ["PUT", "GET", "PUT"]
    done = {**cached, "metadata": {**cached["metadata"], "labels": {"x": "y"}}}
    nothing = WritingApi("2")
    await nothing.update_node("n", label, current=done)
    assert nothing.calls == ["GET", "PUT"]  # "nothing to change" on a cached copy is the server's to say


async def test_the_first_read_on_a_worker_without_a_running_cache_starts_it_and_asks_the_server():
    class Unreachable(CountingApi):
        async def request(self, *_: Any, **__: Any) -> Json:
            raise KubeError(503, "Service Unavailable")  # the informers keep trying meanwhile

    api = Unreachable([pod("a")])
    cache = ClusterCache(api, resources=KINDS)  # type: ignore[arg-type]
    reads = ClusterReads(api, cache)  # type: ignore[arg-type]
    try:
        assert [p["metadata"]["name"] for p in await reads.pods_on_node("n")] == ["a"]
        assert cache.started and api.calls == ["list pods"] and reads.served == {"api": 1}
    finally:
        await cache.stop()
