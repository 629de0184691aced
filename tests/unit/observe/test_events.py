"""The EventRecorder: core/v1 Events as kubectl reads them, deduplicated, counted, rate-limited per
object, and never a failure for the caller. The API is a fake that keeps Events as a server would."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest

from api.activity_io import NodeRef
from api.event_reasons import CATALOG, Reason
from kube import events
from kube.client import KubeError
from kube.events import EventRecorder
from runtime import metrics

NODE = {"metadata": {"name": "ip-10-0-0-1", "uid": "node-uid-1"}}
POD = {"metadata": {"name": "web-1", "namespace": "shop", "uid": "pod-uid-1"}}


class FakeEventsApi:
    """Stores Events by namespace/name; POST creates, merge-PATCH updates, like the API server."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.fail_with: KubeError | None = None

    async def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if self.fail_with is not None:
            raise self.fail_with
        parts = path.strip("/").split("/")  # api v1 namespaces NS events [NAME]
        namespace = parts[3]
        if method == "POST":
            key = f"{namespace}/{body['metadata']['name']}"
            assert key not in self.events, "an Event name must be new"
            self.events[key] = json.loads(json.dumps(body))
            return body
        key = f"{namespace}/{parts[5]}"
        if key not in self.events:
            raise KubeError(404, "NotFound")
        self.events[key].update(body)
        return self.events[key]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorder(api: FakeEventsApi, clock: Clock, **kwargs: Any) -> EventRecorder:
    return EventRecorder(api, host="worker-1", clock=clock, **kwargs)  # type: ignore[arg-type]


async def test_a_node_event_is_a_core_v1_event_in_default_naming_the_node_and_its_uid():
    api, clock = FakeEventsApi(), Clock()
    outcome = await recorder(api, clock).record(events.disruption_blocked(NODE, "pod shop/db has a PDB"))
    assert outcome == "created"
    ((key, event),) = api.events.items()
    assert key.startswith("default/ip-10-0-0-1.")
    assert event["involvedObject"] == {
        "kind": "Node",
        "name": "ip-10-0-0-1",
        "uid": "node-uid-1",
        "apiVersion": "v1",
    }
    assert (event["reason"], event["type"], event["count"]) == ("DisruptionBlocked", "Normal", 1)
    assert event["message"] == "Cannot disrupt Node: pod shop/db has a PDB"
    assert event["source"] == {"component": "karpflow", "host": "worker-1"}
    assert event["firstTimestamp"] == event["lastTimestamp"]


async def test_a_pod_event_lands_in_the_pods_namespace():
    api, clock = FakeEventsApi(), Clock()
    await recorder(api, clock).record(events.evicted(POD, "Underutilized"))
    ((key, event),) = api.events.items()
    assert key.startswith("shop/web-1.")
    assert event["involvedObject"]["namespace"] == "shop" and event["involvedObject"]["kind"] == "Pod"
    assert (event["reason"], event["message"]) == ("Evicted", "Evicted pod: Underutilized")


async def test_a_repeat_inside_the_window_is_dropped_and_after_it_counted_on_the_same_event():
    api, clock = FakeEventsApi(), Clock()
    rec = recorder(api, clock)
    blocked = events.disruption_blocked(NODE, "budget")
    assert await rec.record(blocked) == "created"
    clock.now += CATALOG[Reason.DISRUPTION_BLOCKED].dedupe.total_seconds() - 1
    assert await rec.record(blocked) == "deduplicated"
    assert len(api.calls) == 1
    clock.now += 2
    assert await rec.record(blocked) == "aggregated"
    ((_, event),) = api.events.items()
    assert event["count"] == 2 and api.calls[-1][0] == "PATCH"
    # a different message is a different Event
    assert await rec.record(events.disruption_blocked(NODE, "do-not-disrupt")) == "created"
    assert len(api.events) == 2


