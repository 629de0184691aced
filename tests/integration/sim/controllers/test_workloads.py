"""Deployments, DaemonSets, scheduling constraints and PDB status, driven through the kubernetes client."""

import pytest
from kubernetes import client as k8s

from sim.testing import wait_for

from .conftest import node_ready

pytestmark = pytest.mark.integration

NS = "default"


def deployment(name, replicas, cpu="500m", memory="256Mi", **pod_spec):
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "nginx:1.27",
                            "resources": {"requests": {"cpu": cpu, "memory": memory}},
                        }
                    ],
                    **pod_spec,
                },
            },
        },
    }


def pods_of(cluster, app, namespace=NS):
    return cluster.core.list_namespaced_pod(namespace, label_selector=f"app={app}").items


def running(pods):
    return [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def ready_nodes(cluster, count):
    return wait_for(
        lambda: len([n for n in cluster.core.list_node().items if node_ready(n) == "True"]) >= count,
        what=f"{count} Ready nodes",
    )


def test_deployment_replicas_run_and_replacements_are_scheduled(sim_cluster):
    sim_cluster.launch("m5.large", count=2)
    ready_nodes(sim_cluster, 2)
    sim_cluster.apps.create_namespaced_deployment(NS, deployment("web", 4))
    pods = wait_for(lambda: len(r := running(pods_of(sim_cluster, "web"))) == 4 and r, what="4 running pods")
    nodes = {n.metadata.name: n for n in sim_cluster.core.list_node().items}
    assert {p.spec.node_name for p in pods} == set(nodes)  # least-allocated spreads them over both nodes
    for pod in pods:
        assert pod.status.start_time and pod.status.pod_ip and pod.status.host_ip
        assert pod.status.container_statuses[0].ready
        assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "True"
        owner = pod.metadata.owner_references[0]
        assert owner.kind == "ReplicaSet" and owner.controller and owner.name.startswith("web-")
    status = wait_for(
        lambda: (d := sim_cluster.apps.read_namespaced_deployment("web", NS).status).ready_replicas == 4 and d
    )
    assert status.available_replicas == 4 and status.updated_replicas == 4

    # A deleted pod is replaced by a new one, which gets scheduled and started.
    victim = pods[0].metadata.name
    sim_cluster.core.delete_namespaced_pod(victim, NS)
    wait_for(
        lambda: (
            len(r := running(pods_of(sim_cluster, "web"))) == 4 and victim not in {p.metadata.name for p in r}
        ),
        what="a replacement for the deleted pod",
    )
    # So is an evicted one (the Eviction API, as karpflow's drain uses it).
    victim = running(pods_of(sim_cluster, "web"))[0].metadata.name
    sim_cluster.core.create_namespaced_pod_eviction(
        victim, NS, k8s.V1Eviction(metadata=k8s.V1ObjectMeta(name=victim, namespace=NS))
    )
    wait_for(
        lambda: (
            len(r := running(pods_of(sim_cluster, "web"))) == 4 and victim not in {p.metadata.name for p in r}
        ),
        what="a replacement for the evicted pod",
    )
    # Scaling down removes pods; the status follows.
    sim_cluster.apps.patch_namespaced_deployment("web", NS, {"spec": {"replicas": 1}})
    wait_for(lambda: len(running(pods_of(sim_cluster, "web"))) == 1, what="scale down to 1")
    wait_for(lambda: sim_cluster.apps.read_namespaced_deployment("web", NS).status.replicas == 1)


def test_a_template_change_moves_the_replicas_to_a_new_replicaset(sim_cluster):
    sim_cluster.launch("m5.large")
    ready_nodes(sim_cluster, 1)
    sim_cluster.apps.create_namespaced_deployment(NS, deployment("api", 2))
    wait_for(lambda: len(running(pods_of(sim_cluster, "api"))) == 2)
    sim_cluster.apps.patch_namespaced_deployment(
        "api", NS, {"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}
    )

    def moved():
        sets = sim_cluster.apps.list_namespaced_replica_set(NS, label_selector="app=api").items
        new = [rs for rs in sets if rs.spec.replicas == 2]
        pods = running(pods_of(sim_cluster, "api"))
        return (
            len(sets) == 2
            and len(new) == 1
            and len(pods) == 2
            and all(p.metadata.owner_references[0].name == new[0].metadata.name for p in pods)
        )

    wait_for(moved, what="the pods to move to the new ReplicaSet")


def test_scheduling_honours_resources_selectors_affinity_and_taints(sim_cluster):
    sim_cluster.launch("m5.large", labels={"pool": "general"})
    sim_cluster.launch("c5.large", labels={"pool": "gpu"}, taints="dedicated=gpu:NoSchedule")
    ready_nodes(sim_cluster, 2)
    by_pool = {n.metadata.labels["pool"]: n.metadata.name for n in sim_cluster.core.list_node().items}

    # Too big for any node: stays Pending, marked Unschedulable.
    sim_cluster.apps.create_namespaced_deployment(NS, deployment("huge", 1, cpu="64"))
    # Needs the tainted node: selects it and tolerates its taint.
    tolerant = deployment(
        "tolerant",
        2,
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
    )
    sim_cluster.apps.create_namespaced_deployment(NS, tolerant)
    # Selects the tainted node without tolerating it: never placed.
    sim_cluster.apps.create_namespaced_deployment(
        NS, deployment("intolerant", 1, nodeSelector={"pool": "gpu"})
    )
    # Required node affinity (NotIn the tainted pool) lands on the general node.
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["gpu"]}]}
                ]
            }
        }
    }
    sim_cluster.apps.create_namespaced_deployment(NS, deployment("affine", 2, affinity=affinity))

    wait_for(lambda: len(running(pods_of(sim_cluster, "tolerant"))) == 2, what="tolerant pods running")
    wait_for(lambda: len(running(pods_of(sim_cluster, "affine"))) == 2, what="affine pods running")
    assert {p.spec.node_name for p in pods_of(sim_cluster, "tolerant")} == {by_pool["gpu"]}
    assert {p.spec.node_name for p in pods_of(sim_cluster, "affine")} == {by_pool["general"]}

    def unschedulable(app):
        pods = pods_of(sim_cluster, app)
        return pods and all(
            p.spec.node_name is None
            and any(
                c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or []
            )
            for p in pods
        )

    wait_for(lambda: unschedulable("huge") and unschedulable("intolerant"), what="unschedulable pods marked")

    # Resources count: the c5.large (2 vCPU) takes no third 500m+ pod once it is full.
    sim_cluster.apps.patch_namespaced_deployment("tolerant", NS, {"spec": {"replicas": 5}})
    wait_for(lambda: len(running(pods_of(sim_cluster, "tolerant"))) == 3, what="a third tolerant pod")
    wait_for(lambda: len([p for p in pods_of(sim_cluster, "tolerant") if p.spec.node_name is None]) == 2)

    # A cordoned node takes no new pods.
    sim_cluster.core.patch_node(by_pool["general"], {"spec": {"unschedulable": True}})
    sim_cluster.apps.patch_namespaced_deployment("affine", NS, {"spec": {"replicas": 3}})
    wait_for(
        lambda: unschedulable_count(sim_cluster, "affine") == 1, what="a pending pod on a cordoned cluster"
    )


