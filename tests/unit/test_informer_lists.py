"""cluster/informer.py lists page by page, relists from the version it saw (not older than), falls back
to a consistent list when that version is refused, and keeps the activities' indexes current."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from cluster.informer import INDEXES, Informer, Resource
from kube.client import Json, KubeError

PODS = Resource("Pod", "v1", "pods")


def pod(name: str, node: str, rv: int) -> Json:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"u-{name}", "resourceVersion": str(rv)},
        "spec": {"nodeName": node},
    }


class PagingApi:
    """Serves `objects` in pages of the asked limit, as kube-apiserver does; records every query.
    `refuse_since` answers a list with a resourceVersion 410, as a server that no longer has it."""

    def __init__(self, objects: list[Json], version: str = "100", refuse_since: bool = False) -> None:
        self.objects = objects
        self.version = version
        self.refuse_since = refuse_since
        self.queries: list[dict[str, Any]] = []
        self.events: list[Json] = []

    async def request(self, method: str, path: str, *, query: dict[str, Any] | None = None) -> Json:
        query = dict(query or {})
        self.queries.append(query)
        if self.refuse_since and "resourceVersion" in query:
            raise KubeError(410, "Gone", '{"message": "too old resource version"}')
        limit = int(query.get("limit") or 0)
        start = int(query.get("continue") or 0)
        page = self.objects[start : start + limit] if limit else self.objects[start:]
        meta: dict[str, Any] = {"resourceVersion": self.version}
        if limit and start + limit < len(self.objects):
            meta["continue"] = str(start + limit)
        return {"items": [dict(o) for o in page], "metadata": meta}

    async def watch(
        self, path: str, version: str, seconds: int, opened: Callable[[], None] | None = None
    ) -> AsyncIterator[Json]:
        if opened is not None:
            opened()
        for event in self.events:
            yield event


def informer(api: PagingApi, page_size: int = 2) -> Informer:
    return Informer(api, PODS, page_size=page_size, index_key=INDEXES["Pod"])  # type: ignore[arg-type]


async def test_a_list_comes_in_pages_and_only_the_first_asks_for_a_version():
    api = PagingApi([pod(f"p{i}", "n1", i) for i in range(5)])
    cache = informer(api)
    assert await cache._list() == "100"
    assert len(cache.items) == 5 and cache.stats.pages == 3
    assert api.queries == [{"limit": 2}, {"limit": 2, "continue": "2"}, {"limit": 2, "continue": "4"}]


async def test_a_relist_asks_for_no_older_than_the_version_the_cache_saw():
    api = PagingApi([pod("a", "n1", 1)])
    cache = informer(api, page_size=500)
    await cache._list()
    api.events = [
        {"type": "ADDED", "object": pod("b", "n2", 120)},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "150"}}},
        {"type": "ERROR", "object": {"code": 410, "message": "too old"}},
    ]
    assert await cache._watch("100") is None  # 410: list again
    api.queries.clear()
    await cache._list()
    assert api.queries == [{"limit": 500, "resourceVersion": "150", "resourceVersionMatch": "NotOlderThan"}]
    assert cache.stats.relists_resumed == 1


async def test_a_refused_version_falls_back_to_a_consistent_list():
    api = PagingApi([pod("a", "n1", 1)], refuse_since=True)
    cache = informer(api, page_size=500)
    cache.seen_version = "42"
    await cache._list()
    assert api.queries == [
        {"limit": 500, "resourceVersion": "42", "resourceVersionMatch": "NotOlderThan"},
        {"limit": 500},
    ]
    assert set(cache.items) == {"default/a"} and cache.seen_version == "100"


async def test_the_index_follows_listings_and_events():
    api = PagingApi([pod("a", "n1", 1), pod("b", "n1", 2)])
    cache = informer(api)
    await cache._list()
    assert {p["metadata"]["name"] for p in cache.indexed("n1")} == {"a", "b"}
    api.events = [
        {"type": "MODIFIED", "object": pod("a", "n2", 3)},  # rebound (a new pod of the name)
        {"type": "DELETED", "object": pod("b", "n1", 4)},
    ]
    await cache._watch("100")
    assert cache.indexed("n1") == [] and "n1" not in cache.index
    assert [p["metadata"]["name"] for p in cache.indexed("n2")] == ["a"]


@pytest.mark.parametrize("status", [404])
async def test_an_optional_kind_the_server_does_not_serve_is_empty(status: int):
    class Missing(PagingApi):
        async def request(self, method: str, path: str, *, query: dict[str, Any] | None = None) -> Json:
            raise KubeError(status, "Not Found")

    cache = Informer(
        Missing([]), Resource("VolumeAttachment", "storage.k8s.io/v1", "volumeattachments", True)
    )  # type: ignore[arg-type]
    assert await cache._list() == "0" and cache.missing and cache.synced.is_set()
