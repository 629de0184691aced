"""Reserved capacity (ODCRs, capacity blocks) in the planner: reservations read as Karpenter's AWS
provider reads them, their reserved offerings, consolidation into and out of them, and the count a
pass consumes (planner/reservations.py). Each test names the Karpenter test it comes from."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from api.constants import (
    CAPACITY_RESERVATION_ID_LABEL,
    CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL,
    CAPACITY_RESERVATION_TYPE_LABEL,
    CAPACITY_TYPE_LABEL,
)
from api.nodepool import CapacityReservationSelectorTerm, EC2NodeClass
from api.workflow_io import disruption_input
from planner.catalog import Catalog, catalog_from_dict, catalog_to_dict
from planner.model import Command, DisruptionClass, PlanOptions, Replacement
from planner.plan import command_from_out, command_out, plan
from planner.reservations import (
    CapacityReservation,
    ReservationProblem,
    describe_queries,
    reservation_labels,
    reserved_price,
    term_problem,
    valid_terms,
    with_reservations,
    within_reservations,
)
from planner.why_not import Kind, kind_of
from sim.cluster_builder import DEFAULT_NOW, ClusterBuilder

NOW = DEFAULT_NOW
RESERVED_OR_ON_DEMAND = [
    {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["reserved", "on-demand"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
]


def ec2_reservation(rid: str, instance_type: str = "m5.large", **fields: Any) -> dict[str, Any]:
    """A DescribeCapacityReservations entry (the fields EC2 returns that Karpenter reads)."""
    return {
        "CapacityReservationId": rid,
        "InstanceType": instance_type,
        "AvailabilityZone": "us-west-2a",
        "OwnerId": "123456789012",
        "InstanceMatchCriteria": "targeted",
        "AvailableInstanceCount": 1,
        "State": "active",
        **fields,
    }


def reservation(rid: str, instance_type: str = "m5.large", **fields: Any) -> CapacityReservation:
    return CapacityReservation.from_ec2(ec2_reservation(rid, instance_type, **fields), NOW)


# --- reading reservations (aws/karpenter-provider-aws pkg/controllers/nodeclass/capacityreservation_test.go)


def test_capacity_blocks_are_expiring_40_minutes_before_their_end():
    # It "should mark capacity blocks as expiring 40 minutes prior to their endDate"
    block = ec2_reservation("cr-block", ReservationType="capacity-block", EndDate=NOW + timedelta(minutes=39))
    assert CapacityReservation.from_ec2(block, NOW).state == "expiring"
    block["EndDate"] = NOW + timedelta(minutes=41)
    assert CapacityReservation.from_ec2(block, NOW).state == "active"


def test_default_reservations_never_expire_early():
    # It "shouldn't mark default capacity reservations as expiring 40 minutes prior to their endDate"
    odcr = ec2_reservation("cr-odcr", EndDate=NOW + timedelta(minutes=5))
    assert CapacityReservation.from_ec2(odcr, NOW).state == "active"


def test_interruptible_and_capacity_block_reservations_are_discovered():
    # It "should discover capacity block reservations", It "should discover interruptible reservations",
    # It "should handle capacity reservations with nil Interruptible field"
    block = reservation("cr-block", ReservationType="capacity-block", EndDate=NOW + timedelta(days=1))
    assert block.reservation_type == "capacity-block"
    assert reservation("cr-iodcr", Interruptible=True).interruptible is True
    assert reservation("cr-plain").interruptible is False


def test_an_unknown_match_criteria_or_reservation_type_is_refused():
    # ec2nodeclass_status.go CapacityReservationFromEC2: "Guard against new instance match criteria
    # added in the future"; CapacityReservationTypeFromEC2's unsupported reservation type
    with pytest.raises(ReservationProblem, match="match criteria"):
        reservation("cr-x", InstanceMatchCriteria="someday")
    with pytest.raises(ReservationProblem, match="reservation type"):
        reservation("cr-x", ReservationType="future-kind")


def test_selector_terms_become_describe_queries():
    # It "should resolve capacity reservations by ID", "... by tags", "... by tags + owner",
    # "... by instance match criteria 'open'" (the provider's QueriesFromSelectorTerms and
    # DescribeCapacityReservationsInput): active only; an id alone; '*' selects any value of a tag key
    terms = [
        CapacityReservationSelectorTerm(id="cr-0abc"),
        CapacityReservationSelectorTerm(tags={"team": "ml", "env": "*"}, owner_id="123456789012"),
        CapacityReservationSelectorTerm(instance_match_criteria="open"),
    ]
    by_id, by_tags, by_criteria = describe_queries(terms)
    assert by_id == {
        "CapacityReservationIds": ["cr-0abc"],
        "Filters": [{"Name": "state", "Values": ["active"]}],
    }
    assert by_tags["Filters"] == [
        {"Name": "state", "Values": ["active"]},
        {"Name": "owner-id", "Values": ["123456789012"]},
        {"Name": "tag-key", "Values": ["env"]},
        {"Name": "tag:team", "Values": ["ml"]},
    ]
    assert by_criteria["Filters"][-1] == {"Name": "instance-match-criteria", "Values": ["open"]}


@pytest.mark.parametrize(
    ("term", "problem"),
    [
        # pkg/apis/v1/ec2nodeclass_validation_cel_test.go Context "CapacityReservationSelectorTerms"
        (
            {},
            "expected at least one",
        ),  # It "should fail when a capacity reservation selector term has no values"
        (
            {"id": "r-1234"},
            "must match",
        ),  # It "should fail with a capacity reservation selector on a malformed id"
        ({"id": "cr-1", "tags": {"a": "b"}}, "mutually exclusive"),
        ({"tags": {"": "b"}}, "empty tag"),  # It "... has a tag map key that is empty"
        ({"tags": {"a": ""}}, "empty tag"),  # It "... has a tag map value that is empty"
        ({"tags": {"a": "b"}, "ownerID": "12"}, "12-digit"),
    ],
)
def test_invalid_terms_select_nothing_and_are_reported(term: dict[str, Any], problem: str):
    model = CapacityReservationSelectorTerm.model_validate(term)
    assert problem in (term_problem(model) or "")
    nodeclass = EC2NodeClass.model_validate(
        {"metadata": {"name": "gpu"}, "spec": {"capacityReservationSelectorTerms": [term, {"id": "cr-good"}]}}
    )
    kept, problems = valid_terms(nodeclass)
    assert [t.id for t in kept] == ["cr-good"]
    assert (
        problems
        and "capacityReservationSelectorTerms[0]" in problems[0]
        and "selects no reservation" in problems[0]
    )


# --- reserved offerings (pkg/providers/instancetype/offering/reserved_capacity_resolver.go)


def catalog_with(*reservations: CapacityReservation, nodeclass: str = "default") -> Catalog:
    return with_reservations(
        ClusterBuilder().catalog or Catalog("us-west-2", {}), {nodeclass: list(reservations)}
    )


def test_a_reserved_offering_is_priced_near_zero_and_keeps_the_on_demand_order():
    # reserved_capacity_resolver.go: price = on-demand price / 10,000,000; metrics suite_test.go
    # It "should inject reservation pricing when selecting on a capacity reservation"
    catalog = catalog_with(reservation("cr-small"), reservation("cr-big", "m5.xlarge"))
    small = catalog.types["m5.large"].offerings[-1]
    big = catalog.types["m5.xlarge"].offerings[-1]
    on_demand = catalog.types["m5.large"].price("us-west-2a", "on-demand")
    assert on_demand is not None and small.price == pytest.approx(reserved_price(on_demand))
    assert small.capacity_type == "reserved" and small.reservation and small.reservation.id == "cr-small"
    assert 0 < small.price < big.price < 1e-6


@pytest.mark.parametrize(
    ("fields", "available"),
    [
        ({}, True),
        ({"AvailableInstanceCount": 0}, False),  # no count left
        ({"ReservationType": "capacity-block", "EndDate": NOW + timedelta(minutes=30)}, False),  # expiring
        ({"AvailabilityZone": "eu-west-1a"}, False),  # a zone the type is not offered in
    ],
)
def test_a_reserved_offering_is_available_while_it_has_a_count_and_is_not_expiring(
    fields: dict[str, Any], available: bool
):
    # reserved_capacity_resolver.go: Available = compatible && reservationCapacity != 0 && the zone is the
    # type's && state != expiring
    (offering,) = [
        o for o in catalog_with(reservation("cr-1", **fields)).types["m5.large"].offerings if o.reservation
    ]
    assert offering.available is available


def test_reserved_offerings_round_trip_through_the_catalog_file():
    catalog = catalog_with(reservation("cr-1", Interruptible=True, AvailableInstanceCount=3))
    again = catalog_from_dict(catalog_to_dict(catalog))
    (offering,) = [o for o in again.types["m5.large"].offerings if o.reservation]
    assert offering.reservation is not None
    assert (offering.reservation.id, offering.reservation.remaining, offering.reservation.interruptible) == (
        "cr-1",
        3,
        True,
    )
    assert offering.reservation.nodeclasses == frozenset({"default"})


def test_reservation_labels_are_karpenters():
    # pkg/apis/v1/labels.go: capacity-reservation-id (v1.3), -type (v1.6), -interruptible (v1.10)
    offering = catalog_with(reservation("cr-1", Interruptible=True)).types["m5.large"].offerings[-1]
    assert offering.reservation is not None
    assert reservation_labels(offering.reservation) == {
        CAPACITY_RESERVATION_ID_LABEL: "cr-1",
        CAPACITY_RESERVATION_TYPE_LABEL: "default",
        CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL: "true",
    }


# --- consolidation into and out of reservations
# (kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation_test.go Context "Reserved Capacity")


def cluster(
    node_type: str,
    node_capacity: str = "on-demand",
    labels: dict[str, str] | None = None,
    capacity_types: tuple[str, ...] = ("reserved", "on-demand"),
) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodeclass()
    requirements = [dict(r) for r in RESERVED_OR_ON_DEMAND]
    requirements[0]["values"] = list(capacity_types)
    b.nodepool(requirements=requirements)
    b.node("n0", instance_type=node_type, zone="us-west-2a", capacity_type=node_capacity, labels=labels)
    b.pod("app-1", "n0", cpu="500m", memory="1Gi")
    return b


def run(b: ClusterBuilder, catalog: Catalog):
    return plan(b.snapshot(), catalog, PlanOptions())


@pytest.mark.parametrize(
    ("capacity_type", "allowed"),
    [
        ("on-demand", ("reserved", "on-demand")),
        ("spot", ("reserved", "on-demand")),
        # A pool that allows spot too: the claim is not pinned to spot (nor taken for spot-to-spot),
        # since Karpenter's scheduler narrows it to reserved first (nodeclaim.go offeringsToReserve).
        ("on-demand", ("reserved", "on-demand", "spot")),
        ("spot", ("reserved", "on-demand", "spot")),
    ],
)
def test_consolidates_into_reserved_capacity_for_the_same_instance_pool(
    capacity_type: str, allowed: tuple[str, ...]
):
    # DescribeTable "can consolidate into reserved capacity for the same instance pool" (on-demand, spot)
    b = cluster("m5.large", capacity_type, capacity_types=allowed)
    result = run(b, catalog_with(reservation("cr-0same")))
    (command,) = result.commands_
    (replacement,) = command.replacements
    assert replacement.capacity_type == "reserved" and replacement.reservation_ids == ["cr-0same"]
    assert replacement.instance_type_names == ["m5.large"]
    # The launch goes into that reservation only.
    (spec,) = disruption_input(command).replacements
    assert [(o.instance_type, o.capacity_type, o.reservation_id) for o in spec.offerings] == [
        ("m5.large", "reserved", "cr-0same")
    ]


def test_consolidates_from_one_reserved_offering_to_another():
    # It "can consolidate from one reserved offering to another"
    b = cluster("m5.xlarge", "reserved", {CAPACITY_RESERVATION_ID_LABEL: "cr-0big"})
    catalog = catalog_with(reservation("cr-0big", "m5.xlarge"), reservation("cr-0small"))
    (command,) = run(b, catalog).commands_
    (replacement,) = command.replacements
    assert replacement.reservation_ids == ["cr-0small"] and replacement.instance_type_names == ["m5.large"]


def test_a_reserved_node_is_not_moved_out_to_on_demand_or_spot():
    # The reserved offering is "free" (reserved_capacity_resolver.go; designs/odcr.md "Consolidating into
    # Capacity Reserved Instances"): no on-demand or spot node is cheaper than a reserved one. Fails
    # when a reserved node is priced by its (absent) catalog offering.
    b = cluster("m5.xlarge", "reserved", {CAPACITY_RESERVATION_ID_LABEL: "cr-0big"})
    b.nodepool("open", requirements=None)  # on-demand and spot cheaper than m5.xlarge on-demand
    result = run(b, catalog_with(reservation("cr-0big", "m5.xlarge")))
    assert result.commands_ == []
    # Nor when no EC2NodeClass selects its reservation any more: it is paid for.
    assert run(b, ClusterBuilder().catalog or Catalog("us-west-2", {})).commands_ == []


def test_a_reservation_only_serves_the_nodeclasses_that_select_it():
    # provisioning/scheduling/suite_test.go Describe "Reserved Instance Types" It "should correctly track
    # reservations for multiple nodepools with distinct reservations for the same instance pool":
    # the reservation of class "gpu" is not an offering of the pool of class "default".
    b = cluster("m5.large")
    result = run(b, catalog_with(reservation("cr-0other"), nodeclass="gpu"))
    assert all(r.capacity_type != "reserved" for c in result.commands_ for r in c.replacements)


def test_the_planned_form_keeps_the_reservations():
    # A validated (narrowed) command is started from its planned form: its replacements must still
    # name their reservations (or the launch would have none to target).
    b = cluster("m5.large")
    catalog = catalog_with(reservation("cr-0same"))
    (command,) = run(b, catalog).commands_
    out = command_out(command)
    assert out.replacements[0].reservation_ids == ["cr-0same"]
    b.catalog = catalog
    again = command_from_out(b.context(), out)
    assert again is not None and again.replacements[0].reservation_ids == ["cr-0same"]
    (spec,) = disruption_input(again).replacements
    assert [o.reservation_id for o in spec.offerings] == ["cr-0same"]


# --- the count a pass consumes (provisioning/scheduling/reservationmanager_test.go)


def reserved_command(b: ClusterBuilder, catalog: Catalog, node: str) -> Command:
    ctx = b.context()
    candidate = next(c for c in _candidates(ctx) if c.name == node)
    replacement = Replacement("default", [catalog.types["m5.large"]], "reserved", ["us-west-2a"])
    return Command(
        "single-node-consolidation", "Underutilized", [candidate], [replacement], DisruptionClass.GRACEFUL
    )


def _candidates(ctx: Any) -> list[Any]:
    from planner.candidates import build_candidates

    return build_candidates(ctx)[0]


def test_no_two_replacements_of_a_pass_take_a_reservations_last_instance():
    # Describe "Reserve" Context "Multiple Reservations" It "should panic when trying to over-reserve":
    # one instance left, two replacements; the second is dropped and says why.
    b = cluster("m5.xlarge")
    b.node("n1", instance_type="m5.xlarge", zone="us-west-2a")
    catalog = catalog_with(reservation("cr-0one", AvailableInstanceCount=1))
    b.catalog = catalog
    ctx = b.context()
    first, second = reserved_command(b, catalog, "n0"), reserved_command(b, catalog, "n1")
    kept = within_reservations(ctx, "single-node-consolidation", [first, second])
    assert kept == [first] and first.replacements[0].reservation_ids == ["cr-0one"]
    (why,) = ctx.explanations["n1"]
    assert "no capacity reservation for m5.large has an instance left" in why[1]
    assert kind_of(why[1]) == Kind.CAPACITY_RESERVATION


def test_a_replacement_reserves_one_instance_of_every_reservation_it_could_use():
    # reservationmanager.go / nodeclaim.go offeringsToReserve: "we reserve offering pessimistically":
    # with two reservations of one instance each, the first replacement takes both, the second none.
    b = cluster("m5.xlarge")
    b.node("n1", instance_type="m5.xlarge", zone="us-west-2a")
    catalog = catalog_with(reservation("cr-0a"), reservation("cr-0b"))
    b.catalog = catalog
    ctx = b.context()
    first, second = reserved_command(b, catalog, "n0"), reserved_command(b, catalog, "n1")
    assert within_reservations(ctx, "single-node-consolidation", [first, second]) == [first]
    assert first.replacements[0].reservation_ids == ["cr-0a", "cr-0b"]


def test_a_reserved_node_whose_reservation_no_class_selects_is_still_priced_and_deleted_when_empty_enough():
    # Karpenter prices a node by its offering (types.go resolveNodePrice) and its reserved offering by
    # the on-demand price / 10^7: a reserved node whose pods fit elsewhere is deleted by consolidation
    # even when the catalog has no reserved offering for it (the reservation no longer selected).
    b = cluster("m5.xlarge", "reserved", {CAPACITY_RESERVATION_ID_LABEL: "cr-0gone"})
    b.nodepool("kept", policy="WhenEmpty")  # n1 has room for n0's pod and is no candidate itself
    b.node("n1", pool="kept", instance_type="m5.xlarge", zone="us-west-2a")
    b.pod("app-2", "n1", cpu="500m", memory="1Gi")
    result = run(b, ClusterBuilder().catalog or Catalog("us-west-2", {}))
    deletes = [c for c in result.commands_ if c.decision == "delete"]
    assert deletes and deletes[0].nodes == ["n0"]