async def test_failed_draining_stays_one_event_while_the_number_of_pods_changes():
    api, clock = FakeEventsApi(), Clock()
    rec = recorder(api, clock, dedupe_override=timedelta(0))
    for waiting in (5, 4, 3):
        await rec.record(events.failed_draining(NODE, waiting))
    ((_, event),) = api.events.items()
    assert event["count"] == 3
    assert event["message"] == "Failed to drain node, 3 pods are waiting to be evicted"


async def test_an_event_deleted_on_the_server_is_written_anew():
    api, clock = FakeEventsApi(), Clock()
    rec = recorder(api, clock, dedupe_override=timedelta(0))
    await rec.record(events.disruption_terminating(NODE, "Drifted"))
    api.events.clear()  # Events expire on a real API server
    assert await rec.record(events.disruption_terminating(NODE, "Drifted")) == "created"
    ((_, event),) = api.events.items()
    assert event["count"] == 1


async def test_one_object_gets_25_events_then_one_per_five_minutes_others_are_not_affected():
    api, clock = FakeEventsApi(), Clock()
    rec = recorder(api, clock)
    outcomes = [await rec.record(events.unconsolidatable(NODE, f"reason {i}")) for i in range(26)]
    assert outcomes.count("created") == 25 and outcomes[-1] == "rate_limited"
    other = {"metadata": {"name": "ip-10-0-0-2", "uid": "node-uid-2"}}
    assert await rec.record(events.unconsolidatable(other, "reason 0")) == "created"
    clock.now += events.SPAM_REFILL_SECONDS
    assert await rec.record(events.unconsolidatable(NODE, "reason 26")) == "created"
    assert await rec.record(events.unconsolidatable(NODE, "reason 27")) == "rate_limited"


async def test_an_api_failure_is_counted_never_raised():
    api, clock = FakeEventsApi(), Clock()
    api.fail_with = KubeError(403, "Forbidden", '{"message": "events is forbidden"}')
    failed = metrics.EVENTS.labels(reason="FailedTermination", outcome="failed")
    before = failed._value.get()
    outcome = await recorder(api, clock).record(events.failed_termination(NODE, "terminate", "boom"))
    assert outcome == "failed"
    assert failed._value.get() == before + 1


class BrokenOnOneNode(EventRecorder):
    """A recorder that raises for one node: whatever escapes a recorder (a bug, a metrics failure)."""

    def __init__(self, api: FakeEventsApi, broken: str) -> None:
        super().__init__(api, host="worker-1", clock=Clock())  # type: ignore[arg-type]
        self.broken = broken

    async def record(self, event: events.Event) -> events.Outcome:
        if event.on.name == self.broken:
            raise RuntimeError("recorder bug")
        return await super().record(event)


async def test_record_all_logs_a_failed_event_and_still_records_the_others(caplog: pytest.LogCaptureFixture):
    api = FakeEventsApi()
    candidates = [NodeRef(node="ip-10-0-0-1", uid="uid-1"), NodeRef(node="ip-10-0-0-2", uid="uid-2")]
    batch = [events.disruption_waiting_readiness(ref, "i-0abc") for ref in events.refs(candidates)]
    with caplog.at_level(logging.WARNING, logger="kube.events"):
        await events.record_all(BrokenOnOneNode(api, broken="ip-10-0-0-1"), batch)  # does not raise
    assert [e["involvedObject"]["uid"] for e in api.events.values()] == ["uid-2"]
    failed = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
    assert failed == [
        "event DisruptionWaitingReadiness on Node ip-10-0-0-1 not recorded: RuntimeError('recorder bug')"
    ]


def test_refs_pin_each_candidate_to_its_uid():
    refs = events.refs([NodeRef(node="a", uid="uid-a"), NodeRef(node="b")])
    assert refs == [events.ObjectRef("Node", "a", uid="uid-a"), events.ObjectRef("Node", "b")]


