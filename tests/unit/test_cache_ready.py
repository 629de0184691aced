"""The cluster cache is ready for passes once synced and parsed (cluster/informer.py), even when its
first parse fails: each pass's snapshot parses what is still pending and says why it cannot."""

from __future__ import annotations

import logging
from typing import Any

from cluster.informer import ClusterCache


def synced_cache() -> ClusterCache:
    cache = ClusterCache(object())  # type: ignore[arg-type]  # no informer runs here
    for informer in cache.informers:
        informer.synced.set()
    return cache


def failing_parse() -> Any:
    def catch_up() -> None:
        raise ValueError("a malformed object")

    return catch_up


async def test_a_failed_first_parse_is_logged_and_the_cache_is_ready_anyway(caplog, monkeypatch):
    cache = synced_cache()
    monkeypatch.setattr(cache.builder, "catch_up", failing_parse())
    with caplog.at_level(logging.ERROR, logger="cluster.informer"):
        await cache._after_sync()
    assert await cache.wait_ready(0.1)
    assert "parsing the synced cluster for the planner failed" in caplog.text
    assert "a malformed object" in caplog.text
