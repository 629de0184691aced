"""An interruptible capacity reservation reclaiming its instance, two minutes ahead: read, and acted on
as a spot interruption is (aws/karpenter-provider-aws pkg/controllers/interruption/suite_test.go
It "should delete the NodeClaim when receiving a capacity reservation interruption warning" and
It "should mark the capacity reservation as unavailable when getting an interruption warning").
Temporal and the API server are faked at their boundary, as in test_interruption_duplicates.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api.controller_io import OfferingUnavailable
from api.interruption_events import EVENT_RULES, parse_message
from api.workflow_io import DisruptionInput
from cluster.interruption import InterruptionPoller
from kube import events
from sim.interruption_messages import entry, envelope

INSTANCE = "i-0123456789abcdef0"
WHEN = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NODE = {
    "kind": "Node",
    "metadata": {
        "name": "gpu-1",
        "uid": "uid-gpu-1",
        "labels": {
            "karpenter.sh/nodepool": "gpu",
            "node.kubernetes.io/instance-type": "p5.48xlarge",
            "topology.kubernetes.io/zone": "us-west-2a",
            "karpenter.sh/capacity-type": "reserved",
            "karpenter.k8s.aws/capacity-reservation-id": "cr-0iodcr",
            "karpenter.k8s.aws/capacity-reservation-interruptible": "true",
        },
    },
    "spec": {"providerID": f"aws:///us-west-2a/{INSTANCE}"},
}


def test_the_warning_is_read_with_karpenters_detail_type():
    # messages/capacityreservationinterruption/parser.go: aws.ec2, version 0,
    # "EC2 Capacity Reservation Instance Interruption Warning", detail instance-id
    event = parse_message(envelope("capacity-reservation", INSTANCE, region="us-west-2", when=WHEN))
    assert (event.kind, event.instance_ids, event.time) == (
        "CapacityReservationInterruption",
        [INSTANCE],
        WHEN,
    )
    sent = entry("capacity-reservation", INSTANCE, region="us-west-2", when=WHEN)
    assert any(sent["DetailType"] in rule["detail-type"] for rule in EVENT_RULES.values())
    # Karpenter's Event for it (interruption/events/events.go CapacityReservationInstanceInterrupted)
    recorded = events.interruption(NODE, "CapacityReservationInterruption")
    assert recorded is not None and recorded.reason == "CapacityReservationInstanceInterrupted"


class FakeKube:
    async def list_nodes(self) -> dict[str, Any]:
        return {"items": [NODE]}


class FakeHandle:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    async def signal(self, _name: str, value: Any) -> None:
        self.client.signals.append(value)


class FakeClient:
    def __init__(self) -> None:
        self.started: list[tuple[str, Any, str]] = []
        self.signals: list[Any] = []

    async def start_workflow(self, workflow: str, value: Any, *, id: str, **_: Any) -> Any:
        self.started.append((workflow, value, id))
        return None

    def get_workflow_handle(self, _id: str) -> FakeHandle:
        return FakeHandle(self)


@pytest.fixture(autouse=True)
def _no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(InterruptionPoller, "_record_event", nothing)


async def test_the_node_is_drained_and_replaced_before_its_two_minutes_and_the_reservation_marked_gone():
    client = FakeClient()
    poller = InterruptionPoller(None, "queue", FakeKube(), client, "tq", "c1")  # type: ignore[arg-type]
    now = datetime.now(UTC)
    body = envelope("capacity-reservation", INSTANCE, region="us-west-2", when=now)
    await poller.handle({"MessageId": "m-1", "Body": body})
    ((workflow, command, workflow_id),) = client.started
    assert (
        workflow == "DisruptionWorkflow" and workflow_id == f"interruption/c1/{INSTANCE}/capacity-reservation"
    )
    assert isinstance(command, DisruptionInput)
    assert command.reason == "Interrupted" and command.nodes == ["gpu-1"]
    assert command.termination_deadline is not None
    assert abs(
        command.termination_deadline - (now.replace(microsecond=0) + timedelta(minutes=2))
    ) < timedelta(seconds=1)
    # Without a view of the cluster: the same type in the same zone, on-demand (not the reservation).
    (spec,) = command.replacements
    assert [(o.instance_type, o.capacity_type) for o in spec.offerings] == [("p5.48xlarge", "on-demand")]
    # The reclaimed offering (reserved, this type and zone) is unavailable to the controller's passes.
    (signal,) = client.signals
    assert isinstance(signal, OfferingUnavailable)
    assert (signal.instance_type, signal.zone, signal.capacity_type) == (
        "p5.48xlarge",
        "us-west-2a",
        "reserved",
    )
    # A repeat starts nothing.
    await poller.handle({"MessageId": "m-2", "Body": body})
    assert len(client.started) == 1


def test_the_interruption_warning_as_ec2s_user_guide_spells_it_is_read_too():
    # EC2 user guide "Monitor interruptible Capacity Reservations": "EC2 Interruptible Capacity
    # Reservation Instance Interruption Warning" (Karpenter's parser names it without "Interruptible")
    body = json.loads(envelope("capacity-reservation", INSTANCE, region="us-west-2", when=WHEN))
    body["detail-type"] = "EC2 Interruptible Capacity Reservation Instance Interruption Warning"
    assert parse_message(json.dumps(body)).kind == "CapacityReservationInterruption"
    assert any(body["detail-type"] in rule["detail-type"] for rule in EVENT_RULES.values())


class TwoNodes(FakeKube):
    async def list_nodes(self) -> dict[str, Any]:
        block = json.loads(json.dumps(NODE))
        block["metadata"]["labels"]["karpenter.k8s.aws/capacity-reservation-id"] = "cr-0block"
        block["metadata"]["labels"]["karpenter.k8s.aws/capacity-reservation-type"] = "capacity-block"
        other = json.loads(json.dumps(NODE))
        other["metadata"].update(name="gpu-2", uid="uid-gpu-2")
        other["spec"]["providerID"] = "aws:///us-west-2a/i-0fedcba9876543210"
        return {"items": [block, other]}


async def test_a_capacity_blocks_expiration_drains_its_nodes_before_ec2_terminates_them():
    # capacityreservation/expiration/suite_test.go It "should delete nodeclaims associated with expiring
    # capacity-block reservations" and It "should not delete nodeclaims associated with standard capacity
    # reservations ...": only the block's node goes, ten minutes before EC2 begins terminating it.
    client = FakeClient()
    poller = InterruptionPoller(None, "queue", TwoNodes(), client, "tq", "c1")  # type: ignore[arg-type]
    now = datetime.now(UTC)
    body = envelope("capacity-block-expiration", "", region="us-west-2", when=now, reservation_id="cr-0block")
    await poller.handle({"MessageId": "m-1", "Body": body})
    ((_workflow, command, workflow_id),) = client.started
    assert workflow_id == f"interruption/c1/{INSTANCE}/capacity-block-expiration"
    assert command.nodes == ["gpu-1"] and command.reason == "Interrupted"
    assert command.termination_deadline is not None
    expected = now.replace(microsecond=0) + timedelta(minutes=10)
    assert abs(command.termination_deadline - expected) < timedelta(seconds=1)
