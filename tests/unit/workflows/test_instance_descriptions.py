"""The planning activity's view of the managed nodes' instances (activities/instance_descriptions.py),
against moto: described once, again after the TTL, and a failing EC2 reported rather than fatal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from activities.instance_descriptions import InstanceDescriptions
from planner.snapshot import Snapshot


@pytest.fixture
def ec2() -> Iterator[Any]:
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


def launch(ec2: Any, count: int) -> list[str]:
    images = ec2.describe_images(Owners=["amazon"])["Images"]
    response = ec2.run_instances(ImageId=images[0]["ImageId"], MinCount=count, MaxCount=count)
    return [i["InstanceId"] for i in response["Instances"]]


class Counting:
    """The EC2 client, counting the DescribeInstances pages it serves (and failing when told)."""

    def __init__(self, ec2: Any) -> None:
        self.ec2, self.pages, self.fail = ec2, 0, False

    def get_paginator(self, name: str) -> Any:
        outer, real = self, self.ec2.get_paginator(name)

        class Paginator:
            def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
                if outer.fail:
                    raise ClientError(
                        {"Error": {"Code": "UnauthorizedOperation", "Message": "no"}}, "Describe"
                    )
                for page in real.paginate(**kwargs):
                    outer.pages += 1
                    yield page

        return Paginator()


async def test_instances_are_described_once_within_the_ttl_and_linked_to_their_nodes(ec2):
    ids = launch(ec2, 3)
    client = Counting(ec2)
    descriptions = InstanceDescriptions(client, ttl_seconds=300)
    found, problem = await descriptions.describe([*ids, "i-0000000000000dead"])
    assert problem is None and sorted(i["InstanceId"] for i in found) == sorted(ids)
    assert {i["ImageId"] for i in found} and all(
        i["SubnetId"] and i["SecurityGroups"] is not None for i in found
    )
    pages = client.pages
    again, _ = await descriptions.describe(ids)
    assert client.pages == pages and len(again) == 3  # cached, the unknown id too
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1"},
        "spec": {"providerID": f"aws:///us-west-2a/{ids[0]}"},
    }
    snapshot = Snapshot.from_objects([node], instances=found)
    assert snapshot.nodes["n1"].instance.image_id == next(
        i["ImageId"] for i in found if i["InstanceId"] == ids[0]
    )


async def test_described_again_after_the_ttl(ec2):
    ids = launch(ec2, 1)
    client = Counting(ec2)
    descriptions = InstanceDescriptions(client, ttl_seconds=0)
    await descriptions.describe(ids)
    pages = client.pages
    await descriptions.describe(ids)
    assert client.pages > pages


async def test_when_ec2_cannot_be_asked_the_last_descriptions_stand_and_the_pass_says_so(ec2):
    ids = launch(ec2, 2)
    client = Counting(ec2)
    descriptions = InstanceDescriptions(client, ttl_seconds=0)
    first, _ = await descriptions.describe(ids)
    client.fail = True
    found, problem = await descriptions.describe(ids)
    assert found == first
    assert problem is not None and "UnauthorizedOperation" in problem and "drift by AMI" in problem
