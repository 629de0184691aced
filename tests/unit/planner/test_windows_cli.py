"""`karpflow windows` on snapshot files: what is blocked now, by what, until when."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from click.testing import CliRunner

from planner.windows_cli import windows
from sim.cluster_builder import ClusterBuilder

MONDAY_10 = "2026-11-23T10:00:00Z"
BLUE = [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["blue"]}]


def cluster(tmp_path):
    b = ClusterBuilder(now=datetime(2026, 11, 23, 10, 0, tzinfo=UTC))
    for pool in ("blue", "green"):
        b.nodepool(
            pool,
            budgets=[
                {"nodes": "100%"},
                {"nodes": "0", "reasons": ["Drifted"], "schedule": "0 9 * * 1-5", "duration": "8h"},
            ],
        )
        for i in range(3):
            b.node(f"{pool}-{i}", pool=pool, labels={"role": "ingress"} if i == 0 else None)
    b.maintenance_window(
        "office",
        actions=["Consolidation", "Drift"],
        selector=BLUE,
        schedules=[{"cron": "0 9 * * 1-5", "duration": "8h"}],
    )
    b.maintenance_window(
        "nights", actions=["Expiration"], schedules=[{"cron": "0 22 * * *", "duration": "6h"}]
    )
    b.node_disruption_budget("ingress", selector={"matchLabels": {"role": "ingress"}}, max_unavailable=1)
    return b.write(tmp_path / "cluster.yaml")


def run(*args: str):
    return CliRunner().invoke(windows, list(args), env={"COLUMNS": "200"})


def test_the_json_report_says_what_is_blocked_by_what_and_until_when(tmp_path):
    result = run("--snapshot", str(cluster(tmp_path)), "--at", MONDAY_10, "-o", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["at"] == MONDAY_10
    by_name = {w["name"]: w for w in report["windows"]}
    assert (by_name["office"]["active"], by_name["office"]["until"], by_name["office"]["nodes"]) == (
        True,
        "2026-11-23T17:00:00Z",
        3,
    )
    assert (by_name["nights"]["active"], by_name["nights"]["nextStart"]) == (False, "2026-11-23T22:00:00Z")
    assert [item["node"] for item in report["blocked"]] == ["blue-0", "blue-1", "blue-2"]
    assert report["blocked"][0]["blocked"] == [
        {
            "action": "Drift",
            "windows": ["office"],
            "until": "2026-11-23T17:00:00Z",
            "ends": "2026-11-23T17:00:00Z",
            "message": "MaintenanceWindow office blocks Drift until 2026-11-23T17:00:00Z",
        },
        {
            "action": "Consolidation",
            "windows": ["office"],
            "until": "2026-11-23T17:00:00Z",
            "ends": "2026-11-23T17:00:00Z",
            "message": "MaintenanceWindow office blocks Consolidation until 2026-11-23T17:00:00Z",
        },
    ]
    (ndb,) = report["nodeDisruptionBudgets"]
    assert (ndb["rule"], ndb["selected"], ndb["remaining"]) == ("maxUnavailable 1", 2, 1)
    drifted = [p for p in report["nodepoolBudgets"] if p["reason"] == "Drifted"]
    assert [(p["nodepool"], p["remaining"], p["nextChange"]) for p in drifted] == [
        ("blue", 0, "2026-11-23T17:00:00Z"),
        ("green", 0, "2026-11-23T17:00:00Z"),
    ]


def test_after_the_window_closes_nothing_is_blocked(tmp_path):
    result = run("--snapshot", str(cluster(tmp_path)), "--at", "2026-11-23T17:00:00Z", "-o", "json")
    assert json.loads(result.output)["blocked"] == []


def test_the_table_names_windows_nodes_and_budgets(tmp_path):
    result = run("--snapshot", str(cluster(tmp_path)), "--at", MONDAY_10)
    assert result.exit_code == 0, result.output
    for text in (
        "MaintenanceWindows",
        "office",
        "blocks, until 2026-11-23T17:00:00Z",
        "next blocks at 2026-11-23T22:00:00Z",
        "Blocked now",
        "blue-0, blue-1, blue-2",
        "Drift, Consolidation",
        "ingress",
        "maxUnavailable 1",
    ):
        assert text in result.output, text


def test_an_unreadable_file_or_a_cluster_without_nodes_is_an_error(tmp_path):
    missing = run("--snapshot", str(tmp_path / "missing.yaml"))
    assert missing.exit_code == 2 and "cannot read snapshot" in missing.output
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: List\nitems: []\n")
    result = run("--snapshot", str(empty))
    assert result.exit_code == 2 and "has no nodes" in result.output