def test_every_reason_has_a_catalog_entry_and_karpenters_names_are_kept():
    assert set(CATALOG) == set(Reason)
    karpenter = {r.value for r, info in CATALOG.items() if info.karpenter}
    assert {
        "DisruptionBlocked",
        "Unconsolidatable",
        "DisruptionLaunching",
        "DisruptionWaitingReadiness",
        "DisruptionTerminating",
        "Disrupted",
        "Evicted",
        "FailedDraining",
        "TerminationGracePeriodExpiring",
        "FailedTermination",
        "NodeRepairBlocked",
        "SpotInterrupted",
        "CapacityReservationInstanceInterrupted",
        "SpotRebalanceRecommendation",
        "InstanceStopping",
        "InstanceTerminating",
        "InstanceUnhealthy",
    } == karpenter


def test_each_interruption_kind_maps_to_karpenters_reason():
    kinds = {
        "SpotInterruption": "SpotInterrupted",
        "CapacityReservationInterruption": "CapacityReservationInstanceInterrupted",
        "RebalanceRecommendation": "SpotRebalanceRecommendation",
        "StateChange:stopping": "InstanceStopping",
        "StateChange:terminating": "InstanceTerminating",
        "ScheduledChange": "InstanceUnhealthy",
    }
    for kind, reason in kinds.items():
        event = events.interruption(NODE, kind)
        assert event is not None and event.reason == reason, kind
    assert events.interruption(NODE, "Unknown") is None


async def test_a_pass_larger_than_the_default_memory_aggregates_its_events_the_next_pass():
    """Issue 34: 5,000 nodes held back, each pass; an LRU of 4,096 forgot the start of a pass before its
    end, so every Event of the next pass was a new one (5,000 POSTs a pass, not PATCHes)."""
    api, clock = FakeEventsApi(), Clock()
    batches = events.EventBatches(
        recorder(api, clock, dedupe_override=timedelta(0), burst=10), concurrency=64
    )
    batch = [
        events.disruption_blocked({"metadata": {"name": f"n{i}", "uid": f"u{i}"}}, "a pod blocks it")
        for i in range(5000)
    ]
    for _ in range(2):
        assert batches.submit(batch)
        await batches.wait()
        clock.now += 10
    posts = sum(1 for method, _ in api.calls if method == "POST")
    patches = sum(1 for method, _ in api.calls if method == "PATCH")
    assert (posts, patches) == (5000, 5000)


async def test_an_entry_older_than_an_event_lives_is_forgotten():
    api, clock = FakeEventsApi(), Clock()
    rec = recorder(api, clock, dedupe_override=timedelta(0))
    await rec.record(events.disruption_blocked(NODE, "a pod blocks it"))
    clock.now += events.EVENT_TTL_SECONDS + 1
    await rec.record(events.disruption_blocked({"metadata": {"name": "other", "uid": "u2"}}, "x"))
    assert len(rec._written) == 1  # the first one's Event expired on the server: not remembered


async def test_a_held_back_node_keeps_one_event_whose_words_follow_the_pass() -> None:
    """A node held back by a budget whose numbers move every pass: before issue 34 each new text was a
    new Event (a POST a pass per waiting node); now one Event per node and reason, counted after
    Karpenter's two minutes with the latest words."""
    api, clock = FakeEventsApi(), Clock()
    rec = recorder(api, clock)

    def used_up(disrupting: int) -> events.Event:
        text = f"nodepool wave budget for Drifted is used up (5 allowed: {disrupting} already disrupting)"
        return events.held_back(NODE, Reason.DISRUPTION_BLOCKED, f"Cannot disrupt Node: {text}")

    assert await rec.record(used_up(5)) == "created"
    clock.now += 60
    assert await rec.record(used_up(4)) == "deduplicated"  # Karpenter's node window is 2 minutes
    clock.now += 61
    assert await rec.record(used_up(3)) == "aggregated"
    ((_, event),) = api.events.items()
    assert event["count"] == 2 and "3 already disrupting" in event["message"]
    # the NodePool's budget Event keeps its minute (Karpenter's NodePoolBlocked)
    pool = {"metadata": {"name": "wave", "uid": "pool-uid"}}
    assert await rec.record(events.nodepool_budget_blocked(pool, "Drifted")) == "created"
    clock.now += 61
    assert await rec.record(events.nodepool_budget_blocked(pool, "Drifted")) == "aggregated"
