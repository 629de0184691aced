"""The simulator process's stack through real clients: the official kubernetes client, kubectl, boto3."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from kubernetes import client as k8s

from api import constants as k
from sim.invariants import InvariantBounds
from sim.scenario import load_scenario
from sim.stack import SimStack, SimStackError
from sim.testing import DEMO, SMALL, assert_no_violations, kubectl, wait_for

pytestmark = pytest.mark.integration


def http(stack: SimStack, method: str, path: str, body: bytes | None = None) -> Any:
    request = urllib.request.Request(f"{stack.kube_url}{path}", data=body, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def instances_of(stack: SimStack) -> dict[str, dict[str, Any]]:
    pages = (
        stack.ec2_client()
        .get_paginator("describe_instances")
        .paginate(Filters=[{"Name": f"tag:{k.cluster_tag(stack.cluster_name)}", "Values": ["owned"]}])
    )
    return {i["InstanceId"]: i for p in pages for r in p["Reservations"] for i in r["Instances"]}


def test_the_stack_starts_and_stops_cleanly(make_sim_stack):
    stack = make_sim_stack()
    assert urllib.request.urlopen(f"{stack.kube_url}/readyz", timeout=5).read() == b"ok"
    assert stack.ec2_client().describe_regions()["Regions"]
    port, kubeconfig = stack.kube_port, stack.kubeconfig_path
    assert kubeconfig.is_file()
    stack.stop()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    assert not kubeconfig.exists()  # the temporary kubeconfig goes with the stack
    with (
        pytest.raises(SimStackError, match="already running"),
        SimStack(scenario=None),
        SimStack(scenario=None),
    ):
        pass


def test_the_scenario_seeds_nodes_with_matching_instances(sim_stack):
    core = k8s.CoreV1Api(sim_stack.api_client())
    nodes = core.list_node().items
    instances = instances_of(sim_stack)
    assert len(nodes) == len(load_scenario(SMALL).of_kind("Node")) == len(instances)
    for node in nodes:
        labels = node.metadata.labels
        instance = instances[node.spec.provider_id.rsplit("/", 1)[-1]]
        assert (
            node.spec.provider_id
            == f"aws:///{instance['Placement']['AvailabilityZone']}/{instance['InstanceId']}"
        )
        assert instance["State"]["Name"] == "running"
        assert instance["InstanceType"] == labels[k.INSTANCE_TYPE_LABEL]
        assert instance["Placement"]["AvailabilityZone"] == labels[k.ZONE_LABEL]
        assert instance.get("InstanceLifecycle", "on-demand") == labels[k.CAPACITY_TYPE_LABEL]
        # The AMI, subnet and groups are EC2's to say: the simulator adds no label of its own.
        assert not [key for key in labels if key.startswith("karpflow.io/") or key.endswith("-ami-id")]
        assert not [key for key in node.metadata.annotations or {} if key.startswith("karpflow.io/security")]
        tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
        assert tags[k.TAG_NODE_NAME] == node.metadata.name
        assert tags[k.TAG_NODEPOOL] == labels[k.NODEPOOL_LABEL]
        # The private IP was kept, so the name is the one a kubelet on this instance registers.
        assert (
            node.metadata.name
            == f"ip-{instance['PrivateIpAddress'].replace('.', '-')}.us-west-2.compute.internal"
        )
        assert node.metadata.finalizers == [k.TERMINATION_FINALIZER]
        assert node.metadata.creation_timestamp.year < time.gmtime().tm_year + 1
    # Ages survive seeding (expiration depends on them): the busy node is nine days old.
    busy = core.read_node("ip-172-31-1-10.us-west-2.compute.internal")
    age = time.time() - busy.metadata.creation_timestamp.timestamp()
    assert 8.9 * 86400 < age < 9.1 * 86400
    # The EC2NodeClass status names what moto has.
    nodeclass = k8s.CustomObjectsApi(sim_stack.api_client()).get_cluster_custom_object(
        "karpenter.k8s.aws", "v1", "ec2nodeclasses", "default"
    )
    subnets = {s["id"] for s in nodeclass["status"]["subnets"]}
    assert {i["SubnetId"] for i in instances.values()} <= subnets
    assert {i["ImageId"] for i in instances.values()} <= {a["id"] for a in nodeclass["status"]["amis"]}
    profile = nodeclass["status"]["instanceProfile"]
    assert all(i["IamInstanceProfile"]["Arn"].endswith(f"/{profile}") for i in instances.values())
    # Pods stay bound and keep working owner references.
    pods = core.list_pod_for_all_namespaces().items
    assert pods and all(p.spec.node_name for p in pods)
    apps = k8s.AppsV1Api(sim_stack.api_client())
    replicasets = {rs.metadata.uid: rs for rs in apps.list_replica_set_for_all_namespaces().items}
    web = [p for p in pods if p.metadata.labels.get("app") == "web"]
    assert web and all(p.metadata.owner_references[0].uid in replicasets for p in web)


def test_kubectl_lists_the_scenario_nodes(sim_stack):
    names = kubectl(sim_stack, "get", "nodes", "-o", "name").split()
    assert sorted(names) == sorted(
        f"node/{n['metadata']['name']}" for n in load_scenario(SMALL).of_kind("Node")
    )
    wide = kubectl(sim_stack, "get", "pods", "-A", "-o", "wide")
    assert "web-" in wide and "Running" in wide


@pytest.mark.sim_stack(scenario=DEMO)
def test_a_quiet_cluster_has_no_violations(sim_stack):
    time.sleep(1.0)  # a hundred simulated seconds: pods start, PDB status, several EC2 polls
    report = sim_stack.check_invariants()
    assert report.ok, report.summary()
    assert report.observed["nodes"] == 13 and report.observed["instances"] == 13
    assert report.observed["instance-polls"] >= 2 and report.observed["pdbs"] == 5


# Without the ReplicaSet controller no replacement pod restores the budget between the steps.
@pytest.mark.sim_stack(controllers=["nodes", "scheduler", "kubelet", "pdb"])
def test_deleting_pods_past_the_budget_is_a_pdb_violation(sim_stack):
    core = k8s.CoreV1Api(sim_stack.api_client())
    policy = k8s.PolicyV1Api(sim_stack.api_client())
    wait_for(
        lambda: policy.read_namespaced_pod_disruption_budget("web", "shop").status.disruptions_allowed == 1,
        what="the web PDB to allow one disruption",
    )
    web = sorted(p.metadata.name for p in core.list_namespaced_pod("shop", label_selector="app=web").items)
    # One eviction is within minAvailable 2 of 3; the second is refused by the API (429).
    core.create_namespaced_pod_eviction(
        web[0], "shop", k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=web[0]))
    )
    with pytest.raises(k8s.ApiException) as refused:
        core.create_namespaced_pod_eviction(
            web[1], "shop", k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=web[1]))
        )
    assert refused.value.status == 429
    assert sim_stack.check_invariants().ok
    # Deleting the pod directly bypasses the budget: that is the violation.
    core.delete_namespaced_pod(web[1], "shop")
    report = sim_stack.check_invariants()
    assert [(v.invariant, v.subject, v.details["cause"]) for v in report.violations] == [
        ("pdb-violation", f"pod shop/{web[1]}", "delete")
    ]
    assert report.observed["evictions"] == 1 and report.observed["api-deletions"] == 1


def test_evicting_a_do_not_disrupt_pod_is_reported(sim_stack):
    core = k8s.CoreV1Api(sim_stack.api_client())
    trainer = core.list_namespaced_pod("ml", label_selector="app=trainer").items[0].metadata.name
    core.create_namespaced_pod_eviction(
        trainer, "ml", k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=trainer))
    )
    report = sim_stack.check_invariants()
    assert [(v.invariant, v.subject) for v in report.violations] == [("do-not-disrupt", f"pod ml/{trainer}")]


@pytest.mark.sim_stack(invariant_bounds=InvariantBounds(node_gone=30, registration=50))
def test_an_instance_whose_node_is_deleted_by_hand_is_a_leak(sim_stack):
    node = "ip-172-31-2-30.us-west-2.compute.internal"  # the empty node
    instance_id = sim_stack.store.get("nodes", node)["spec"]["providerID"].rsplit("/", 1)[-1]
    kubectl(sim_stack, "delete", "node", node, "--wait=false")
    # A buggy terminator drops the finalizer without terminating the instance.
    kubectl(sim_stack, "patch", "node", node, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    report = wait_for(lambda: (r := sim_stack.check_invariants()).violations and r, what="a leak report")
    assert [(v.invariant, v.subject) for v in report.violations] == [
        ("leaked-instance", f"instance {instance_id}")
    ]
    assert "after its Node was deleted" in report.violations[0].message


@pytest.mark.sim_stack(
    scenario=None, controllers=["scheduler", "kubelet"], invariant_bounds=InvariantBounds(registration=50)
)
def test_an_owned_instance_that_never_registers_is_a_leak(sim_stack):
    ec2 = sim_stack.ec2_client()
    image = ec2.describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": ["al2023-ami-2023*x86_64"]}]
    )
    instance = ec2.run_instances(
        ImageId=image["Images"][0]["ImageId"],
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {
                "ResourceType": "instance",
                "Tags": [{"Key": k.cluster_tag(sim_stack.cluster_name), "Value": "owned"}],
            }
        ],
    )["Instances"][0]
    assert sim_stack.check_invariants().ok  # within the registration bound (0.5 s here)
    report = wait_for(lambda: (r := sim_stack.check_invariants()).violations and r, what="a leak report")
    assert [(v.invariant, v.subject) for v in report.violations] == [
        ("leaked-instance", f"instance {instance['InstanceId']}")
    ]
    assert "since launch" in report.violations[0].message


@pytest.mark.sim_stack(invariant_bounds=InvariantBounds(orphan_node=60, orphan_min_wall=0))
def test_a_node_whose_instance_is_gone_is_an_orphan(sim_stack):
    node = "ip-172-31-2-30.us-west-2.compute.internal"
    instance_id = sim_stack.store.get("nodes", node)["spec"]["providerID"].rsplit("/", 1)[-1]
    sim_stack.ec2_client().terminate_instances(InstanceIds=[instance_id])
    # The simulated node controllers mark it NotReady, then delete it; the finalizer keeps it.
    report = wait_for(lambda: (r := sim_stack.check_invariants()).violations and r, what="an orphan report")
    assert [(v.invariant, v.subject) for v in report.violations] == [("orphan-node", f"node {node}")]


def test_a_disrupted_taint_left_behind_is_reported(sim_stack):
    node = "ip-172-31-17-20.us-west-2.compute.internal"
    kubectl(sim_stack, "taint", "node", node, f"{k.DISRUPTED_TAINT_KEY}:NoSchedule")
    assert sim_stack.check_invariants(in_flight=[node]).ok  # a disruption is working on it
    blind = http(sim_stack, "GET", "/sim/invariants")  # no in-flight list: cannot judge, records nothing
    assert blind["ok"] and blind["unjudged"] == {"stale-disrupted-taint": [f"node {node}"]}
    report = sim_stack.check_invariants(end_of_window=True)  # none is: the end of the window judges
    assert [(v.invariant, v.subject) for v in report.violations] == [
        ("stale-disrupted-taint", f"node {node}")
    ]


def test_the_emulators_reset_and_load_keep_the_stack_consistent(sim_stack):
    old = set(instances_of(sim_stack))
    before = sim_stack.store.resource_version
    reset = http(sim_stack, "POST", "/sim/reset", b"{}")
    assert reset["resourceVersion"] > before and sim_stack.store.count("nodes") == 0
    # Done as DELETE /sim/scenario: the instances go with their nodes, the controllers still run.
    states = {i: d["State"]["Name"] for i, d in instances_of(sim_stack).items()}
    assert old and all(states[i] == "terminated" for i in old)
    assert http(sim_stack, "GET", "/sim/status")["controllers"] is not None
    assert_no_violations(sim_stack)  # no orphan nodes nor leaked instances left behind
    with pytest.raises(urllib.error.HTTPError) as err:
        http(sim_stack, "POST", "/sim/state", json.dumps(sim_stack.store.dump()).encode())
    assert err.value.code == 400 and "/sim/scenario" in json.loads(err.value.read())["message"]


def test_the_sim_endpoints(sim_stack):
    status = http(sim_stack, "GET", "/sim/status")
    assert status["ready"] and status["scenario"]["created"]["Node"] == 3
    assert status["controllers"]["nodes"]["polls"] >= 0
    report = http(sim_stack, "GET", "/sim/invariants")
    assert report["ok"] is True and report["observed"]["nodes"] == 3
    spec = {
        "insufficient_capacity": [
            {"instance_type": "m5.large", "zone": "us-west-2a", "capacity_type": "spot"}
        ]
    }
    faults = http(sim_stack, "PUT", "/sim/ec2/faults", json.dumps(spec).encode())
    assert faults["spec"]["insufficient_capacity"][0]["instance_type"] == "m5.large"
    assert sim_stack.faults.exhausted("m5.large", "us-west-2a", "spot")
    assert http(sim_stack, "DELETE", "/sim/ec2/faults")["spec"]["insufficient_capacity"] == []
    # Loading a scenario replaces the cluster: the old instances are terminated.
    old = set(instances_of(sim_stack))
    reloaded = http(sim_stack, "POST", "/sim/scenario", SMALL.read_bytes())
    assert reloaded["created"]["Node"] == 3 and not set(reloaded["instances"].values()) & old
    states = {i: d["State"]["Name"] for i, d in instances_of(sim_stack).items()}
    assert all(states[i] == "terminated" for i in old)
    assert len(kubectl(sim_stack, "get", "nodes", "-o", "name").split()) == 3
    assert_no_violations(sim_stack)
