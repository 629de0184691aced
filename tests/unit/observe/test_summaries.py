"""The Web UI's one-line summary and memo of a planner command (api/workflow_summaries.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from api.workflow_io import Approval
from api.workflow_summaries import (
    awaiting_approval_details,
    disruption_details,
    disruption_memo,
    disruption_summary,
)


@dataclass
class Replacement:
    nodepool: str
    instance_type_names: list[str]
    capacity_type: str
    zones: list[str]


@dataclass
class Command:
    reason: str
    method: str
    nodes: list[str]
    replacements: list[Replacement] = field(default_factory=list)
    savings_per_hour: float = 0.0
    message: str = ""

    @property
    def decision(self) -> str:
        return "replace" if self.replacements else "delete"


A = "ip-10-0-1-2.us-west-2.compute.internal"
B = "ip-10-0-3-4.us-west-2.compute.internal"


def test_a_replacement_reads_as_a_sentence_with_type_capacity_zone_and_savings():
    command = Command(
        "Underutilized",
        "single-node-consolidation",
        [A],
        [Replacement("default", ["m5.large", "m5a.large"], "spot", ["us-west-2a"])],
        savings_per_hour=0.0452,
    )
    assert disruption_summary(command) == (
        "Underutilized: replace ip-10-0-1-2 with m5.large spot in us-west-2a (or 1 other type), "
        "saves $0.0452/h"
    )


def test_a_delete_names_its_nodes_and_the_memo_carries_the_command():
    command = Command("Empty", "emptiness", [A, B], savings_per_hour=0.192)
    assert disruption_summary(command) == "Empty: delete 2 nodes: ip-10-0-1-2, ip-10-0-3-4, saves $0.1920/h"
    memo = disruption_memo(command, "karpflow disrupt --all")
    assert memo == {
        "command": "karpflow disrupt --all",
        "reason": "Empty",
        "method": "emptiness",
        "decision": "delete",
        "nodes": [A, B],
        "estimatedSavingsPerHour": 0.192,
    }
    assert f"- {A}" in disruption_details(command)


def test_many_nodes_are_counted_and_the_summary_fits_one_line():
    command = Command("Drifted", "drift", [f"ip-10-0-0-{i}.compute.internal" for i in range(40)])
    summary = disruption_summary(command)
    assert summary.startswith("Drifted: delete 40 nodes: ip-10-0-0-0, ip-10-0-0-1, ip-10-0-0-2 and 37 more")
    assert len(summary) <= 200


def test_a_command_that_awaits_approval_says_so_with_its_timeout_and_savings():
    command = Command(
        "Drifted",
        "drift",
        [A],
        [Replacement("default", ["m5.large"], "on-demand", ["us-west-2a"])],
        savings_per_hour=0.0125,
    )
    approval = Approval(timeout=timedelta(hours=2), savings_per_hour=0.0125)
    assert disruption_summary(command, approval) == (
        "Drifted (awaits approval, 2h): replace ip-10-0-1-2 with m5.large on-demand in us-west-2a, "
        "saves $0.0125/h"
    )
    details = disruption_details(command, approval)
    assert "**Awaits approval**" in details and "no decision within 2h rejects it" in details
    assert "$0.0125/h" in details
    assert "approval" not in disruption_summary(command) + disruption_details(command)

    current = awaiting_approval_details(command, approval, datetime(2026, 11, 26, 19, 0, tzinfo=UTC))
    assert current.startswith("**Awaiting approval**: Drifted: replace ip-10-0-1-2 with m5.large")
    assert "rejected at 2026-11-26T19:00:00Z (timeout 2h)" in current
    assert f"- {A}" in current and "- replacement 1: m5.large on-demand in us-west-2a" in current
