"""MaintenanceWindows in the operator's time zone, one-off exclusions and the allow-list form
(issue 35 item 3; docs/operator-controls.md). Times are checked in UTC, so a wrong offset or a
daylight-saving slip shows as an hour's difference."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from planner.maintenance_windows import blocked, read_window
from planner.model import PlanOptions
from planner.plan import plan
from planner.windows_cli import windows
from sim.cluster_builder import ClusterBuilder

NEW_YORK = "America/New_York"


def window(name: str = "w", **spec: object) -> dict:
    spec.setdefault("actions", ["Drift"])
    return {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "MaintenanceWindow",
        "metadata": {"name": name},
        "spec": spec,
    }


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def until(w: dict, at: datetime, action: str = "Drift") -> datetime | str | None:
    """When the block of `action` at `at` ends; "open" when nothing blocks it."""
    found = blocked([read_window(w)], action, {}, at)
    return "open" if found is None else found.until


# --- Time zones and daylight saving ---------------------------------------------------------------


def test_a_cron_in_new_york_follows_the_clock_across_the_spring_change():
    """01:00 local for 8 h: 06:00-14:00 UTC in winter (EST, -5), 05:00-13:00 UTC once the clocks
    went forward on Sunday 8 March 2026 (EDT, -4)."""
    nightly = window(timeZone=NEW_YORK, schedules=[{"cron": "0 1 * * *", "duration": "8h"}])
    assert until(nightly, utc(2026, 3, 7, 5, 30)) == "open"
    assert until(nightly, utc(2026, 3, 7, 6, 0)) == utc(2026, 3, 7, 14, 0)
    assert until(nightly, utc(2026, 3, 9, 5, 0)) == utc(2026, 3, 9, 13, 0)
    assert until(nightly, utc(2026, 3, 9, 13, 0)) == "open"
    # The night of the change: 01:00 EST is 06:00 UTC; the duration is elapsed time, 8 hours.
    assert until(nightly, utc(2026, 3, 8, 6, 0)) == utc(2026, 3, 8, 14, 0)


def test_a_time_the_spring_change_skips_opens_when_the_clocks_jump():
    """02:30 does not exist in New York on 8 March 2026: the window opens at 03:00 EDT (07:00 UTC),
    as cron(8) runs a job of the skipped hour right after the change."""
    w = window(timeZone=NEW_YORK, schedules=[{"cron": "30 2 * * *", "duration": "1h"}])
    assert until(w, utc(2026, 3, 8, 6, 59)) == "open"
    assert until(w, utc(2026, 3, 8, 7, 0)) == utc(2026, 3, 8, 8, 0)
    assert until(w, utc(2026, 3, 9, 6, 30)) == utc(2026, 3, 9, 7, 30)  # the day after: 02:30 EDT


def test_a_time_the_autumn_change_repeats_opens_the_window_once():
    """01:30 happens twice in New York on 1 November 2026 (EDT, then EST): the window opens at
    the first, 05:30 UTC, for its 30 minutes, and not again at 06:30 UTC."""
    w = window(timeZone=NEW_YORK, schedules=[{"cron": "30 1 * * *", "duration": "30m"}])
    assert until(w, utc(2026, 11, 1, 5, 30)) == utc(2026, 11, 1, 6, 0)
    assert until(w, utc(2026, 11, 1, 6, 45)) == "open"
    assert read_window(w).next_start(utc(2026, 11, 1, 6, 1)) == utc(2026, 11, 2, 6, 30)  # 01:30 EST
    assert until(w, utc(2026, 11, 2, 6, 30)) == utc(2026, 11, 2, 7, 0)


# --- Allow-list form ------------------------------------------------------------------------------

TUESDAY_NIGHTS_BERLIN = window(
    "tuesday-nights",
    mode="Allow",
    timeZone="Europe/Berlin",
    schedules=[{"cron": "0 2 * * 2", "duration": "3h"}],
)


def test_an_allow_window_allows_only_while_a_schedule_is_active():
    """ "Only Tuesday 02:00-05:00 Europe/Berlin": 01:00-04:00 UTC in winter (CET, +1)."""
    tuesday_0230_cet = utc(2026, 12, 1, 1, 30)
    assert until(TUESDAY_NIGHTS_BERLIN, tuesday_0230_cet) == "open"
    # Outside it the action is blocked until the next opening, a week later.
    assert until(TUESDAY_NIGHTS_BERLIN, utc(2026, 12, 1, 4, 0)) == utc(2026, 12, 8, 1, 0)
    assert until(TUESDAY_NIGHTS_BERLIN, utc(2026, 12, 3, 12, 0)) == utc(2026, 12, 8, 1, 0)
    # In summer (CEST, +2) the same wall clock is an hour earlier in UTC.
    assert until(TUESDAY_NIGHTS_BERLIN, utc(2026, 7, 7, 0, 30)) == "open"
    assert until(TUESDAY_NIGHTS_BERLIN, utc(2026, 7, 6, 23, 59)) == utc(2026, 7, 7, 0, 0)


def test_an_allow_window_blocks_only_its_actions_and_only_on_the_nodes_it_selects():
    w = dict(TUESDAY_NIGHTS_BERLIN)
    w["spec"] = {
        **w["spec"],
        "selector": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["blue"]}],
    }
    wednesday = utc(2026, 12, 2, 12, 0)
    assert blocked([read_window(w)], "Drift", {"karpenter.sh/nodepool": "blue"}, wednesday) is not None
    assert blocked([read_window(w)], "Drift", {"karpenter.sh/nodepool": "green"}, wednesday) is None
    assert blocked([read_window(w)], "Consolidation", {"karpenter.sh/nodepool": "blue"}, wednesday) is None


def test_an_allow_window_and_a_block_window_must_both_allow():
    """Every matching window must allow (AND): a block window inside the allowed hours holds the
    action back until it closes, and the block then runs on to the next opening."""
    allow = read_window(TUESDAY_NIGHTS_BERLIN)
    freeze = read_window(window("freeze", schedules=[{"cron": "0 1 1 12 *", "duration": "1h"}]))
    found = blocked([allow, freeze], "Drift", {}, utc(2026, 12, 1, 1, 30))
    assert found is not None and found.windows == ("freeze",)
    assert found.until == utc(2026, 12, 1, 2, 0)  # the freeze's end, inside the allowed hours
    assert blocked([allow, freeze], "Drift", {}, utc(2026, 12, 1, 2, 0)) is None
    # Past the allowed hours the Allow window blocks on its own until its next opening.
    found = blocked([allow, freeze], "Drift", {}, utc(2026, 12, 1, 4, 0))
    assert found is not None and found.windows == ("tuesday-nights",)
    assert found.until == utc(2026, 12, 8, 1, 0)


# --- One-off exclusions ---------------------------------------------------------------------------

BLACK_FRIDAY = {"start": "2026-11-26T00:00:00-05:00", "end": "2026-11-30T23:59:00-05:00", "reason": "freeze"}


def test_an_exclusion_blocks_from_its_start_to_its_end():
    w = window(exclusions=[BLACK_FRIDAY])
    assert until(w, utc(2026, 11, 26, 4, 59)) == "open"
    assert until(w, utc(2026, 11, 26, 5, 0)) == utc(2026, 12, 1, 4, 59)
    assert until(w, utc(2026, 12, 1, 4, 59)) == "open"
    assert read_window(w).next_start(utc(2026, 11, 1)) == utc(2026, 11, 26, 5, 0)


def test_an_exclusion_blocks_inside_an_allow_window_and_chains_with_the_wait_for_the_next_opening():
    """An exclusion covering Tuesday 1 December's opening: blocked from the exclusion's start to the
    next opening after it, 8 December."""
    freeze = {"start": "2026-11-30T00:00:00Z", "end": "2026-12-01T02:00:00Z"}
    w = {**TUESDAY_NIGHTS_BERLIN, "spec": {**TUESDAY_NIGHTS_BERLIN["spec"], "exclusions": [freeze]}}
    assert until(w, utc(2026, 12, 1, 1, 30)) == utc(2026, 12, 1, 2, 0)  # then open until 04:00
    assert until(w, utc(2026, 12, 1, 2, 0)) == "open"
    later = {"start": "2026-11-30T00:00:00Z", "end": "2026-12-01T05:00:00Z"}
    w["spec"] = {**w["spec"], "exclusions": [later]}
    assert until(w, utc(2026, 12, 1, 1, 30)) == utc(2026, 12, 8, 1, 0)


# --- Fail closed ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (
            {"timeZone": "Mars/Olympus", "schedules": [{"cron": "0 1 * * *", "duration": "1h"}]},
            "Mars/Olympus",
        ),
        ({"mode": "Allow"}, "mode Allow needs at least one schedule"),
        ({"mode": "Sometimes", "schedules": [{"cron": "0 1 * * *", "duration": "1h"}]}, "mode"),
        ({"exclusions": [{"start": "2026-11-30T00:00:00Z", "end": "2026-11-29T00:00:00Z"}]}, "not after"),
        ({"exclusions": [{"start": "2026-11-30T00:00:00", "end": "2026-12-01T00:00:00Z"}]}, "timezone"),
    ],
)
def test_a_window_that_does_not_read_fails_closed_with_its_problem(spec, problem):
    w = read_window(window(**spec))
    assert w.broken and problem in " ".join(w.problems), w.problems
    assert until(window(**spec), utc(2026, 12, 1)) is None  # blocks, with no end of its own


# --- With the planner's clock ---------------------------------------------------------------------


def drift_cluster(now: datetime) -> ClusterBuilder:
    b = ClusterBuilder(now=now)
    b.nodepool("blue", policy="WhenEmpty", budgets=[{"nodes": "100%"}])
    b.node("blue-0", pool="blue", annotations={"karpenter.sh/nodepool-hash": "stale"})
    b.pod("web-1", "blue-0")
    b.maintenance_window(
        "after-hours",
        actions=["Drift"],
        mode="Allow",
        time_zone=NEW_YORK,
        schedules=[{"cron": "0 22 * * *", "duration": "6h"}],
        exclusions=[{"start": "2026-11-26T00:00:00-05:00", "end": "2026-11-27T00:00:00-05:00"}],
    )
    return b


@pytest.mark.parametrize(
    ("now", "drifts", "reason"),
    [
        # 21:59 EDT on 7 March... the last winter evening: opens at 22:00 EST = 03:00 UTC.
        (utc(2026, 3, 8, 2, 59), False, "until 2026-03-08T03:00:00Z"),
        (utc(2026, 3, 8, 3, 0), True, None),
        # The next evening it opens at 22:00 EDT = 02:00 UTC.
        (utc(2026, 3, 9, 1, 59), False, "until 2026-03-09T02:00:00Z"),
        (utc(2026, 3, 9, 2, 0), True, None),
        # Thanksgiving's exclusion (midnight to midnight, New York's winter time) holds the evening
        # of the 26th until its end, 05:00 UTC; the rest of that night's window allows.
        (utc(2026, 11, 27, 3, 0), False, "until 2026-11-27T05:00:00Z"),
        (utc(2026, 11, 27, 5, 0), True, None),
    ],
)
def test_the_plan_drifts_only_when_the_new_york_allow_window_opens(now, drifts, reason):
    b = drift_cluster(now)
    result = plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))
    assert any(c.method == "drift" and "blue-0" in c.nodes for c in result.commands) is drifts
    if reason:
        blocks = {x.node: x.reason for x in result.blocked}
        assert blocks["blue-0"] == f"MaintenanceWindow after-hours blocks Drift {reason}"


def test_karpflow_windows_shows_the_next_opening_in_local_and_utc_time(tmp_path):
    b = drift_cluster(utc(2026, 3, 8, 1, 0))
    path = b.write(tmp_path / "cluster.yaml")
    result = CliRunner().invoke(
        windows,
        ["--snapshot", str(path), "--at", "2026-03-08T01:00:00Z", "-o", "json"],
        env={"COLUMNS": "220"},
    )
    assert result.exit_code == 0, result.output
    (w,) = json.loads(result.output)["windows"]
    assert (w["mode"], w["timeZone"], w["active"]) == ("Allow", NEW_YORK, True)
    assert (w["until"], w["untilLocal"]) == ("2026-03-08T03:00:00Z", "2026-03-07T22:00:00-05:00 EST")
    table = CliRunner().invoke(
        windows, ["--snapshot", str(path), "--at", "2026-03-08T01:00:00Z"], env={"COLUMNS": "220"}
    )
    assert "next opening 2026-03-08T03:00:00Z (2026-03-07T22:00:00-05:00 EST)" in table.output, table.output
    assert "except 2026-11-26T05:00:00Z to 2026-11-27T05:00:00Z" in table.output
