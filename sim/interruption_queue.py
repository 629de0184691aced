"""The dev stack's interruption queue: an SQS queue in moto fed by the EventBridge rules AWS users
create for Karpenter/karpflow (api/interruption_events.EVENT_RULES). Idempotent: `up` runs it again."""

from __future__ import annotations

import json
from typing import Any

import boto3

from api.interruption_events import EVENT_RULES

MOTO_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def ensure_interruption_queue(endpoint: str, region: str, name: str) -> str:
    """Create the queue and the rules routing EC2/Health events to it; return the queue URL."""
    sqs: Any = boto3.client("sqs", endpoint_url=endpoint, region_name=region, **MOTO_KEYS)
    events: Any = boto3.client("events", endpoint_url=endpoint, region_name=region, **MOTO_KEYS)
    # 300 s retention is what Karpenter's CloudFormation template sets: older warnings are useless.
    url = sqs.create_queue(QueueName=name, Attributes={"MessageRetentionPeriod": "300"})["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for rule, pattern in EVENT_RULES.items():
        events.put_rule(Name=f"{name}-{rule}", EventPattern=json.dumps(pattern), State="ENABLED")
        events.put_targets(Rule=f"{name}-{rule}", Targets=[{"Id": "interruption-queue", "Arn": arn}])
    return url
