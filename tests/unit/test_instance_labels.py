"""Karpenter's instance labels from EC2's description of a type (launch/instance_labels.py), checked
against DescribeInstanceTypes as moto serves it (EC2's real data), and the max pods the kubelet is
told checked against the planner's catalog, which must count the same."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from launch.instance_labels import eni_max_pods, instance_type_labels, offering_labels
from planner.catalog import bundled_catalog

AWS = "karpenter.k8s.aws/"


@pytest.fixture(scope="module")
def describe() -> Iterator[Any]:
    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-west-2")

        def one(name: str) -> dict[str, Any]:
            return ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"][0]

        yield one


def test_an_intel_type_with_local_nvme(describe):
    labels = instance_type_labels(describe("c5d.large"))
    assert {k.removeprefix(AWS): v for k, v in labels.items() if k.startswith(AWS)} == {
        "instance-category": "c",
        "instance-family": "c5d",
        "instance-generation": "5",
        "instance-size": "large",
        "instance-cpu": "2",
        "instance-cpu-manufacturer": "intel",
        "instance-cpu-sustained-clock-speed-mhz": "3400",
        "instance-memory": "4096",
        "instance-hypervisor": "nitro",
        "instance-encryption-in-transit-supported": "false",
        "instance-local-nvme": "50",
        "instance-network-bandwidth": "750",
        "instance-ebs-bandwidth": "4750",
    }
    assert labels["node.kubernetes.io/instance-type"] == "c5d.large"
    assert labels["kubernetes.io/arch"] == "amd64" and labels["kubernetes.io/os"] == "linux"


def test_a_gpu_type_and_a_graviton_type(describe):
    gpu = instance_type_labels(describe("g4dn.xlarge"))
    assert gpu[AWS + "instance-gpu-name"] == "t4"
    assert gpu[AWS + "instance-gpu-manufacturer"] == "nvidia"
    assert gpu[AWS + "instance-gpu-count"] == "1"
    assert gpu[AWS + "instance-gpu-memory"] == "16384"
    assert gpu[AWS + "instance-encryption-in-transit-supported"] == "true"
    arm = instance_type_labels(describe("m6g.large"))
    assert arm["kubernetes.io/arch"] == "arm64" and arm[AWS + "instance-cpu-manufacturer"] == "aws"
    assert AWS + "instance-gpu-count" not in arm and AWS + "instance-local-nvme" not in arm


def test_the_offering_gives_zone_zone_id_region_and_capacity_type():
    assert offering_labels("us-west-2a", "usw2-az2", "spot", "us-west-2") == {
        "topology.kubernetes.io/zone": "us-west-2a",
        "topology.k8s.aws/zone-id": "usw2-az2",
        "topology.kubernetes.io/region": "us-west-2",
        "karpenter.sh/capacity-type": "spot",
    }
    assert "topology.k8s.aws/zone-id" not in offering_labels("us-west-2a", None, "spot", None)


def test_the_node_gets_the_labels_and_max_pods_the_planners_catalog_assumes(describe):
    """The scheduling simulation places pods on a new node by its catalog labels and pods: the
    launched node must carry the same."""
    catalog = bundled_catalog("us-west-2")
    assert len(catalog) > 40
    for itype in catalog:
        info = describe(itype.name)
        assert eni_max_pods(info) == itype.pods, itype.name
        labels = instance_type_labels(info)
        assert {k: labels.get(k) for k in itype.labels} == itype.labels, itype.name