def test_required_anti_affinity_leaves_the_second_replica_pending(sim_cluster):
    """Two replicas with required hostname anti-affinity, restricted to one node by a nodeSelector:
    the first runs, the second stays Pending, marked as kube-scheduler marks it (FitError's counted
    reasons, pkg/scheduler/framework/types.go) through the status subresource the client reads."""
    sim_cluster.launch("m5.large", labels={"pool": "only"})
    sim_cluster.launch("m5.large", labels={"pool": "other"})
    ready_nodes(sim_cluster, 2)
    by_pool = {n.metadata.labels["pool"]: n.metadata.name for n in sim_cluster.core.list_node().items}
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "solo"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    sim_cluster.apps.create_namespaced_deployment(
        NS, deployment("solo", 2, nodeSelector={"pool": "only"}, affinity=anti)
    )
    wait_for(lambda: len(running(pods_of(sim_cluster, "solo"))) == 1, what="one replica running")

    def pending_condition():
        waiting = [p for p in pods_of(sim_cluster, "solo") if p.spec.node_name is None]
        if len(waiting) != 1:
            return None
        return next((c for c in waiting[0].status.conditions or [] if c.type == "PodScheduled"), None)

    cond = wait_for(pending_condition, what="the second replica marked unschedulable")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    assert cond.message == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) didn't match pod anti-affinity rules."
    )
    assert {p.spec.node_name for p in running(pods_of(sim_cluster, "solo"))} == {by_pool["only"]}
    # It stays so: another look at the cluster changes nothing.
    assert [p.spec.node_name for p in pods_of(sim_cluster, "solo")].count(None) == 1


