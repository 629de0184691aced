"""The EventBridge envelope, dispatched on source, detail-type and version."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from api.interruption_events import UnparseableMessage, parse_message
from cluster.interruption import fallback_replacement, instance_id_of

ROOT = Path(__file__).resolve().parents[2]


def envelope(source: str, detail_type: str, detail: dict, version: str = "0") -> str:
    return json.dumps(
        {
            "version": version,
            "id": "e-1",
            "detail-type": detail_type,
            "source": source,
            "account": "123456789012",
            "time": "2026-11-24T20:00:00Z",
            "region": "us-west-2",
            "resources": [],
            "detail": detail,
        }
    )


def test_spot_interruption_warning():
    event = parse_message(
        envelope(
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            {"instance-id": "i-1", "instance-action": "terminate"},
        )
    )
    assert (event.kind, event.instance_ids, event.event_id) == ("SpotInterruption", ["i-1"], "e-1")
    assert event.time.isoformat() == "2026-11-24T20:00:00+00:00"


def test_rebalance_recommendation():
    event = parse_message(
        envelope("aws.ec2", "EC2 Instance Rebalance Recommendation", {"instance-id": "i-2"})
    )
    assert (event.kind, event.instance_ids) == ("RebalanceRecommendation", ["i-2"])


@pytest.mark.parametrize("state", ["stopping", "stopped", "shutting-down", "terminated"])
def test_leaving_state_changes(state):
    event = parse_message(
        envelope("aws.ec2", "EC2 Instance State-change Notification", {"instance-id": "i-3", "state": state})
    )
    assert (event.kind, event.instance_ids, event.state) == ("StateChange", ["i-3"], state)


def test_running_is_not_acted_on():
    body = envelope(
        "aws.ec2", "EC2 Instance State-change Notification", {"instance-id": "i-3", "state": "running"}
    )
    assert parse_message(body).kind == "Unknown"


def test_health_scheduled_change_names_its_affected_instances():
    detail = {
        "service": "EC2",
        "eventTypeCategory": "scheduledChange",
        "eventTypeCode": "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED",
        "affectedEntities": [{"entityValue": "i-4"}, {"entityValue": "i-5"}, {"entityValue": "vol-1"}],
    }
    event = parse_message(envelope("aws.health", "AWS Health Event", detail))
    assert (event.kind, event.instance_ids) == ("ScheduledChange", ["i-4", "i-5"])
    other = parse_message(
        envelope("aws.health", "AWS Health Event", {**detail, "eventTypeCategory": "issue"})
    )
    assert other.kind == "Unknown"


def test_unknown_kinds_and_versions():
    assert parse_message(envelope("aws.ec2", "EC2 AMI State Change", {})).kind == "Unknown"
    spot = {"instance-id": "i-1"}
    assert (
        parse_message(envelope("aws.ec2", "EC2 Spot Instance Interruption Warning", spot, "1")).kind
        == "Unknown"
    )


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        "[]",
        json.dumps({"id": "x"}),
        envelope("aws.ec2", "EC2 Spot Instance Interruption Warning", {"no-instance": True}),
    ],
)
def test_unparseable(body):
    with pytest.raises(UnparseableMessage):
        parse_message(body)


def test_node_helpers():
    node = {
        "metadata": {
            "labels": {
                "karpenter.sh/nodepool": "default",
                "node.kubernetes.io/instance-type": "m5.large",
                "karpenter.sh/capacity-type": "spot",
                "topology.kubernetes.io/zone": "us-west-2a",
            }
        },
        "spec": {"providerID": "aws:///us-west-2a/i-0abc"},
    }
    assert instance_id_of(node) == "i-0abc"
    assert instance_id_of({"spec": {"providerID": "kind://x/y"}}) is None
    # Without the informer cache: the same type and zone (zone-pinned pods can follow), on-demand,
    # never the spot offering being reclaimed.
    spec = fallback_replacement(node)
    assert spec.nodepool == "default"
    assert [o.key for o in spec.offering_order([])] == ["m5.large/us-west-2a/on-demand"]


def test_the_iam_policy_grants_every_sqs_call_the_poller_makes():
    source = (ROOT / "cluster" / "interruption.py").read_text()
    calls = set(re.findall(r"_sqs\(\s*\"(\w+)\"", source))
    actions = {"sqs:" + "".join(part.title() for part in call.split("_")) for call in calls}
    policy = json.loads((ROOT / "deploy" / "iam-policy.json").read_text())
    granted = set()
    for statement in policy["Statement"]:
        listed = statement["Action"]
        granted.update([listed] if isinstance(listed, str) else listed)
    assert calls >= {"receive_message", "delete_message", "get_queue_url"}
    assert actions <= granted, sorted(actions - granted)


def test_the_rebalance_opt_in_is_a_known_karpflow_annotation():
    """The planner fails a pool closed on unknown karpflow.dev/* annotations: the opt-in must not."""
    from api.karpflow_overrides import read_overrides
    from cluster.interruption import REBALANCE_ANNOTATION

    overrides, problems = read_overrides({REBALANCE_ANNOTATION: "true"})
    assert overrides.rebalance_replace is True and problems == []
    assert read_overrides({REBALANCE_ANNOTATION: "yes"})[1]


def test_workflows_started_outside_the_controller_are_searchable_from_the_start():
    from api import search_attributes as sa

    attributes = sa.at_start(["ip-10-0-1-7"], "Interrupted", "default")
    assert attributes.get(sa.NODES) == ["ip-10-0-1-7"] and attributes.get(sa.REASON) == "Interrupted"
    assert attributes.get(sa.NODEPOOL) == "default"
    assert sa.at_start(["n"], "Manual").get(sa.NODEPOOL) is None
