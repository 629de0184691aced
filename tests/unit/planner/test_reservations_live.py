"""The live catalog's reserved offerings: DescribeCapacityReservations for the EC2NodeClasses' selector
terms (planner/reservations_live.py). moto 5.2 has no DescribeCapacityReservations, so only that
boundary is faked here (everything else is moto's EC2); the local stack's EC2 answers it for real
(sim/ec2_reservations.py). From aws/karpenter-provider-aws pkg/providers/capacityreservation/provider.go
and pkg/controllers/nodeclass/capacityreservation_test.go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from api.nodepool import EC2NodeClass
from planner.catalog_live import live_catalog
from planner.reservations_live import read_reservations

NOW = datetime.now(UTC)


class WithReservations:
    """moto's EC2 client plus a DescribeCapacityReservations that answers from a list, applying the
    id and tag filters Karpenter's queries use, in pages of one (so paging is exercised)."""

    def __init__(self, ec2: Any, reservations: list[dict[str, Any]]) -> None:
        self.ec2, self.reservations, self.calls = ec2, reservations, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ec2, name)

    def describe_capacity_reservations(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        ids = kwargs.get("CapacityReservationIds")
        if ids and not any(r["CapacityReservationId"] in ids for r in self.reservations):
            raise ClientError(
                {"Error": {"Code": "InvalidCapacityReservationId.NotFound", "Message": "no such"}},
                "DescribeCapacityReservations",
            )
        found = [r for r in self.reservations if not ids or r["CapacityReservationId"] in ids]
        for f in kwargs.get("Filters") or ():
            if f["Name"].startswith("tag:"):
                key = f["Name"][4:]
                found = [r for r in found if {"Key": key, "Value": f["Values"][0]} in r.get("Tags", [])]
        start = int(kwargs.get("NextToken") or 0)
        page = found[start : start + 1]
        more = start + 1 < len(found)
        return {"CapacityReservations": page, **({"NextToken": str(start + 1)} if more else {})}


def entry(rid: str, **fields: Any) -> dict[str, Any]:
    return {
        "CapacityReservationId": rid,
        "InstanceType": "m5.large",
        "AvailabilityZone": "us-west-2a",
        "OwnerId": "123456789012",
        "InstanceMatchCriteria": "targeted",
        "AvailableInstanceCount": 2,
        "State": "active",
        **fields,
    }


def nodeclass(name: str, *terms: dict[str, Any]) -> EC2NodeClass:
    return EC2NodeClass.model_validate(
        {"metadata": {"name": name}, "spec": {"capacityReservationSelectorTerms": list(terms)}}
    )


@pytest.fixture
def ec2():
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


def test_the_live_catalog_adds_the_reservations_the_classes_select(ec2):
    # capacityreservation_test.go It "should resolve capacity reservations by tags" and "... by ID";
    # provider.go: pages read, each reservation once
    fake = WithReservations(
        ec2,
        [
            entry("cr-0tagged", Tags=[{"Key": "team", "Value": "ml"}]),
            entry("cr-0second", Tags=[{"Key": "team", "Value": "ml"}], AvailableInstanceCount=0),
            entry("cr-0byid", InstanceType="m5.xlarge"),
        ],
    )
    classes = [nodeclass("default", {"tags": {"team": "ml"}}, {"id": "cr-0byid"})]
    catalog = live_catalog(fake, None, names=["m5.large", "m5.xlarge"], nodeclasses=classes)
    reserved = {o.reservation.id: o for t in catalog for o in t.offerings if o.reservation is not None}
    assert sorted(reserved) == ["cr-0byid", "cr-0second", "cr-0tagged"]
    assert reserved["cr-0tagged"].available and not reserved["cr-0second"].available
    assert reserved["cr-0byid"].reservation.nodeclasses == frozenset({"default"})
    assert {
        "CapacityReservationIds": ["cr-0byid"],
        "Filters": [{"Name": "state", "Values": ["active"]}],
    } in fake.calls


def test_an_unknown_id_is_no_reservation_and_a_bad_term_is_reported(ec2):
    # provider.go List: NotFound for an id query is "none"; a term Karpenter's CRD refuses selects nothing
    fake = WithReservations(ec2, [entry("cr-0real")])
    by_class, problems = read_reservations(
        fake, [nodeclass("default", {"id": "cr-0gone"}), nodeclass("bad", {"ownerID": "123456789012"})], NOW
    )
    assert by_class == {"default": []}
    assert problems and "EC2NodeClass bad" in problems[0]


def test_expired_and_unknown_kinds_of_reservations_are_left_out(ec2):
    # capacityreservation_test.go It "should exclude expired capacity reservations"; ec2nodeclass_status.go
    # guards against match criteria EC2 may add
    fake = WithReservations(
        ec2,
        [
            entry("cr-0old", Tags=[{"Key": "a", "Value": "b"}], EndDate=NOW - timedelta(minutes=1)),
            entry("cr-0new", Tags=[{"Key": "a", "Value": "b"}], InstanceMatchCriteria="future"),
            entry("cr-0ok", Tags=[{"Key": "a", "Value": "b"}]),
        ],
    )
    by_class, problems = read_reservations(fake, [nodeclass("default", {"tags": {"a": "b"}})], NOW)
    assert [r.id for r in by_class["default"]] == ["cr-0ok"]
    assert any("cr-0new" in p for p in problems)
