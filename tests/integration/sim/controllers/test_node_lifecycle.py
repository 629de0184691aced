"""EC2 instances in moto become Nodes, seen through the official kubernetes client and kubectl."""

import json
import subprocess
import time

import pytest

from api.constants import TAG_NODEPOOL, cluster_tag
from planner.catalog import bundled_catalog
from sim.controllers.bootstrap import nodeconfig
from sim.controllers.nodes import NodeTimings
from sim.testing import wait_for

from .conftest import REGION, node_ready

pytestmark = pytest.mark.integration

# Startup taints and deletion are slowed down (0.5 s) so the tests can see the state in between.
SLOW_STEPS = NodeTimings(startup_taints=50, delete=50)


STARTUP_TAINT = {"key": "agent.example.com/not-ready", "effect": "NoSchedule"}


def nodepool(name, startup=()):
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": [],
                    "startupTaints": list(startup),
                }
            }
        },
    }


def taint_keys(node):
    return [(t.key, t.effect) for t in node.spec.taints or []]


@pytest.mark.parametrize("ec2_source", ["api", "moto"])
def test_instance_registers_as_a_ready_node_and_leaves_when_terminated(sim_cluster_factory, ec2_source):
    cluster = sim_cluster_factory(SLOW_STEPS, ec2_source=ec2_source)
    # The agent's taint is a startup taint because the node's NodePool says so.
    cluster.server.store.create("nodepools", nodepool("general", startup=[STARTUP_TAINT]))
    [instance_id] = cluster.launch(
        "m5.large",
        tags={TAG_NODEPOOL: "general"},
        labels={"team": "payments", "karpenter.sh/nodepool": "general"},
        taints="dedicated=payments:NoSchedule,agent.example.com/not-ready:NoSchedule",
        Placement={"AvailabilityZone": f"{REGION}c"},
    )
    node = wait_for(
        lambda: (n := cluster.node_of(instance_id)) is not None and node_ready(n) == "True" and n,
        what="a Ready node",
    )
    labels = node.metadata.labels
    described = cluster.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    assert (
        node.metadata.name
        == f"ip-{described['PrivateIpAddress'].replace('.', '-')}.{REGION}.compute.internal"
    )
    assert node.spec.provider_id == f"aws:///{REGION}c/{instance_id}"
    assert labels["kubernetes.io/hostname"] == node.metadata.name
    assert labels["node.kubernetes.io/instance-type"] == "m5.large"
    assert labels["topology.kubernetes.io/zone"] == f"{REGION}c"
    assert labels["topology.kubernetes.io/region"] == REGION
    assert labels["kubernetes.io/arch"] == "amd64"
    assert labels["kubernetes.io/os"] == "linux"
    assert labels["karpenter.sh/nodepool"] == "general"  # from its user data, not from a tag
    assert labels["team"] == "payments"
    # What no kubelet writes is not there: Karpenter's labels come from whoever registers the node.
    assert "karpenter.sh/capacity-type" not in labels
    assert not [key for key in labels if key.startswith("karpenter.k8s.aws/")]
    m5 = bundled_catalog(REGION).get("m5.large")
    assert node.status.capacity == m5.capacity
    assert node.status.allocatable == m5.allocatable
    assert node.status.allocatable["pods"] == "29"
    # Ready: the not-ready taint is gone, launch and startup taints are there ...
    assert taint_keys(node) == [("dedicated", "NoSchedule"), ("agent.example.com/not-ready", "NoSchedule")]
    # ... and the startup taint goes away later, as its agent comes up.
    wait_for(
        lambda: taint_keys(cluster.node_of(instance_id)) == [("dedicated", "NoSchedule")],
        what="the startup taint to be removed",
    )

    cluster.ec2.terminate_instances(InstanceIds=[instance_id])
    node = wait_for(
        lambda: (n := cluster.node_of(instance_id)) is not None and node_ready(n) == "Unknown" and n,
        what="the node to turn NotReady",
    )
    assert ("node.kubernetes.io/unreachable", "NoSchedule") in taint_keys(node)
    # The node lifecycle controller follows the condition with its NoExecute taint.
    wait_for(
        lambda: (
            (n := cluster.node_of(instance_id)) is not None
            and ("node.kubernetes.io/unreachable", "NoExecute") in taint_keys(n)
        ),
        what="the unreachable NoExecute taint",
    )
    wait_for(lambda: cluster.node_of(instance_id) is None, what="the node to be deleted")


@pytest.mark.parametrize("ec2_source", ["api", "moto"])
def test_a_kubelet_goes_on_when_the_ownership_tag_is_taken_off_its_instance(sim_cluster_factory, ec2_source):
    # A real kubelet never reads its instance's tags: the chaos run's ownership-removed fault must
    # not turn the node NotReady (and have the taint manager evict its pods), with either source.
    cluster = sim_cluster_factory(ec2_source=ec2_source)
    cluster.server.store.create("nodepools", nodepool("general"))
    [instance_id] = cluster.launch("m5.large", tags={TAG_NODEPOOL: "general"})
    wait_for(
        lambda: (n := cluster.node_of(instance_id)) is not None and node_ready(n) == "True",
        what="a Ready node",
    )
    cluster.ec2.delete_tags(Resources=[instance_id], Tags=[{"Key": cluster_tag(cluster.cluster_name)}])
    time.sleep(1.5)  # several kubelet heartbeats and node-monitor grace periods at the test's scale
    node = cluster.node_of(instance_id)
    assert node is not None and node_ready(node) == "True", node
    assert not [key for key, effect in taint_keys(node) if key.startswith("node.kubernetes.io/")]


