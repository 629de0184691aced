"""`karpflow sim interrupt`'s events: each is what karpflow's reader (api/interruption_events.py)
and Karpenter's parsers (aws/karpenter-provider-aws pkg/controllers/interruption/messages/) take it
for, and matches the EventBridge rule that routes it to the queue."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from api.interruption_events import EVENT_RULES, parse_message
from sim.interruption_messages import KINDS, entry, envelope

WHEN = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kind", "read_as", "state"),
    [
        ("spot", "SpotInterruption", None),
        ("capacity-reservation", "CapacityReservationInterruption", None),
        ("rebalance", "RebalanceRecommendation", None),
        ("stopping", "StateChange", "stopping"),
        ("scheduled-change", "ScheduledChange", None),
        ("health", "Unknown", None),  # an AWS Health issue: nobody acts on it
    ],
)
def test_each_kind_reads_as_karpflow_reads_it(kind, read_as, state):
    event = parse_message(envelope(kind, "i-0123456789abcdef0", region="us-west-2", when=WHEN))
    assert (event.kind, event.state) == (read_as, state)
    assert event.time == WHEN
    if read_as != "Unknown":
        assert event.instance_ids == ["i-0123456789abcdef0"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_entry_matches_an_interruption_rule_and_names_its_instance(kind):
    block = "cr-0block" if kind == "capacity-block-expiration" else None
    sent = entry(kind, "i-0123456789abcdef0", region="eu-west-1", when=WHEN, reservation_id=block)
    assert any(
        sent["Source"] in rule["source"] and sent["DetailType"] in rule["detail-type"]
        for rule in EVENT_RULES.values()
    )
    if block:  # a capacity block's warning names the reservation (EC2 user guide's example)
        assert sent["Resources"] == ["arn:aws:ec2:eu-west-1:123456789012:capacity-reservation/cr-0block"]
    else:
        assert sent["Resources"] == ["arn:aws:ec2:eu-west-1:123456789012:instance/i-0123456789abcdef0"]
    body = json.loads(
        envelope(kind, "i-0123456789abcdef0", region="eu-west-1", when=WHEN, reservation_id=block)
    )
    assert (body["source"], body["detail-type"], json.loads(sent["Detail"]).keys()) == (
        sent["Source"],
        sent["DetailType"],
        body["detail"].keys(),
    )


def test_a_capacity_block_expiration_names_its_reservation():
    event = parse_message(
        envelope("capacity-block-expiration", "", region="us-west-2", when=WHEN, reservation_id="cr-0block")
    )
    assert (event.kind, event.reservation_id, event.instance_ids) == (
        "CapacityBlockExpiration",
        "cr-0block",
        [],
    )
    with pytest.raises(ValueError, match="names its reservation"):
        entry("capacity-block-expiration", "i-1", region="us-west-2")


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown interruption kind"):
        entry("meteor", "i-1", region="us-west-2")