def test_zone_spread_constraint_places_replicas_evenly(sim_cluster):
    """PodTopologySpread DoNotSchedule, maxSkew 1 over two zones whose nodes differ in size: the
    replicas alternate zones (LeastAllocated alone would fill the big node first)."""
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in sim_cluster.ec2.describe_subnets()["Subnets"]}
    sim_cluster.launch("m5.large", SubnetId=subnets["us-west-2a"])
    sim_cluster.launch("m5.4xlarge", SubnetId=subnets["us-west-2b"])
    ready_nodes(sim_cluster, 2)
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "even"}},
        }
    ]
    sim_cluster.apps.create_namespaced_deployment(
        NS, deployment("even", 4, cpu="100m", topologySpreadConstraints=spread)
    )
    pods = wait_for(lambda: len(r := running(pods_of(sim_cluster, "even"))) == 4 and r, what="4 replicas")
    zones = {
        n.metadata.name: n.metadata.labels["topology.kubernetes.io/zone"]
        for n in sim_cluster.core.list_node().items
    }
    per_zone: dict[str, int] = {}
    for pod in pods:
        per_zone[zones[pod.spec.node_name]] = per_zone.get(zones[pod.spec.node_name], 0) + 1
    assert per_zone == {"us-west-2a": 2, "us-west-2b": 2}


def unschedulable_count(cluster, app):
    return len([p for p in pods_of(cluster, app) if p.spec.node_name is None])


def test_daemonset_runs_one_pod_per_matching_node(sim_cluster):
    sim_cluster.launch("m5.large", count=2, labels={"agents": "yes"})
    sim_cluster.launch("m5.large", labels={"agents": "no"})
    sim_cluster.launch("m5.large", labels={"agents": "yes"}, taints="special=x:NoSchedule")
    ready_nodes(sim_cluster, 4)
    ds = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "kube-system"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "nodeSelector": {"agents": "yes"},
                    "containers": [
                        {"name": "a", "image": "agent:1", "resources": {"requests": {"cpu": "50m"}}}
                    ],
                },
            },
        },
    }
    sim_cluster.apps.create_namespaced_daemon_set("kube-system", ds)
    nodes = {n.metadata.name: n for n in sim_cluster.core.list_node().items}
    eligible = {
        name for name, n in nodes.items() if n.metadata.labels["agents"] == "yes" and not n.spec.taints
    }
    assert len(eligible) == 2

    def placed():
        pods = running(pods_of(sim_cluster, "agent", "kube-system"))
        return len(pods) == 2 and {p.spec.node_name for p in pods} == eligible and pods

    pods = wait_for(placed, what="one agent per eligible node")
    tolerated = {(t.key, t.effect) for t in pods[0].spec.tolerations}
    assert ("node.kubernetes.io/unschedulable", "NoSchedule") in tolerated
    assert ("karpenter.sh/disrupted", "NoSchedule") not in tolerated
    status = wait_for(
        lambda: (
            (s := sim_cluster.apps.read_namespaced_daemon_set("agent", "kube-system").status).number_ready
            == 2
            and s
        )
    )
    assert status.desired_number_scheduled == 2 and status.current_number_scheduled == 2

    # A cordon does not stop daemon pods; a new matching node gets one; a deleted pod comes back.
    target = sorted(eligible)[0]
    sim_cluster.core.patch_node(target, {"spec": {"unschedulable": True}})
    victim = next(p.metadata.name for p in pods if p.spec.node_name == target)
    sim_cluster.core.delete_namespaced_pod(victim, "kube-system")
    sim_cluster.launch("c5.large", labels={"agents": "yes"})
    wait_for(
        lambda: (
            len(r := running(pods_of(sim_cluster, "agent", "kube-system"))) == 3
            and target in {p.spec.node_name for p in r}
        ),
        what="agents on 3 nodes, the cordoned one included",
    )


def test_pdb_status_follows_pod_health(sim_cluster):
    sim_cluster.launch("c5.large")  # 2 vCPU: room for two 800m pods only
    ready_nodes(sim_cluster, 1)
    sim_cluster.apps.create_namespaced_deployment(NS, deployment("db", 3, cpu="800m"))
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": NS},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}},
    }
    sim_cluster.policy.create_namespaced_pod_disruption_budget(NS, pdb)

    def pdb_status():
        return sim_cluster.policy.read_namespaced_pod_disruption_budget("db", NS).status

    status = wait_for(
        lambda: (s := pdb_status()) and s.current_healthy == 2 and s.expected_pods == 3 and s,
        what="2 of 3 healthy",
    )
    assert status.desired_healthy == 2 and status.disruptions_allowed == 0
    assert status.observed_generation == 1

    sim_cluster.launch("c5.large")  # room for the third
    status = wait_for(lambda: (s := pdb_status()).current_healthy == 3 and s, what="3 healthy")
    assert status.disruptions_allowed == 1
    assert {c.type: c.status for c in status.conditions}["DisruptionAllowed"] == "True"


def daemonset(name, namespace="kube-system"):
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "a", "image": "agent:1"}]},
            },
        },
    }


