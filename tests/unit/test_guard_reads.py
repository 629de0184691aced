"""The operator's controls at the taint, and a termination's release of its NodeDisruptionBudget
claims, read from the worker's cache (issue 34): no LIST of MaintenanceWindows or budgets per node."""

from __future__ import annotations

from typing import Any

from activities import budget_claims
from activities.taints import TaintActivities
from api.activity_io import TaintRequest
from cluster.informer import INDEXES, ClusterCache, Resource
from cluster.reads import ClusterReads
from kube.client import Json, KubeError

KINDS = (
    Resource("MaintenanceWindow", "karpflow.dev/v1alpha1", "maintenancewindows", optional=True),
    Resource("NodeDisruptionBudget", "karpflow.dev/v1alpha1", "nodedisruptionbudgets", optional=True),
)
CLAIM = {
    "node": "n",
    "uid": "n-uid",
    "holder": "cmd@run",
    "reason": "Drifted",
    "since": "2026-01-01T12:00:00Z",
}


def budget(name: str, claims: list[Json]) -> Json:
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "NodeDisruptionBudget",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"nodeSelector": {"matchLabels": {"team": "other"}}, "maxUnavailable": 1},
        "status": {"claims": claims},
    }


class ServerApi:
    """The API server: its budgets, and every call made to it."""

    def __init__(self, budgets: list[Json]) -> None:
        self.budgets = {name_of(b): b for b in budgets}
        self.calls: list[str] = []

    async def list_cluster_custom(self, group: str, version: str, plural: str) -> list[Json]:
        self.calls.append(f"list {plural}")
        return list(self.budgets.values()) if plural == "nodedisruptionbudgets" else []

    async def get_cluster_custom(self, group: str, version: str, plural: str, name: str) -> Json:
        self.calls.append(f"get {name}")
        return self.budgets[name]

    async def replace_cluster_custom_status(
        self, group: str, version: str, plural: str, name: str, body: Json
    ) -> Json:
        self.calls.append(f"write {name}")
        self.budgets[name] = body
        return body


def name_of(obj: Json) -> str:
    return str(obj["metadata"]["name"])


def cached(api: Any, objects: dict[str, list[Json]]) -> ClusterReads:
    cache = ClusterCache(api, resources=KINDS)
    cache._tasks = [object()]  # type: ignore[list-item]  # "started": nothing runs here
    for informer in cache.informers:
        informer.index_key = INDEXES.get(informer.resource.kind)
        items = {f"/{name_of(o)}": o for o in objects.get(informer.resource.kind, [])}
        informer._listed(items, missing=False)
        informer.watching = True
    return ClusterReads(api, cache)


async def test_the_controls_at_the_taint_come_from_the_cache() -> None:
    api = ServerApi([])
    reads = cached(api, {})
    taints = TaintActivities(api, reads=reads)  # type: ignore[arg-type]
    node = {"metadata": {"name": "n", "uid": "n-uid", "labels": {"team": "a"}}}
    await taints._check_controls(TaintRequest(nodes=["n"], command_id="cmd@run", reason="Drifted"), [node])
    assert api.calls == []  # before issue 34: a LIST of MaintenanceWindows per taint


async def test_a_termination_releases_its_claims_where_the_cache_shows_them() -> None:
    holding, other = budget("holding", [CLAIM]), budget("other", [])
    api = ServerApi([holding, other])
    reads = cached(api, {"NodeDisruptionBudget": [holding, other]})
    assert await budget_claims.release(api, nodes=["n"], uid="n-uid", reads=reads) == 1  # type: ignore[arg-type]
    assert api.calls == ["get holding", "write holding"]  # the claim is written on the server's copy
    assert api.budgets["holding"]["status"]["claims"] == []
    # A rollback moments after its claim lists the budgets from the server, whatever the cache.
    api.calls.clear()
    assert await budget_claims.release(api, nodes=["n"]) == 0  # type: ignore[arg-type]
    assert api.calls == ["list nodedisruptionbudgets"]


async def test_a_nodepool_is_read_from_the_cache_and_one_it_lacks_from_the_server() -> None:
    class PoolApi(ServerApi):
        async def get_cluster_custom(self, group: str, version: str, plural: str, name: str) -> Json:
            self.calls.append(f"get {name}")
            if name != "new":
                raise KubeError(404, "NotFound")
            return {"metadata": {"name": "new"}}

    api = PoolApi([])
    cache = ClusterCache(api, resources=(Resource("NodePool", "karpenter.sh/v1", "nodepools"),))
    cache._tasks = [object()]  # type: ignore[list-item]
    informer = cache.informers[0]
    informer._listed({"/general": {"metadata": {"name": "general"}}}, missing=False)
    informer.watching = True
    reads = ClusterReads(api, cache)  # type: ignore[arg-type]
    found = await reads.nodepool("general")
    assert found is not None and found["metadata"]["name"] == "general" and api.calls == []
    assert found is not informer.items["/general"]  # a copy: the caller may parse it as it likes
    assert await reads.nodepool("new") == {"metadata": {"name": "new"}}  # created a moment ago
    assert await reads.nodepool("gone") is None and api.calls == ["get new", "get gone"]
