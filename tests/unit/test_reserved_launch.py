"""A reserved replacement's launch: the workflow input names its reservation, RunInstances targets it
with the market type Karpenter's launch template sets, and the node gets Karpenter's reservation
labels (aws/karpenter-provider-aws pkg/providers/launchtemplate/suite_test.go, pkg/apis/v1/labels.go)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pydantic import ValidationError

from api.workflow_io import Offering, ReplacementSpec
from launch.ec2_params import reservation_params
from launch.instance_labels import reservation_labels


def reserved(**fields: object) -> Offering:
    return Offering.model_validate(
        {"instance_type": "p5.48xlarge", "zone": "us-west-2a", "capacity_type": "reserved", **fields}
    )


@pytest.mark.parametrize(
    ("fields", "market"),
    [
        # launchtemplate/suite_test.go DescribeTable "should correctly assign the market type for reserved
        # capacity": a default ODCR has none, an interruptible one interruptible-capacity-reservation, a
        # capacity block capacity-block
        ({"reservation_id": "cr-0odcr"}, None),
        ({"reservation_id": "cr-0iodcr", "interruptible": True}, "interruptible-capacity-reservation"),
        ({"reservation_id": "cr-0block", "reservation_type": "capacity-block"}, "capacity-block"),
    ],
)
def test_a_reserved_launch_targets_its_reservation_with_its_market_type(
    fields: dict[str, object], market: str | None
):
    params = reservation_params(reserved(**fields))
    assert params["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": fields["reservation_id"]}
    }
    assert (params.get("InstanceMarketOptions") or {}).get("MarketType") == market


def test_other_launches_are_unchanged():
    assert reservation_params(Offering(instance_type="m5.large", zone="us-west-2a")) == {}
    assert (
        reservation_labels(Offering(instance_type="m5.large", zone="us-west-2a", capacity_type="spot")) == {}
    )


def test_a_reserved_node_gets_karpenters_reservation_labels():
    # labels.go LabelCapacityReservationID / Type / Interruptible ("only present on reserved nodes")
    labels = reservation_labels(reserved(reservation_id="cr-0block", reservation_type="capacity-block"))
    assert labels == {
        "karpenter.k8s.aws/capacity-reservation-id": "cr-0block",
        "karpenter.k8s.aws/capacity-reservation-type": "capacity-block",
        "karpenter.k8s.aws/capacity-reservation-interruptible": "false",
    }


def test_a_reserved_offering_names_its_reservation_and_only_it_does():
    with pytest.raises(ValidationError, match="reservation_id"):
        reserved()
    with pytest.raises(ValidationError, match="reservation_id"):
        Offering(instance_type="m5.large", zone="us-west-2a", reservation_id="cr-0abc")
    assert reserved(reservation_id="cr-0abc").key == "p5.48xlarge/us-west-2a/reserved/cr-0abc"
    # A reserved replacement without its offerings would launch into no reservation: refused.
    with pytest.raises(ValidationError, match="reserved replacement"):
        ReplacementSpec(nodepool="gpu", instance_types=["p5.48xlarge"], capacity_type=["reserved"])


@pytest.fixture
def ec2() -> Iterator[Any]:
    from sim import ec2_reservations

    ec2_reservations.install()  # the local stack's EC2 side of reservations (moto has none)
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


async def test_a_reserved_launch_lands_in_its_reservation_and_reports_its_labels(ec2):
    # cloudprovider/suite_test.go Context "Capacity Reservations" It "should mark capacity reservations as
    # launched": the instance is in the reservation and takes one of its instances
    from activities.ec2 import EC2Activities
    from api.activity_io import LaunchRequest
    from sim import ec2_reservations
    from tests.unit.workflows.test_ec2_activities import aws, template

    block = ec2_reservations.add_reservation(
        "us-west-2", "m5.large", "us-west-2a", 1, reservation_type="capacity-block"
    )
    offering = Offering(
        instance_type="m5.large",
        zone="us-west-2a",
        capacity_type="reserved",
        reservation_id=block.id,
        reservation_type="capacity-block",
    )
    launch = LaunchRequest(command_id="disruption/r", index=0, offering=offering, template=template(ec2))
    activities: EC2Activities = aws(ec2, "prod")
    launched = await activities.launch_instance(launch)
    assert launched.offering.capacity_type == "reserved" and launched.offering.reservation_id == block.id
    assert launched.labels["karpenter.sh/capacity-type"] == "reserved"
    assert launched.labels["karpenter.k8s.aws/capacity-reservation-id"] == block.id
    assert launched.labels["karpenter.k8s.aws/capacity-reservation-type"] == "capacity-block"
    assert ec2_reservations.reservation("us-west-2", block.id).available == 0  # type: ignore[union-attr]
    # A retried launch adopts the instance: the same labels, no second instance taken.
    assert (await activities.launch_instance(launch)).labels == launched.labels


async def test_an_on_demand_launch_placed_in_an_open_reservation_stays_on_demand(ec2):
    # The plan priced it on-demand; only a launch that targeted the reservation is reserved.
    from api.activity_io import LaunchRequest
    from tests.unit.workflows.test_ec2_activities import aws, template

    launch = LaunchRequest(
        command_id="disruption/o",
        index=0,
        offering=Offering(instance_type="m5.large", zone="us-west-2a"),
        template=template(ec2),
    )
    activities = aws(ec2, "prod")
    launched = await activities.launch_instance(launch)
    instance = {
        "InstanceId": launched.instance_id,
        "InstanceType": "m5.large",
        "CapacityReservationId": "cr-0open",
    }
    instance["Placement"] = {"AvailabilityZone": "us-west-2a"}
    assert activities._launched_instance(
        instance, adopted=True, requested=launch.offering
    ).offering.capacity_type == ("on-demand")
