"""The local stack's EC2 capacity reservations (sim/ec2_reservations.py), which moto lacks: checked
against what EC2's API reference says of DescribeCapacityReservations and a targeted RunInstances."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from sim import ec2_reservations

REGION = "us-west-2"


@pytest.fixture
def ec2() -> Iterator[Any]:
    ec2_reservations.install()
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def launch(ec2: Any, rid: str, instance_type: str = "m5.large", zone: str = "us-west-2a", **more: Any) -> Any:
    subnet = next(s["SubnetId"] for s in ec2.describe_subnets()["Subnets"] if s["AvailabilityZone"] == zone)
    return ec2.run_instances(
        ImageId="ami-12345678",
        InstanceType=instance_type,
        MinCount=1,
        MaxCount=1,
        SubnetId=subnet,
        CapacityReservationSpecification={"CapacityReservationTarget": {"CapacityReservationId": rid}},
        **more,
    )["Instances"][0]


def count(ec2: Any, rid: str) -> int:
    return ec2.describe_capacity_reservations(CapacityReservationIds=[rid])["CapacityReservations"][0][
        "AvailableInstanceCount"
    ]


def test_a_targeted_launch_takes_an_instance_of_the_reservation_and_a_termination_gives_it_back(ec2):
    r = ec2_reservations.add_reservation(REGION, "m5.large", "us-west-2a", 1)
    instance = launch(ec2, r.id)
    described = ec2.describe_instances(InstanceIds=[instance["InstanceId"]])["Reservations"][0]["Instances"][
        0
    ]
    assert described["CapacityReservationId"] == r.id and count(ec2, r.id) == 0
    with pytest.raises(ClientError, match="ReservationCapacityExceeded"):
        launch(ec2, r.id)
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    assert count(ec2, r.id) == 1


def test_a_launch_that_does_not_match_the_reservation_is_refused(ec2):
    r = ec2_reservations.add_reservation(REGION, "m5.large", "us-west-2a", 2)
    with pytest.raises(ClientError, match="InvalidParameterCombination"):
        launch(ec2, r.id, instance_type="m5.xlarge")
    with pytest.raises(ClientError, match="InvalidParameterCombination"):
        launch(ec2, r.id, zone="us-west-2b")
    block = ec2_reservations.add_reservation(
        REGION, "m5.large", "us-west-2a", 1, reservation_type="capacity-block"
    )
    with pytest.raises(ClientError, match="MarketType capacity-block"):
        launch(ec2, block.id)
    launch(ec2, block.id, InstanceMarketOptions={"MarketType": "capacity-block"})
    assert count(ec2, r.id) == 2 and count(ec2, block.id) == 0
    with pytest.raises(ClientError, match=r"InvalidCapacityReservationId\.NotFound"):
        ec2.describe_capacity_reservations(CapacityReservationIds=["cr-0nothere"])


def test_filters_select_as_karpenters_queries_ask(ec2):
    tagged = ec2_reservations.add_reservation(REGION, "m5.large", "us-west-2a", 1, tags={"team": "ml"})
    ec2_reservations.add_reservation(REGION, "m5.large", "us-west-2a", 1, tags={"team": "web"})
    created = ec2.create_capacity_reservation(
        InstanceType="c5.large", InstancePlatform="Linux/UNIX", AvailabilityZone="us-west-2b", InstanceCount=3
    )["CapacityReservation"]
    by_tag = ec2.describe_capacity_reservations(
        Filters=[{"Name": "state", "Values": ["active"]}, {"Name": "tag:team", "Values": ["ml"]}]
    )["CapacityReservations"]
    assert [r["CapacityReservationId"] for r in by_tag] == [tagged.id]
    ec2.cancel_capacity_reservation(CapacityReservationId=created["CapacityReservationId"])
    active = ec2.describe_capacity_reservations(Filters=[{"Name": "state", "Values": ["active"]}])
    assert created["CapacityReservationId"] not in {
        r["CapacityReservationId"] for r in active["CapacityReservations"]
    }