def test_a_node_being_deleted_keeps_its_daemon_pods_until_it_is_gone(sim_cluster_factory):
    """NodeShouldRunDaemonPod (pkg/controller/daemon/daemon_controller.go) reads no deletionTimestamp:
    a finalizer holding a deleted node keeps its daemon pods; once the Node is gone they are the pod
    GC's (pkg/controller/podgc/gc_controller.go: marked Failed, DisruptionTarget, then deleted)."""
    from sim.controllers.nodes import NodeTimings

    cluster = sim_cluster_factory(NodeTimings(delete=0))
    [first] = cluster.launch("m5.large")
    ready_nodes(cluster, 1)
    name = cluster.node_of(first).metadata.name
    cluster.apps.create_namespaced_daemon_set("kube-system", daemonset("agent"))
    (agent,) = wait_for(lambda: running(pods_of(cluster, "agent", "kube-system")), what="the agent")
    cluster.core.patch_node(name, {"metadata": {"finalizers": ["karpenter.sh/termination"]}})
    cluster.core.delete_node(name)
    # The controller has seen the deletion once it has placed an agent on a node launched after it.
    [second] = cluster.launch("m5.large")
    wait_for(lambda: len(running(pods_of(cluster, "agent", "kube-system"))) == 2, what="a second agent")
    kept = cluster.core.read_namespaced_pod(agent.metadata.name, "kube-system")
    assert kept.metadata.uid == agent.metadata.uid and kept.metadata.deletion_timestamp is None
    assert cluster.core.read_node(name).metadata.deletion_timestamp is not None

    cluster.core.patch_node(name, {"metadata": {"finalizers": None}})
    wait_for(lambda: cluster.node_of(first) is None, what="the node to go")
    wait_for(
        lambda: (
            agent.metadata.name not in {p.metadata.name for p in pods_of(cluster, "agent", "kube-system")}
        ),
        what="the pod GC to collect the agent of the gone node",
    )
    assert [p.spec.node_name for p in pods_of(cluster, "agent", "kube-system")] == [
        cluster.node_of(second).metadata.name
    ]


def test_an_unreachable_node_loses_its_pods_after_their_toleration_seconds(sim_cluster_factory):
    """The node lifecycle controller taints an unreachable node NoExecute
    (pkg/controller/nodelifecycle/node_lifecycle_controller.go) and the taint manager deletes each pod
    when its tolerationSeconds run out (pkg/controller/tainteviction/taint_eviction.go): the 300 s
    DefaultTolerationSeconds default, 10 s where a pod says so, never for a daemon pod."""
    from sim.controllers.nodes import NodeTimings

    cluster = sim_cluster_factory(NodeTimings(delete=0))
    [instance] = cluster.launch("m5.large")
    ready_nodes(cluster, 1)
    name = cluster.node_of(instance).metadata.name
    cluster.core.patch_node(name, {"metadata": {"finalizers": ["karpenter.sh/termination"]}})
    cluster.apps.create_namespaced_daemon_set("kube-system", daemonset("agent"))
    brief = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
              "tolerationSeconds": 10}]  # fmt: skip
    cluster.apps.create_namespaced_deployment(NS, deployment("brief", 1, cpu="10m", tolerations=brief))
    cluster.apps.create_namespaced_deployment(NS, deployment("patient", 1, cpu="10m"))
    for app, ns in (("agent", "kube-system"), ("brief", NS), ("patient", NS)):
        wait_for(lambda app=app, ns=ns: running(pods_of(cluster, app, ns)), what=f"{app} running")
    (patient,) = running(pods_of(cluster, "patient"))
    assert {(t.key, t.toleration_seconds) for t in patient.spec.tolerations} >= {
        ("node.kubernetes.io/unreachable", 300)
    }

    cluster.ec2.terminate_instances(
        InstanceIds=[instance]
    )  # the kubelet goes silent; a finalizer holds the node

    def evicted(app):
        """Its pod on the node is Terminating, or already gone."""
        on_node = [p for p in pods_of(cluster, app) if p.spec.node_name == name]
        return all(p.metadata.deletion_timestamp for p in on_node)

    wait_for(lambda: evicted("brief"), what="the 10 s toleration to run out")
    node = cluster.core.read_node(name)
    assert ("node.kubernetes.io/unreachable", "NoExecute") in {(t.key, t.effect) for t in node.spec.taints}
    wait_for(lambda: evicted("patient"), timeout=20, what="the 300 s default toleration to run out")
    (agent,) = [p for p in pods_of(cluster, "agent", "kube-system") if p.spec.node_name == name]
    assert agent.metadata.deletion_timestamp is None  # daemon pods tolerate unreachable for ever
