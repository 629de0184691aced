"""The workflow tests' world (stack, dev server, worker) plus an SQS queue fed by EventBridge rules."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest

from api.interruption_events import EVENT_RULES
from tests.integration.workflows.conftest import (  # noqa: F401 - fixtures
    dev_client,
    karpflow,
    make_sim_stack,
    pytest_configure,
    temporal_address,
    worker_identity_objects,
)


@dataclass
class Queue:
    sqs: Any
    events: Any
    name: str
    url: str

    def put_spot_interruption(self, instance_id: str, when: datetime | None = None) -> None:
        """Through EventBridge, routed to the queue by the rule, as AWS does it."""
        result = self.events.put_events(
            Entries=[
                {
                    "Source": "aws.ec2",
                    "DetailType": "EC2 Spot Instance Interruption Warning",
                    "Detail": json.dumps({"instance-id": instance_id, "instance-action": "terminate"}),
                    "Resources": [f"arn:aws:ec2:us-west-2:123456789012:instance/{instance_id}"],
                    "Time": when or datetime.now(UTC),
                }
            ]
        )
        assert result["FailedEntryCount"] == 0

    def put_rebalance_recommendation(self, instance_id: str, when: datetime | None = None) -> None:
        result = self.events.put_events(
            Entries=[
                {
                    "Source": "aws.ec2",
                    "DetailType": "EC2 Instance Rebalance Recommendation",
                    "Detail": json.dumps({"instance-id": instance_id}),
                    "Resources": [f"arn:aws:ec2:us-west-2:123456789012:instance/{instance_id}"],
                    "Time": when or datetime.now(UTC),
                }
            ]
        )
        assert result["FailedEntryCount"] == 0

    def send(self, body: str) -> None:
        self.sqs.send_message(QueueUrl=self.url, MessageBody=body)

    def depth(self) -> int:
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=self.url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"]
        )


def make_queue(endpoint: str, region: str, visibility_timeout: int = 2) -> Queue:
    sqs = boto3.client("sqs", region_name=region, endpoint_url=endpoint)
    events = boto3.client("events", region_name=region, endpoint_url=endpoint)
    name = f"karpflow-it-{uuid.uuid4().hex[:8]}"
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": str(visibility_timeout)})[
        "QueueUrl"
    ]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for rule, pattern in EVENT_RULES.items():
        rule_name = f"{rule}-{name}"
        events.put_rule(Name=rule_name, EventPattern=json.dumps(pattern), State="ENABLED")
        events.put_targets(Rule=rule_name, Targets=[{"Id": "queue", "Arn": arn}])
    return Queue(sqs, events, name, url)


@pytest.fixture
def queue(karpflow, monkeypatch) -> Iterator[Queue]:  # noqa: F811
    # The in-process worker builds its SQS client from the standard credential chain.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    q = make_queue(karpflow.stack.ec2_endpoint, karpflow.stack.region)
    yield q
    for rule in EVENT_RULES:
        rule_name = f"{rule}-{q.name}"
        q.events.remove_targets(Rule=rule_name, Ids=["queue"])
        q.events.delete_rule(Name=rule_name)
    q.sqs.delete_queue(QueueUrl=q.url)
