import math

import pytest

from api.constants import TAG_NODEPOOL
from api.quantity import to_int
from planner.catalog import MIB, bundled_catalog
from planner.catalog_live import instance_type_from_describe
from sim.controllers.bootstrap import BootError, KubeletBoot, nodeconfig, read
from sim.controllers.instance_types import InstanceTypes
from sim.controllers.kubelet_config import KubeletSettings
from sim.controllers.node_objects import (
    LaunchedNodeSpec,
    instance_id_from_provider_id,
    node_name,
    registered_node,
)

CATALOG = bundled_catalog("us-west-2")


def instance(**extra):
    base = {
        "InstanceId": "i-0abc",
        "InstanceType": "m5.large",
        "PrivateIpAddress": "10.0.1.2",
        "Placement": {"AvailabilityZone": "us-west-2b"},
        "Architecture": "x86_64",
        "Tags": [],
    }
    base.update(extra)
    return base


def test_registered_node_carries_eks_names_labels_and_taints():
    inst = instance(InstanceLifecycle="spot", Tags=[{"Key": TAG_NODEPOOL, "Value": "default"}])
    boot = KubeletBoot(
        labels={"team": "a", "karpenter.sh/capacity-type": "on-demand"},
        taints=[
            {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
            {"key": "agent.example.com/not-ready", "effect": "NoExecute"},
        ],
    )
    startup = [{"key": "agent.example.com/not-ready", "effect": "NoExecute"}]
    launch = LaunchedNodeSpec.from_boot(boot, startup)
    assert launch.startup_taints == startup
    itype = CATALOG.get("m5.large")
    node = registered_node(inst, "us-west-2", itype, launch)
    labels = node["metadata"]["labels"]
    assert node["metadata"]["name"] == "ip-10-0-1-2.us-west-2.compute.internal"
    assert node["spec"]["providerID"] == "aws:///us-west-2b/i-0abc"
    assert labels["kubernetes.io/hostname"] == node["metadata"]["name"]
    assert labels["topology.kubernetes.io/zone"] == "us-west-2b"
    assert labels["topology.kubernetes.io/region"] == "us-west-2"
    assert labels["node.kubernetes.io/instance-type"] == "m5.large"
    # The kubelet writes what its user data says; a tag or the instance type adds no Karpenter label.
    assert labels["karpenter.sh/capacity-type"] == "on-demand"
    assert labels["team"] == "a"
    assert "karpenter.sh/nodepool" not in labels
    assert not [key for key in labels if key.startswith("karpenter.k8s.aws/")]
    assert [t["key"] for t in node["spec"]["taints"]] == [
        "node.kubernetes.io/not-ready",
        "dedicated",
        "agent.example.com/not-ready",
    ]
    assert node["status"]["allocatable"] == itype.allocatable
    assert node["status"]["capacity"]["pods"] == "29"
    assert node["status"]["conditions"][0]["status"] == "False"


def test_us_east_1_uses_ec2_internal_and_no_label_the_user_data_does_not_give():
    inst = instance(InstanceLifecycle="spot")
    node = registered_node(inst, "us-east-1", CATALOG.get("m5.large"), LaunchedNodeSpec({}, [], []))
    assert node["metadata"]["name"] == "ip-10-0-1-2.ec2.internal"
    assert "karpenter.sh/capacity-type" not in node["metadata"]["labels"]


def _booted(**settings):
    return LaunchedNodeSpec({}, [], [], KubeletSettings(**settings))


def test_the_kubelet_reports_the_max_pods_it_was_given_and_110_when_al2_was_told_not_to_count():
    itype = CATALOG.get("m5.large")  # 29 pods by its ENIs
    told = registered_node(instance(), "us-west-2", itype, _booted(max_pods=29))
    default = registered_node(instance(), "us-west-2", itype, _booted())
    forgotten = registered_node(instance(), "us-west-2", itype, _booted(use_max_pods=False))
    assert told["status"]["allocatable"] == itype.allocatable == default["status"]["allocatable"]
    assert forgotten["status"]["capacity"]["pods"] == "110"
    # 81 more pods' worth of kube-reserved memory (11 MiB each) comes off allocatable.
    assert (
        to_int(forgotten["status"]["allocatable"]["memory"])
        == to_int(itype.allocatable["memory"]) - 81 * 11 * MIB
    )


def test_the_kubelet_takes_its_reservations_and_eviction_thresholds_off_allocatable():
    itype = CATALOG.get("m5.large")
    node = registered_node(
        instance(),
        "us-west-2",
        itype,
        _booted(
            max_pods=29,
            kube_reserved={"cpu": "200m", "memory": "1Gi"},
            system_reserved={"cpu": "100m", "memory": "512Mi"},
            eviction_hard={"memory.available": "5%"},
        ),
    )
    capacity, allocatable = node["status"]["capacity"], node["status"]["allocatable"]
    assert capacity == itype.capacity
    assert allocatable["cpu"] == "1700m"
    memory = to_int(capacity["memory"])
    assert to_int(allocatable["memory"]) == memory - (1 << 30) - (512 * MIB) - math.ceil(memory * 0.05)
    with pytest.raises(ValueError, match="reservations"):
        registered_node(instance(), "us-west-2", itype, _booted(kube_reserved={"memory": "lots"}))


def test_a_taint_the_kubelet_refuses_is_a_boot_error():
    bad = nodeconfig("c1", "https://api", taints=[{"key": "x", "effect": "Whenever"}])
    with pytest.raises(BootError, match=r"--register-with-taints.*Whenever"):
        read(bad, cluster="c1", endpoint="https://api")


def test_provider_id_round_trip():
    assert instance_id_from_provider_id("aws:///us-west-2a/i-0123") == "i-0123"
    assert instance_id_from_provider_id("kwok://x") is None
    assert instance_id_from_provider_id(None) is None
    assert node_name({"InstanceId": "i-1"}, "us-west-2") == "i-1"


def test_types_outside_the_catalog_come_from_describe_instance_types():
    calls = []

    def describe(names):
        calls.append(list(names))
        return [
            {
                "InstanceType": "x9.huge",
                "VCpuInfo": {"DefaultVCpus": 8},
                "MemoryInfo": {"SizeInMiB": 32768},
                "ProcessorInfo": {"SupportedArchitectures": ["arm64"]},
                "NetworkInfo": {"MaximumNetworkInterfaces": 4, "Ipv4AddressesPerInterface": 15},
            }
        ]

    types = InstanceTypes(CATALOG, describe)
    assert types.get("m5.large") is CATALOG.get("m5.large")
    types.fill(["m5.large", "x9.huge"])
    assert calls == [["x9.huge"]]
    huge = types.get("x9.huge")
    assert (huge.cpu, huge.pods, huge.arch) == (8000, 58, "arm64")
    assert huge == instance_type_from_describe(describe(["x9.huge"])[0])