def test_a_finalizer_keeps_the_node_until_it_is_removed_and_then_its_pods_go(sim_cluster_factory, tmp_path):
    cluster = sim_cluster_factory(NodeTimings(delete=0))
    [instance_id] = cluster.launch("c5.large")
    node = wait_for(lambda: (n := cluster.node_of(instance_id)) is not None and node_ready(n) == "True" and n)
    name = node.metadata.name
    kubeconfig = cluster.server.write_kubeconfig(tmp_path / "kubeconfig")

    def kubectl(*args):
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), *args], check=True, capture_output=True, text=True
        ).stdout

    kubectl(
        "patch",
        "node",
        name,
        "--type",
        "merge",
        "-p",
        '{"metadata":{"finalizers":["karpenter.sh/termination"]}}',
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pinned", "namespace": "default"},
        "spec": {"nodeName": name, "containers": [{"name": "c", "image": "busybox"}]},
    }
    cluster.core.create_namespaced_pod("default", pod)

    cluster.ec2.terminate_instances(InstanceIds=[instance_id])
    wait_for(
        lambda: (n := cluster.node_of(instance_id)) is not None and n.metadata.deletion_timestamp is not None,
        what="the node to be Terminating",
    )
    # Held by the finalizer: still there, NotReady, and its pod still exists.
    held = json.loads(kubectl("get", "node", name, "-o", "json"))
    assert held["metadata"]["finalizers"] == ["karpenter.sh/termination"]
    assert cluster.core.read_namespaced_pod("pinned", "default").spec.node_name == name

    kubectl("patch", "node", name, "--type", "json", "-p", '[{"op":"remove","path":"/metadata/finalizers"}]')
    wait_for(lambda: cluster.node_of(instance_id) is None, what="the node to go")
    wait_for(
        lambda: (
            not [p for p in cluster.core.list_namespaced_pod("default").items if p.metadata.name == "pinned"]
        ),
        what="pod GC to delete the pod of the deleted node",
    )


def test_a_spot_instance_is_labelled_spot_by_its_user_data_and_the_kubelet_honours_its_max_pods(sim_cluster):
    [instance_id] = sim_cluster.launch(
        "m5.xlarge",
        InstanceMarketOptions={"MarketType": "spot"},
        labels={"karpenter.sh/capacity-type": "spot"},
        max_pods=20,
    )
    node = wait_for(lambda: sim_cluster.node_of(instance_id))
    assert node.metadata.labels["karpenter.sh/capacity-type"] == "spot"
    assert node.status.capacity["cpu"] == "4"
    assert node.status.capacity["pods"] == node.status.allocatable["pods"] == "20"


def test_never_ready_instances_register_but_stay_not_ready(sim_cluster):
    sim_cluster.faults.add_never_ready(instance_types=["t3.large"])
    [broken] = sim_cluster.launch("t3.large")
    [healthy] = sim_cluster.launch("t3.medium")
    wait_for(lambda: node_ready(sim_cluster.node_of(healthy)) == "True", what="the healthy node")
    wait_for(lambda: sim_cluster.node_of(broken), what="the broken instance to register")
    time.sleep(0.5)  # 50 ready-delays at this time scale
    node = sim_cluster.node_of(broken)
    assert node_ready(node) == "False"
    assert ("node.kubernetes.io/not-ready", "NoSchedule") in taint_keys(node)
    # Ready=False: the node lifecycle controller's NoExecute taint too (doNoExecuteTaintingPass).
    wait_for(
        lambda: ("node.kubernetes.io/not-ready", "NoExecute") in taint_keys(sim_cluster.node_of(broken)),
        what="the not-ready NoExecute taint",
    )
    # Lifting the fault lets the kubelet recover, and the controller takes its taint back.
    sim_cluster.faults.clear()
    wait_for(
        lambda: node_ready(sim_cluster.node_of(broken)) == "True", what="recovery once the fault is lifted"
    )
    wait_for(
        lambda: not [e for _, e in taint_keys(sim_cluster.node_of(broken)) if e == "NoExecute"],
        what="the NoExecute taint removed",
    )


def bound_pod(name, node):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example/app:1"}]},
    }


