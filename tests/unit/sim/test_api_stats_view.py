"""The emulator's request counts as the bench and `karpflow sim api-stats` read them."""

from __future__ import annotations

from rich.console import Console

from sim.api_stats_view import difference, human_bytes, users_table, verbs_table
from sim.apiserver.api_stats import ApiStats, StatsKey

WORKER = "system:serviceaccount:karpflow:karpflow-worker"


def test_difference_keeps_what_moved_between_two_readings():
    stats = ApiStats()
    stats.record(StatsKey(WORKER, "list", "nodes"), 200, 1000, full_list=True)
    stats.record(StatsKey(WORKER, "get", "nodes"), 200, 10)
    before = stats.doc()
    stats.record(StatsKey(WORKER, "list", "nodes"), 429, 50)
    stats.add_bytes(StatsKey(WORKER, "watch", "pods"), 300)
    moved = {(r.verb, r.resource): r for r in difference(stats.doc(), before).rows}
    assert set(moved) == {("list", "nodes"), ("watch", "pods")}
    assert (moved["list", "nodes"].requests, moved["list", "nodes"].rejected) == (1, 1)
    assert moved["list", "nodes"].full_lists == 0 and moved["list", "nodes"].response_bytes == 50
    assert moved["watch", "pods"].response_bytes == 300 and moved["watch", "pods"].requests == 0


def test_tables_name_every_user_and_resource():
    stats = ApiStats()
    stats.record(StatsKey(WORKER, "create", "pods/eviction"), 201, 88)
    stats.record(StatsKey("system:anonymous", "list", "pods"), 200, 5_000_000, full_list=True)
    console = Console(width=200, record=True)
    doc = stats.doc()
    console.print(users_table(doc))
    console.print(verbs_table(doc, WORKER))
    text = console.export_text()
    assert WORKER in text and "system:anonymous" in text and "pods/eviction" in text
    assert human_bytes(5_000_000) == "5.0 MB" and human_bytes(88) == "88 B"
