"""The EventBridge events EC2 and AWS Health send about an instance, as `karpflow sim interrupt`
sends them (docs/interruption.md; what karpflow reads: api/interruption_events.py; Karpenter's
parsers: aws/karpenter-provider-aws pkg/controllers/interruption/messages/).

    entry("spot", "i-0abc", region="us-west-2")      # a PutEvents entry, for EventBridge
    envelope("spot", "i-0abc", region="us-west-2")   # the body a rule delivers to the SQS queue

Kinds:
    spot              aws.ec2 "EC2 Spot Instance Interruption Warning", instance-action terminate
    capacity-reservation  aws.ec2 "EC2 Capacity Reservation Instance Interruption Warning" (an
                      interruptible capacity reservation reclaiming the instance), instance-action
                      terminate
    capacity-block-expiration  aws.ec2 "Capacity Block Reservation Expiration Warning" (forty
                      minutes before the block ends), naming the reservation (detail
                      capacity-reservation-id, end-date): pass `reservation_id`
    rebalance         aws.ec2 "EC2 Instance Rebalance Recommendation"
    stopping          aws.ec2 "EC2 Instance State-change Notification", state stopping
    scheduled-change  aws.health "AWS Health Event", service EC2, category scheduledChange
                      (instance retirement), the instance among its affected entities
    health            aws.health "AWS Health Event", service EC2, category issue (a degraded
                      instance store): what neither Karpenter nor karpflow acts on
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, get_args

Kind = Literal[
    "spot",
    "capacity-reservation",
    "capacity-block-expiration",
    "rebalance",
    "scheduled-change",
    "stopping",
    "health",
]
BLOCK_EXPIRY_NOTICE = timedelta(minutes=40)  # the warning comes forty minutes before the block's end
KINDS: tuple[str, ...] = get_args(Kind)
ACCOUNT = "123456789012"  # moto's default account
HEALTH_CODES = {
    "scheduled-change": ("scheduledChange", "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"),
    "health": ("issue", "AWS_EC2_INSTANCE_STORE_DRIVE_PERFORMANCE_DEGRADED"),
}


def _stamp(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _health_detail(kind: str, instance_id: str, region: str, when: datetime) -> dict[str, Any]:
    category, code = HEALTH_CODES[kind]
    start = when + timedelta(days=14) if category == "scheduledChange" else when
    return {
        "eventArn": f"arn:aws:health:{region}::event/EC2/{code}/{code}_{uuid.uuid4().hex[:12].upper()}",
        "service": "EC2",
        "eventScopeCode": "ACCOUNT_SPECIFIC",
        "eventTypeCode": code,
        "eventTypeCategory": category,
        "eventRegion": region,
        "startTime": start.strftime("%a, %d %b %Y %H:%M:%S GMT"),
        "statusCode": "upcoming" if category == "scheduledChange" else "open",
        "eventDescription": [{"language": "en_US", "latestDescription": f"{code} for {instance_id}"}],
        "affectedEntities": [{"entityValue": instance_id}],
        "affectedAccount": ACCOUNT,
    }


def source_and_detail(
    kind: str, instance_id: str, region: str, when: datetime, reservation_id: str | None = None
) -> tuple[str, str, dict[str, Any]]:
    """(source, detail-type, detail) of the event `kind` about `instance_id` (or, for a capacity
    block's expiration, about `reservation_id`)."""
    if kind == "spot":
        return (
            "aws.ec2",
            "EC2 Spot Instance Interruption Warning",
            {
                "instance-id": instance_id,
                "instance-action": "terminate",
            },
        )
    if kind == "capacity-reservation":
        return (
            "aws.ec2",
            "EC2 Capacity Reservation Instance Interruption Warning",
            {"instance-id": instance_id, "instance-action": "terminate"},
        )
    if kind == "capacity-block-expiration":
        if not reservation_id:
            raise ValueError(
                "a capacity block's expiration warning names its reservation: give reservation_id"
            )
        end = when + BLOCK_EXPIRY_NOTICE
        return (
            "aws.ec2",
            "Capacity Block Reservation Expiration Warning",
            {"capacity-reservation-id": reservation_id, "end-date": _stamp(end)},
        )
    if kind == "rebalance":
        return "aws.ec2", "EC2 Instance Rebalance Recommendation", {"instance-id": instance_id}
    if kind == "stopping":
        return (
            "aws.ec2",
            "EC2 Instance State-change Notification",
            {
                "instance-id": instance_id,
                "state": "stopping",
            },
        )
    if kind in HEALTH_CODES:
        return "aws.health", "AWS Health Event", _health_detail(kind, instance_id, region, when)
    raise ValueError(f"unknown interruption kind {kind!r}; choose from {', '.join(KINDS)}")


def instance_arn(instance_id: str, region: str) -> str:
    return f"arn:aws:ec2:{region}:{ACCOUNT}:instance/{instance_id}"


def _resources(instance_id: str, region: str, reservation_id: str | None) -> list[str]:
    if reservation_id:  # a capacity block's events name the reservation (its ARN)
        return [f"arn:aws:ec2:{region}:{ACCOUNT}:capacity-reservation/{reservation_id}"]
    return [instance_arn(instance_id, region)]


def entry(
    kind: str,
    instance_id: str,
    *,
    region: str,
    when: datetime | None = None,
    reservation_id: str | None = None,
) -> dict[str, Any]:
    """The PutEvents entry that makes EventBridge deliver the event to the queue's rules."""
    when = when or datetime.now(UTC)
    source, detail_type, detail = source_and_detail(kind, instance_id, region, when, reservation_id)
    return {
        "Source": source,
        "DetailType": detail_type,
        "Detail": json.dumps(detail),
        "Resources": _resources(
            instance_id, region, reservation_id if kind == "capacity-block-expiration" else None
        ),
        "Time": when,
    }


def envelope(
    kind: str,
    instance_id: str,
    *,
    region: str,
    when: datetime | None = None,
    reservation_id: str | None = None,
) -> str:
    """The message body an EventBridge rule delivers to SQS (version 0 envelope)."""
    when = when or datetime.now(UTC)
    source, detail_type, detail = source_and_detail(kind, instance_id, region, when, reservation_id)
    block = reservation_id if kind == "capacity-block-expiration" else None
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": source,
            "account": ACCOUNT,
            "time": _stamp(when),
            "region": region,
            "resources": _resources(instance_id, region, block),
            "detail": detail,
        }
    )
