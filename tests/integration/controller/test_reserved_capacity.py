"""Reserved capacity on the local stack: an on-demand node of a NodePool that allows
`karpenter.sh/capacity-type: reserved`, with an EC2NodeClass whose capacityReservationSelectorTerms
select an on-demand capacity reservation of the same instance type and zone, is consolidated into
that reservation (kubernetes-sigs/karpenter consolidation_test.go Context "Reserved Capacity"
DescribeTable "can consolidate into reserved capacity for the same instance pool"): the controller's
planning reads the reservation from EC2, the launch targets it, and the node carries Karpenter's
`karpenter.k8s.aws/capacity-reservation-*` labels.

Real parts: the worker with its controller, the Temporal dev server, the emulator, moto with the
simulator's capacity reservations (sim/ec2_reservations.py: moto has none)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from api.constants import CAPACITY_TYPE_LABEL, NODEPOOL_LABEL
from sim import ec2_reservations
from sim.scenario import scenario_from_documents
from sim.scenarios import generate_demo as gen
from sim.testing import assert_no_violations
from tests.integration.controller.test_controller import FAST, until_quiet
from tests.integration.workflows.conftest import Workload, node

pytestmark = pytest.mark.integration

ON_DEMAND = node("172.31.1.10", "m5.xlarge", "us-west-2a")
WEB = [Workload("shop", "web", "100m", "128Mi", ["10", "10"])]
TAGS = {"purpose": "karpflow-reserved-test"}


def reserved_scenario() -> Any:
    listing = copy.deepcopy(gen.scenario_list([ON_DEMAND], WEB))
    for item in listing["items"]:
        if item["kind"] == "NodePool" and item["metadata"]["name"] == "default":
            item["spec"]["disruption"]["consolidateAfter"] = "1s"
            for requirement in item["spec"]["template"]["spec"]["requirements"]:
                if requirement["key"] == CAPACITY_TYPE_LABEL:
                    requirement["values"] = ["reserved", "on-demand", "spot"]
        if item["kind"] == "EC2NodeClass" and item["metadata"]["name"] == "default":
            item["spec"]["capacityReservationSelectorTerms"] = [{"tags": dict(TAGS)}]
    return scenario_from_documents([listing], "reserved capacity test scenario")


def count(karpflow: Any, rid: str) -> int:
    found = karpflow.stack.ec2_client().describe_capacity_reservations(CapacityReservationIds=[rid])
    return int(found["CapacityReservations"][0]["AvailableInstanceCount"])


@pytest.mark.sim_stack(scenario=reserved_scenario())
async def test_an_on_demand_node_is_consolidated_into_a_capacity_reservation_and_labelled(karpflow):
    region = karpflow.stack.region
    reservation = ec2_reservations.add_reservation(region, "m5.xlarge", "us-west-2a", 1, tags=TAGS)
    async with karpflow.worker(**FAST):

        async def moved() -> dict[str, Any] | None:
            nodes = {
                n: v
                for n, v in (await karpflow.nodes()).items()
                if (v["metadata"].get("labels") or {}).get(NODEPOOL_LABEL) == "default"
                and not v["metadata"].get("deletionTimestamp")
            }
            if ON_DEMAND.name in nodes or len(nodes) != 1:
                return None
            (only,) = nodes.values()
            initialized = (only["metadata"].get("labels") or {}).get("karpenter.sh/initialized") == "true"
            return only if initialized else None

        replacement = await karpflow.eventually(moved, within=120, what="the node moved into the reservation")
        await until_quiet(karpflow, after_passes=3)
        # Nothing moves it out again: the reserved node is the cheapest there is.
        nodes = [n for n in (await karpflow.nodes()).values() if not n["metadata"].get("deletionTimestamp")]
        assert [n["metadata"]["name"] for n in nodes] == [replacement["metadata"]["name"]]
    labels = replacement["metadata"]["labels"]
    assert labels[CAPACITY_TYPE_LABEL] == "reserved"
    assert labels["karpenter.k8s.aws/capacity-reservation-id"] == reservation.id
    assert labels["karpenter.k8s.aws/capacity-reservation-type"] == "default"
    assert labels["karpenter.k8s.aws/capacity-reservation-interruptible"] == "false"
    assert labels["node.kubernetes.io/instance-type"] == "m5.xlarge"
    instance_id = replacement["spec"]["providerID"].rsplit("/", 1)[-1]
    described = karpflow.stack.ec2_client().describe_instances(InstanceIds=[instance_id])
    assert described["Reservations"][0]["Instances"][0]["CapacityReservationId"] == reservation.id
    assert count(karpflow, reservation.id) == 0
    assert_no_violations(karpflow.stack)
