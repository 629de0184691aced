"""A reserved replacement's launch: the workflow input names its reservation, RunInstances targets it
with the market type Karpenter's launch template sets, and the node gets Karpenter's reservation
labels (aws/karpenter-provider-aws pkg/providers/launchtemplate/suite_test.go, pkg/apis/v1/labels.go)."""

from __future__ import annotations

import pytest
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
