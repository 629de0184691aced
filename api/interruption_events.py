"""The EventBridge events karpflow reads from its interruption queue (docs/interruption.md).

Every message body is an EventBridge envelope; what it means is decided by (source, detail-type) and
the envelope version, as in Karpenter's and Node Termination Handler's queue mode. `parse_message`
turns a body into one `Interruption` or raises `UnparseableMessage` (logged and deleted by the poller);
a well-formed event of a kind karpflow does not act on comes back with kind "Unknown".
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationError

Kind = Literal[
    "SpotInterruption",
    "CapacityReservationInterruption",
    "CapacityBlockExpiration",
    "RebalanceRecommendation",
    "StateChange",
    "ScheduledChange",
    "Unknown",
]
# An interruptible capacity reservation's instance being reclaimed, two minutes ahead (Karpenter's
# AWS provider, pkg/controllers/interruption/messages/capacityreservationinterruption: schema
# aws.ec2@EC2CapacityReservationInstanceInterruptionWarning, detail instance-id and instance-action).
CAPACITY_RESERVATION_INTERRUPTION = "EC2 Capacity Reservation Instance Interruption Warning"
# The same warning as EC2's user guide spells it ("Monitor interruptible Capacity Reservations"):
# read too, since Karpenter's name and AWS's documented one differ.
INTERRUPTIBLE_RESERVATION_INTERRUPTION = (
    "EC2 Interruptible Capacity Reservation Instance Interruption Warning"
)
# Forty minutes before a capacity block ends (EC2 user guide, "Monitor Capacity Blocks using
# EventBridge"): its instances begin to terminate ten minutes later. It names the reservation
# (detail capacity-reservation-id), not the instances; Karpenter drains those nodes at the same time
# from its own reading (pkg/controllers/capacityreservation/expiration).
CAPACITY_BLOCK_EXPIRATION = "Capacity Block Reservation Expiration Warning"
# State changes that mean the instance is going away; "running"/"pending" are no-ops.
LEAVING_STATES = frozenset({"stopping", "stopped", "shutting-down", "terminated"})


class UnparseableMessage(ValueError):
    """The body is not an EventBridge envelope karpflow can read."""


class Envelope(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")

    version: str
    id: str
    detail_type: str = Field(alias="detail-type")
    source: str
    account: str = ""
    time: datetime
    region: str = ""
    resources: list[str] = Field(default_factory=list)
    detail: dict[str, Any] = Field(default_factory=dict)


class SpotInterruptionDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    instance_id: str = Field(alias="instance-id")
    instance_action: str = Field(default="terminate", alias="instance-action")


class RebalanceDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    instance_id: str = Field(alias="instance-id")


class CapacityBlockDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    reservation_id: str = Field(alias="capacity-reservation-id")


class StateChangeDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    instance_id: str = Field(alias="instance-id")
    state: str


class AffectedEntity(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    entity_value: str = Field(alias="entityValue")


class HealthDetail(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="allow")
    service: str = ""
    event_type_category: str = Field(default="", alias="eventTypeCategory")
    affected_entities: list[AffectedEntity] = Field(default_factory=list, alias="affectedEntities")


class Interruption(BaseModel):
    """What one message asks of karpflow: a kind, the instances it concerns and when it happened."""

    kind: Kind
    event_id: str
    time: datetime
    instance_ids: list[str] = Field(default_factory=list)
    state: str | None = None
    reservation_id: str | None = None  # CapacityBlockExpiration: the reservation whose nodes go
    description: str = ""


class _Common(TypedDict):
    """The fields every Interruption of one envelope shares."""

    event_id: str
    time: datetime
    description: str


def parse_message(body: str) -> Interruption:
    try:
        envelope = Envelope.model_validate(json.loads(body))
    except (ValueError, ValidationError) as err:
        raise UnparseableMessage(str(err).splitlines()[0]) from err
    key = (envelope.source, envelope.detail_type)
    base: _Common = {"event_id": envelope.id, "time": envelope.time, "description": f"{key[0]}/{key[1]}"}
    try:
        if envelope.version != "0":
            return Interruption(kind="Unknown", **base)
        if key == ("aws.ec2", "EC2 Spot Instance Interruption Warning"):
            spot = SpotInterruptionDetail.model_validate(envelope.detail)
            return Interruption(kind="SpotInterruption", instance_ids=[spot.instance_id], **base)
        if key == ("aws.ec2", CAPACITY_BLOCK_EXPIRATION):
            block = CapacityBlockDetail.model_validate(envelope.detail)
            return Interruption(kind="CapacityBlockExpiration", reservation_id=block.reservation_id, **base)
        if key in (
            ("aws.ec2", CAPACITY_RESERVATION_INTERRUPTION),
            ("aws.ec2", INTERRUPTIBLE_RESERVATION_INTERRUPTION),
        ):
            reclaimed = SpotInterruptionDetail.model_validate(envelope.detail)  # the same two fields
            return Interruption(
                kind="CapacityReservationInterruption", instance_ids=[reclaimed.instance_id], **base
            )
        if key == ("aws.ec2", "EC2 Instance Rebalance Recommendation"):
            rebalance = RebalanceDetail.model_validate(envelope.detail)
            return Interruption(kind="RebalanceRecommendation", instance_ids=[rebalance.instance_id], **base)
        if key == ("aws.ec2", "EC2 Instance State-change Notification"):
            change = StateChangeDetail.model_validate(envelope.detail)
            if change.state not in LEAVING_STATES:
                return Interruption(kind="Unknown", state=change.state, **base)
            return Interruption(
                kind="StateChange", instance_ids=[change.instance_id], state=change.state, **base
            )
        if key == ("aws.health", "AWS Health Event"):
            health = HealthDetail.model_validate(envelope.detail)
            if health.service != "EC2" or health.event_type_category != "scheduledChange":
                return Interruption(kind="Unknown", **base)
            ids = [e.entity_value for e in health.affected_entities if e.entity_value.startswith("i-")]
            return Interruption(kind="ScheduledChange", instance_ids=ids, **base)
    except ValidationError as err:
        raise UnparseableMessage(f"{key}: {str(err).splitlines()[0]}") from err
    return Interruption(kind="Unknown", **base)


# The EventBridge rules that route these events to the queue (devstack, deploy docs).
EVENT_RULES: dict[str, dict[str, Any]] = {
    "karpflow-spot-interruption": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Spot Instance Interruption Warning"],
    },
    "karpflow-capacity-reservation-interruption": {
        "source": ["aws.ec2"],
        "detail-type": [CAPACITY_RESERVATION_INTERRUPTION, INTERRUPTIBLE_RESERVATION_INTERRUPTION],
    },
    "karpflow-capacity-block-expiration": {"source": ["aws.ec2"], "detail-type": [CAPACITY_BLOCK_EXPIRATION]},
    "karpflow-rebalance": {"source": ["aws.ec2"], "detail-type": ["EC2 Instance Rebalance Recommendation"]},
    "karpflow-state-change": {
        "source": ["aws.ec2"],
        "detail-type": ["EC2 Instance State-change Notification"],
    },
    "karpflow-scheduled-change": {"source": ["aws.health"], "detail-type": ["AWS Health Event"]},
}