def test_a_bad_ami_boots_nodes_that_never_turn_ready_or_whose_pods_crash_loop(sim_cluster):
    """`karpflow sim faults bad-ami`: the health gate of a rollout must see what a bad image does
    in a real cluster, from Kubernetes alone (no label or tag says "bad")."""
    sim_cluster.faults.add_bad_image("ami-0badbad0000000001")
    sim_cluster.faults.add_bad_image("ami-0c4a5h00000000001", crash_loop=True)
    [never] = sim_cluster.launch("t3.large", ImageId="ami-0badbad0000000001")
    [crashing] = sim_cluster.launch("t3.large", ImageId="ami-0c4a5h00000000001")
    [healthy] = sim_cluster.launch("t3.large")
    for instance in (crashing, healthy):
        wait_for(lambda i=instance: node_ready(sim_cluster.node_of(i)) == "True", what=f"{instance} Ready")
    wait_for(lambda: sim_cluster.node_of(never), what="the never-ready instance to register")
    store = sim_cluster.server.store
    for label, instance in (("crash", crashing), ("ok", healthy)):
        store.create(
            "pods", bound_pod(f"app-{label}", sim_cluster.node_of(instance).metadata.name), "default"
        )

    def app(name):
        return store.get("pods", name, "default")

    def restarts(pod):
        return (pod.get("status", {}).get("containerStatuses") or [{}])[0].get("restartCount", 0)

    wait_for(lambda: restarts(app("app-crash")) >= 2, what="the crashing container restarted twice")
    crashed = app("app-crash")["status"]
    assert crashed["phase"] == "Running"
    ready = {c["type"]: c for c in crashed["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
    (container,) = crashed["containerStatuses"]
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff" and not container["ready"]
    assert container["lastState"]["terminated"]["exitCode"] == 1
    fine = app("app-ok")["status"]
    assert restarts(app("app-ok")) == 0 and fine["containerStatuses"][0]["ready"] is True
    assert node_ready(sim_cluster.node_of(never)) == "False"
    # The image fixed: the crashing container's next restart runs for good.
    sim_cluster.faults.clear()
    wait_for(
        lambda: (app("app-crash")["status"]["containerStatuses"][0]).get("ready") is True,
        what="the container running once the fault is lifted",
    )


def test_a_node_deleted_by_hand_is_not_registered_again(sim_cluster):
    [instance_id] = sim_cluster.launch("m5.large")
    node = wait_for(lambda: sim_cluster.node_of(instance_id))
    sim_cluster.core.delete_node(node.metadata.name)
    wait_for(lambda: sim_cluster.node_of(instance_id) is None)
    time.sleep(0.4)  # several polls
    assert sim_cluster.node_of(instance_id) is None


def test_auto_source_finds_moto_in_this_process(ec2):
    from sim.controllers.ec2_view import MotoInstanceSource, detect_source, moto_serves_this_process

    assert moto_serves_this_process(ec2, REGION)
    assert isinstance(detect_source(ec2, "any", REGION, "auto"), MotoInstanceSource)
    assert not [
        k for k in ec2.describe_key_pairs()["KeyPairs"] if k["KeyName"].startswith("karpflow-sim-probe")
    ]


@pytest.mark.parametrize(
    ("user_data", "why"),
    [
        ("#!/bin/bash\necho hello\n", "names no cluster"),
        (nodeconfig("another-cluster", "https://sim.invalid"), "joins cluster 'another-cluster'"),
        ("CLUSTER", "wrong-endpoint"),
        ("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec: [", "cannot read a NodeConfig"),
    ],
    ids=["no-bootstrap", "other-cluster", "wrong-endpoint", "broken-yaml"],
)
def test_an_instance_whose_user_data_would_not_bootstrap_never_registers(sim_cluster, user_data, why):
    if user_data == "CLUSTER":
        user_data, why = (
            nodeconfig(sim_cluster.cluster_name, "https://elsewhere.invalid"),
            "is not this cluster's",
        )
    [broken] = sim_cluster.launch("t3.large", UserData=user_data)
    [healthy] = sim_cluster.launch("t3.medium")
    wait_for(lambda: (n := sim_cluster.node_of(healthy)) is not None and node_ready(n) == "True")
    nodes = sim_cluster.controllers.controllers["nodes"]
    wait_for(lambda: broken in nodes.boot_failures, what="the boot failure")
    assert why in nodes.boot_failures[broken]
    assert sim_cluster.node_of(broken) is None


def test_an_instance_told_a_label_the_kubelet_refuses_never_registers(sim_cluster):
    """kubernetes/kubernetes cmd/kubelet/app/options/options.go ValidateKubeletFlags: a kubelet given
    a node-restriction.kubernetes.io label exits before it registers; the same labels without it join."""
    labels = {"node-restriction.kubernetes.io/team": "a", "example.com/x": "y"}
    [broken] = sim_cluster.launch("t3.large", labels=labels)
    [healthy] = sim_cluster.launch("t3.medium", labels={"example.com/x": "y"})
    wait_for(lambda: (n := sim_cluster.node_of(healthy)) is not None and node_ready(n) == "True")
    assert sim_cluster.node_of(healthy).metadata.labels["example.com/x"] == "y"
    nodes = sim_cluster.controllers.controllers["nodes"]
    wait_for(lambda: broken in nodes.boot_failures, what="the boot failure")
    assert "the kubelet refuses to start" in nodes.boot_failures[broken]
    assert "node-restriction.kubernetes.io/team" in nodes.boot_failures[broken]
    assert sim_cluster.node_of(broken) is None
