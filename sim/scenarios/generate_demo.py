"""Generate `demo.yaml` (a fragmented 13-node cluster that gives every disruption method work to
do) and `small.yaml` (three nodes, for tests):

    python -m sim.scenarios.generate_demo

The output has the shape of `kubectl get nodes,pods,pdb,deploy,rs,ds,nodepools,ec2nodeclasses -A
-o yaml` (one `kind: List`). Capacity, allocatable and instance labels come from the planner's
catalog, so the planner and the simulator see the same numbers. What is in it:

- NodePools `default` (on-demand + spot, c/m/r, WhenEmptyOrUnderutilized, 20% budget), `batch`
  (spot only, tainted, WhenEmpty, one node at a time) and `arm` (Graviton, no consolidation
  during business hours); EC2NodeClasses `default` and `batch` (status is resolved from moto on load).
- Nodes in us-west-2a/b, on-demand and spot (the notes in `NODES`, repeated in the YAML header),
  each there for one part of the story:
  - `.5.90` is older than expireAfter: expiration deletes it (pass 1);
  - `.4.70` (only a DaemonSet pod) and `.6.110` (an empty batch node, WhenEmpty): emptiness (pass 1);
  - `.20.80` carries a stale nodepool-hash: drift (pass 2). It runs `shop/sessions`, one 12Gi replica
    pinned to us-west-2b (amd64 image), and no other us-west-2b node has 12Gi free, so drift cannot
    just delete it: the planner **replaces** it, and the DisruptionWorkflow launches an r5.large in
    moto, waits for it to register and initialize, then drains the old node onto it;
  - `.3.50` (spot, nearly empty), `.18.40` (spot, half full) and the busy m5.xlarge `.1.10` and
    `.17.20`: multi- and single-node consolidation delete them, their pods fit elsewhere; `.22.120`
    (arm, busy) goes too, onto the nearly empty arm node `.7.130`, but only outside weekday
    business hours (UTC), when the arm pool's budget allows consolidation;
  - `.2.30` (m5.2xlarge, nearly empty) is where consolidation packs the pods; `.19.60` runs a
    `karpenter.sh/do-not-disrupt` pod and is left alone; `.21.100` is a busy batch node.
- Deployments with PDBs, coredns at system-cluster-critical, a node-exporter DaemonSet on every node.

Private IPs sit inside moto's default subnets, so node names are the ones the simulated kubelet
would register for the seeded instances. Timestamps are relative to `CAPTURED_AT`; the loader
shifts them to "now" (annotation `karpflow.io/captured-at` on the List).
"""

from __future__ import annotations

import hashlib
import sys
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from api import constants as k
from api.nodepool import EC2NodeClass, NodePool
from api.quantity import format_bytes, format_millicores
from planner.catalog import bundled_catalog
from planner.drift import nodeclass_hash_annotations, nodepool_hash_annotations

CLUSTER = "karpflow-dev"
REGION = "us-west-2"
CAPTURED_AT = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
CAPTURED_AT_ANNOTATION = "karpflow.io/captured-at"
CATALOG = bundled_catalog(REGION)
ZONE_IDS = {"us-west-2a": "usw2-az2", "us-west-2b": "usw2-az1"}


def uid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "karpflow-demo/" + "/".join(parts)))


def ts(ago: timedelta) -> str:
    return (CAPTURED_AT - ago).strftime("%Y-%m-%dT%H:%M:%SZ")


def short_hash(*parts: str, length: int = 10) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


# ----------------------------------------------------------------------------------------------
# NodePools and EC2NodeClasses


def requirement(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


NODEPOOL_SPECS: dict[str, dict[str, Any]] = {
    "default": {
        "template": {
            "spec": {
                "nodeClassRef": {"group": k.AWS_GROUP, "kind": "EC2NodeClass", "name": "default"},
                "requirements": [
                    requirement(k.CAPACITY_TYPE_LABEL, "In", "on-demand", "spot"),
                    requirement(k.ARCH_LABEL, "In", "amd64"),
                    requirement("karpenter.k8s.aws/instance-category", "In", "c", "m", "r"),
                    requirement("karpenter.k8s.aws/instance-generation", "Gt", "4"),
                    requirement(k.ZONE_LABEL, "In", "us-west-2a", "us-west-2b"),
                ],
                "expireAfter": "720h",
            }
        },
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": "1m",
            "budgets": [{"nodes": "20%"}],
        },
        "limits": {"cpu": "200"},
    },
    "batch": {
        "template": {
            "metadata": {"labels": {"workload": "batch"}},
            "spec": {
                "nodeClassRef": {"group": k.AWS_GROUP, "kind": "EC2NodeClass", "name": "batch"},
                "requirements": [
                    requirement(k.CAPACITY_TYPE_LABEL, "In", "spot"),
                    requirement("karpenter.k8s.aws/instance-category", "In", "c"),
                    requirement(k.ZONE_LABEL, "In", "us-west-2a", "us-west-2b"),
                ],
                "taints": [{"key": "workload", "value": "batch", "effect": "NoSchedule"}],
                "expireAfter": "168h",
            },
        },
        "disruption": {
            "consolidationPolicy": "WhenEmpty",
            "consolidateAfter": "2m",
            "budgets": [{"nodes": "1"}],
        },
    },
    "arm": {
        "template": {
            "spec": {
                "nodeClassRef": {"group": k.AWS_GROUP, "kind": "EC2NodeClass", "name": "default"},
                "requirements": [
                    requirement(k.ARCH_LABEL, "In", "arm64"),
                    requirement(k.CAPACITY_TYPE_LABEL, "In", "on-demand"),
                    requirement("karpenter.k8s.aws/instance-family", "In", "m7g", "m6g", "c6g"),
                ],
                "expireAfter": "720h",
            }
        },
        "disruption": {
            "consolidationPolicy": "WhenEmptyOrUnderutilized",
            "consolidateAfter": "5m",
            "budgets": [
                {"nodes": "1"},
                # No consolidation during business hours (UTC), drift and emptiness still allowed.
                {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h", "reasons": ["Underutilized"]},
            ],
        },
    },
}

NODECLASS_SPECS: dict[str, dict[str, Any]] = {
    name: {
        "role": f"KarpenterNodeRole-{CLUSTER}",
        "amiSelectorTerms": [{"alias": "al2023@latest"}],
        "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": CLUSTER}}],
        "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": CLUSTER}}],
        **extra,
    }
    for name, extra in {
        "default": {},
        "batch": {
            "blockDeviceMappings": [
                {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "100Gi", "volumeType": "gp3"}}
            ],
            "tags": {"team": "batch"},
        },
    }.items()
}

# Nodes carry the hashes karpflow itself stamps on the nodes it launches, so drift sees them as current.
NODEPOOL_STAMPS = {
    name: nodepool_hash_annotations(NodePool.model_validate({"metadata": {"name": name}, "spec": spec}))
    for name, spec in NODEPOOL_SPECS.items()
}
NODECLASS_STAMPS = {
    name: nodeclass_hash_annotations(EC2NodeClass.model_validate({"metadata": {"name": name}, "spec": spec}))
    for name, spec in NODECLASS_SPECS.items()
}


def nodepool(name: str, nodes: list[DemoNode]) -> dict[str, Any]:
    """A NodePool with the status Karpenter keeps: what its nodes add up to, and Ready."""
    members = [n for n in nodes if n.pool == name]
    capacity = [CATALOG.get(n.instance_type).capacity_resources for n in members]  # type: ignore[union-attr]
    ready = {  # Karpenter's status conditions always carry a message (its CRD requires one)
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": ts(timedelta(days=60)),
    }
    status = {
        "resources": {
            "cpu": format_millicores(sum(c.cpu for c in capacity)),
            "memory": format_bytes(sum(c.memory for c in capacity)),
            "ephemeral-storage": format_bytes(sum(c.ephemeral_storage for c in capacity)),
            "nodes": str(len(members)),
            "pods": str(sum(c.pods for c in capacity)),
        },
        "conditions": [
            {**ready, "type": "ValidationSucceeded"},
            {**ready, "type": "NodeClassReady"},
            {**ready, "type": "NodeRegistrationHealthy"},
            ready,
        ],
    }
    return {
        "apiVersion": f"{k.KARPENTER_GROUP}/{k.KARPENTER_VERSION}",
        "kind": "NodePool",
        "metadata": {
            "name": name,
            "uid": uid("nodepool", name),
            "creationTimestamp": ts(timedelta(days=60)),
            "annotations": NODEPOOL_STAMPS[name],
        },
        "spec": NODEPOOL_SPECS[name],
        "status": status,
    }


def nodeclass(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{k.AWS_GROUP}/{k.AWS_VERSION}",
        "kind": "EC2NodeClass",
        "metadata": {
            "name": name,
            "uid": uid("ec2nodeclass", name),
            "creationTimestamp": ts(timedelta(days=60)),
            "finalizers": ["karpenter.k8s.aws/termination"],
            "annotations": NODECLASS_STAMPS[name],
        },
        "spec": NODECLASS_SPECS[name],
        # Placeholder: the loader resolves amis, subnets and security groups against moto.
        "status": {
            "instanceProfile": f"{CLUSTER}_{short_hash(name)}",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Ready",
                    "message": "",
                    "lastTransitionTime": ts(timedelta(days=60)),
                }
            ],
        },
    }


# ----------------------------------------------------------------------------------------------
# Nodes


@dataclass
class DemoNode:
    ip: str
    instance_type: str
    zone: str
    capacity_type: str
    pool: str
    age: timedelta
    note: str
    stale_hash: bool = False
    pods: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"ip-{self.ip.replace('.', '-')}.{REGION}.compute.internal"

    @property
    def nodeclass(self) -> str:
        return NODEPOOL_SPECS[self.pool]["template"]["spec"]["nodeClassRef"]["name"]


# IPs inside moto's default subnets: 172.31.0.0/20 is us-west-2a, 172.31.16.0/20 is us-west-2b.
NODES = [
    DemoNode("172.31.1.10", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=9), "busy"),
    DemoNode("172.31.17.20", "m5.xlarge", "us-west-2b", "on-demand", "default", timedelta(days=9), "busy"),
    DemoNode(
        "172.31.2.30",
        "m5.2xlarge",
        "us-west-2a",
        "on-demand",
        "default",
        timedelta(days=4),
        "big, nearly empty",
    ),
    DemoNode("172.31.18.40", "c5.xlarge", "us-west-2b", "spot", "default", timedelta(days=3), "half full"),
    DemoNode("172.31.3.50", "m5.large", "us-west-2a", "spot", "default", timedelta(days=2), "nearly empty"),
    DemoNode(
        "172.31.19.60",
        "r5.large",
        "us-west-2b",
        "on-demand",
        "default",
        timedelta(days=6),
        "do-not-disrupt pod",
    ),
    DemoNode("172.31.4.70", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=1), "empty"),
    DemoNode(
        "172.31.20.80",
        "r5.large",
        "us-west-2b",
        "on-demand",
        "default",
        timedelta(days=12),
        "drifted; its 12Gi pod fits no other 2b node: replaced",
        stale_hash=True,
    ),
    DemoNode("172.31.5.90", "m5.large", "us-west-2a", "on-demand", "default", timedelta(days=31), "expired"),
    DemoNode("172.31.21.100", "c5.2xlarge", "us-west-2b", "spot", "batch", timedelta(days=2), "batch, busy"),
    DemoNode("172.31.6.110", "c5.xlarge", "us-west-2a", "spot", "batch", timedelta(hours=20), "batch, empty"),
    DemoNode("172.31.22.120", "m7g.large", "us-west-2b", "on-demand", "arm", timedelta(days=5), "arm, busy"),
    DemoNode(
        "172.31.7.130", "m7g.xlarge", "us-west-2a", "on-demand", "arm", timedelta(days=5), "arm, nearly empty"
    ),
]


def node(n: DemoNode) -> dict[str, Any]:
    itype = CATALOG.get(n.instance_type)
    assert itype is not None, n.instance_type
    template = NODEPOOL_SPECS[n.pool]["template"]
    labels = {
        **itype.labels,
        **template.get("metadata", {}).get("labels", {}),
        k.NODEPOOL_LABEL: n.pool,
        k.CAPACITY_TYPE_LABEL: n.capacity_type,
        k.INITIALIZED_LABEL: "true",
        k.REGISTERED_LABEL: "true",
        k.EC2NODECLASS_LABEL: n.nodeclass,
        k.ZONE_LABEL: n.zone,
        "topology.k8s.aws/zone-id": ZONE_IDS[n.zone],
        k.REGION_LABEL: REGION,
        k.HOSTNAME_LABEL: n.name,
        "beta.kubernetes.io/arch": itype.arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/instance-type": n.instance_type,
        "failure-domain.beta.kubernetes.io/region": REGION,
        "failure-domain.beta.kubernetes.io/zone": n.zone,
    }
    created = ts(n.age)
    # A drifted node still carries the hash of an older template (its NodePool was edited since).
    pool_stamp = dict(NODEPOOL_STAMPS[n.pool])
    if n.stale_hash:
        pool_stamp[k.NODEPOOL_HASH_ANNOTATION] = "0" + pool_stamp[k.NODEPOOL_HASH_ANNOTATION][1:][::-1]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": n.name,
            "uid": uid("node", n.name),
            "creationTimestamp": created,
            "labels": dict(sorted(labels.items())),
            "annotations": {
                **pool_stamp,
                **NODECLASS_STAMPS[n.nodeclass],
                "node.alpha.kubernetes.io/ttl": "0",
                "karpflow.io/demo-note": n.note,
            },
            "finalizers": [k.TERMINATION_FINALIZER],
        },
        "spec": {
            # Rewritten to the seeded instance's id by the loader.
            "providerID": f"aws:///{n.zone}/i-{short_hash(n.name, length=17)}",
            **({"taints": template["spec"]["taints"]} if template["spec"].get("taints") else {}),
        },
        "status": {
            "capacity": itype.capacity,
            "allocatable": itype.allocatable,
            "addresses": [
                {"type": "InternalIP", "address": n.ip},
                {"type": "InternalDNS", "address": n.name},
                {"type": "Hostname", "address": n.name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": ts(timedelta(seconds=20)),
                    "lastTransitionTime": created,
                }
            ],
            "nodeInfo": {
                "architecture": itype.arch,
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20250115",
                "kubeletVersion": "v1.32.0-eks-sim",
                "containerRuntimeVersion": "containerd://1.7.25",
                "kernelVersion": "6.1.124-134.200.amzn2023",
            },
        },
    }


# ----------------------------------------------------------------------------------------------
# Workloads


@dataclass
class Workload:
    namespace: str
    name: str
    cpu: str
    memory: str
    placement: list[str]  # node IP suffixes ("10", "20"...), one per replica
    pdb: dict[str, Any] | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)
    priority_class: str | None = None
    grace: int = 30

    @property
    def replicas(self) -> int:
        return len(self.placement)

    @property
    def template_hash(self) -> str:
        return short_hash(self.namespace, self.name)

    @property
    def rs_name(self) -> str:
        return f"{self.name}-{self.template_hash}"


WORKLOADS = [
    Workload(
        "shop", "web", "500m", "512Mi", ["10", "10", "20", "30", "40", "80", "90"], pdb={"maxUnavailable": 1}
    ),
    Workload(
        "shop",
        "api",
        "250m",
        "512Mi",
        ["120", "120", "120", "130"],
        pdb={"minAvailable": 3},
        node_selector={k.ARCH_LABEL: "arm64"},
    ),
    Workload("shop", "cache", "1", "2Gi", ["10", "20"], pdb={"minAvailable": 1}),
    Workload("shop", "checkout", "250m", "256Mi", ["40", "50", "60"], pdb={"minAvailable": "66%"}),
    Workload(
        "batch",
        "queue-worker",
        "1",
        "1Gi",
        ["100", "100", "100"],
        node_selector={k.NODEPOOL_LABEL: "batch"},
        tolerations=[{"key": "workload", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
    ),
    Workload(
        "shop",
        "sessions",
        "500m",
        "12Gi",
        ["80"],
        # Fits on no other us-west-2b node: drifting its node needs a replacement first.
        node_selector={k.ZONE_LABEL: "us-west-2b", k.ARCH_LABEL: "amd64"},
    ),
    Workload(
        "ml",
        "trainer",
        "1",
        "4Gi",
        ["60"],
        annotations={k.DO_NOT_DISRUPT_ANNOTATION: "true"},
        grace=120,
    ),
    Workload(
        "kube-system",
        "coredns",
        "100m",
        "70Mi",
        ["10", "20"],
        pdb={"maxUnavailable": 1},
        priority_class="system-cluster-critical",
    ),
]


def pod_spec(w: Workload, node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": w.name,
                "image": f"public.ecr.aws/karpflow/{w.name}:1.0",
                "resources": {"requests": {"cpu": w.cpu, "memory": w.memory}, "limits": {"memory": w.memory}},
            }
        ],
        "terminationGracePeriodSeconds": w.grace,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "tolerations": w.tolerations + list(k.DEFAULT_POD_TOLERATIONS),
    }
    if w.node_selector:
        spec["nodeSelector"] = w.node_selector
    if w.priority_class:
        spec["priorityClassName"] = w.priority_class
        spec["priority"] = 2000000000
    if node_name:
        spec["nodeName"] = node_name
    return spec


def running_status(node: DemoNode, index: int, started: str, container: str) -> dict[str, Any]:
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": node.ip,
        "podIP": f"{node.ip.rsplit('.', 1)[0]}.{200 + index}",
        "startTime": started,
        "qosClass": "Burstable",
        "containerStatuses": [
            {
                "name": container,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
        ],
    }


def workload_objects(w: Workload, nodes: list[DemoNode]) -> list[dict[str, Any]]:
    by_ip = {n.ip.rsplit(".", 1)[-1]: n for n in nodes}  # "10" -> the node at x.x.x.10
    labels = {"app": w.name}
    pod_labels = {**labels, "pod-template-hash": w.template_hash}
    created = ts(timedelta(days=30))
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": w.name,
            "namespace": w.namespace,
            "uid": uid("deploy", w.namespace, w.name),
            "creationTimestamp": created,
            "labels": labels,
        },
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, **({"annotations": w.annotations} if w.annotations else {})},
                "spec": pod_spec(w),
            },
        },
        "status": {
            "replicas": w.replicas,
            "readyReplicas": w.replicas,
            "availableReplicas": w.replicas,
            "updatedReplicas": w.replicas,
            "observedGeneration": 1,
        },
    }
    rs_uid = uid("rs", w.namespace, w.rs_name)
    replicaset = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": w.rs_name,
            "namespace": w.namespace,
            "uid": rs_uid,
            "creationTimestamp": created,
            "labels": pod_labels,
            "annotations": {"deployment.kubernetes.io/revision": "1"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": w.name,
                    "uid": deployment["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    **({"annotations": w.annotations} if w.annotations else {}),
                },
                "spec": pod_spec(w),
            },
        },
        "status": {
            "replicas": w.replicas,
            "readyReplicas": w.replicas,
            "availableReplicas": w.replicas,
            "fullyLabeledReplicas": w.replicas,
            "observedGeneration": 1,
        },
    }
    objects = [deployment, replicaset]
    for i, where in enumerate(w.placement):
        n = by_ip[where]
        name = f"{w.rs_name}-{short_hash(w.name, str(i), length=5)}"
        started = ts(min(n.age, timedelta(days=2)) - timedelta(minutes=5 * i))
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": w.namespace,
                    "uid": uid("pod", w.namespace, name),
                    "creationTimestamp": started,
                    "labels": pod_labels,
                    **({"annotations": w.annotations} if w.annotations else {}),
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "ReplicaSet",
                            "name": w.rs_name,
                            "uid": rs_uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": pod_spec(w, n.name),
                "status": running_status(n, len(n.pods), started, w.name),
            }
        )
        n.pods.append(objects[-1])
    if w.pdb:
        objects.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {
                    "name": w.name,
                    "namespace": w.namespace,
                    "uid": uid("pdb", w.namespace, w.name),
                    "creationTimestamp": created,
                },
                "spec": {**w.pdb, "selector": {"matchLabels": labels}},
            }
        )
    return objects


def daemonset_objects(nodes: list[DemoNode]) -> list[dict[str, Any]]:
    labels = {"app": "node-exporter"}
    ds_uid = uid("ds", "monitoring", "node-exporter")
    spec = {
        "containers": [
            {
                "name": "node-exporter",
                "image": "quay.io/prometheus/node-exporter:v1.8.2",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "64Mi"}},
            }
        ],
        "terminationGracePeriodSeconds": 30,
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
        "tolerations": [{"operator": "Exists"}],
    }
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {
                "name": "node-exporter",
                "namespace": "monitoring",
                "uid": ds_uid,
                "creationTimestamp": ts(timedelta(days=60)),
                "labels": labels,
            },
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": spec},
            },
            "status": {
                "desiredNumberScheduled": len(nodes),
                "currentNumberScheduled": len(nodes),
                "numberReady": len(nodes),
                "numberAvailable": len(nodes),
                "observedGeneration": 1,
            },
        }
    ]
    for n in nodes:
        name = f"node-exporter-{short_hash(n.name, length=5)}"
        started = ts(n.age - timedelta(minutes=1))
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": "monitoring",
                    "uid": uid("pod", "monitoring", name),
                    "creationTimestamp": started,
                    "labels": {**labels, "controller-revision-hash": "7d9c6b8f4"},
                    "ownerReferences": [
                        {
                            "apiVersion": "apps/v1",
                            "kind": "DaemonSet",
                            "name": "node-exporter",
                            "uid": ds_uid,
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {
                    **spec,
                    "nodeName": n.name,
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchFields": [
                                            {"key": "metadata.name", "operator": "In", "values": [n.name]}
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                },
                "status": running_status(n, len(n.pods), started, "node-exporter"),
            }
        )
        n.pods.append(objects[-1])
    return objects


def scenario_list(nodes: list[DemoNode], workloads: list[Workload]) -> dict[str, Any]:
    pools = sorted({n.pool for n in nodes}, key=list(NODEPOOL_SPECS).index)
    classes = sorted({n.nodeclass for n in nodes}, key=list(NODECLASS_SPECS).index)
    workload_items = [obj for w in workloads for obj in workload_objects(w, nodes)]
    daemonsets = daemonset_objects(nodes)
    items = (
        [nodeclass(name) for name in classes]
        + [nodepool(name, nodes) for name in pools]
        + [node(n) for n in nodes]
        + [o for o in workload_items if o["kind"] != "Pod"]
        + [o for o in daemonsets if o["kind"] != "Pod"]
        + [o for o in workload_items + daemonsets if o["kind"] == "Pod"]
    )
    return {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"resourceVersion": "", "annotations": {CAPTURED_AT_ANNOTATION: ts(timedelta(0))}},
        "items": items,
    }


# A three-node cluster for tests: one busy node, one nearly empty spot node, one empty node.
SMALL_NODES = [
    DemoNode("172.31.1.10", "m5.xlarge", "us-west-2a", "on-demand", "default", timedelta(days=9), "busy"),
    DemoNode("172.31.17.20", "m5.large", "us-west-2b", "spot", "default", timedelta(days=2), "nearly empty"),
    DemoNode("172.31.2.30", "m5.large", "us-west-2a", "on-demand", "default", timedelta(days=1), "empty"),
]
SMALL_WORKLOADS = [
    Workload("shop", "web", "500m", "512Mi", ["10", "10", "20"], pdb={"minAvailable": 2}),
    Workload("ml", "trainer", "250m", "256Mi", ["20"], annotations={k.DO_NOT_DISRUPT_ANNOTATION: "true"}),
]

HEADER = """\
# {title}
# GENERATED by `python -m sim.scenarios.generate_demo` (writes demo.yaml and small.yaml): edit
# the generator, not this file. Shape:
# `kubectl get nodes,pods,pdb,deploy,rs,ds,nodepools,ec2nodeclasses -A -o yaml`.
#
# Nodes (what each one gives karpflow to do):
{table}
"""

SCENARIOS = {
    "demo.yaml": (
        "The default demo scenario: a fragmented 13-node EKS cluster managed by karpflow.",
        NODES,
        WORKLOADS,
    ),
    "small.yaml": (
        "A three-node cluster for tests: busy, nearly empty (spot), empty.",
        SMALL_NODES,
        SMALL_WORKLOADS,
    ),
}


def render(file_name: str) -> str:
    title, nodes, workloads = SCENARIOS[file_name]
    nodes = [replace(n, pods=[]) for n in nodes]  # placement is recorded on the nodes: start afresh
    body = yaml.safe_dump(scenario_list(nodes, workloads), sort_keys=False, width=120)
    rows = "\n".join(
        f"#   {n.name:<45} {n.instance_type:<11} {n.zone} {n.capacity_type:<9} {n.pool:<8} {n.note}"
        for n in nodes
    )
    return HEADER.format(title=title, table=rows) + body


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    for name in SCENARIOS:
        (here / name).write_text(render(name))
        sys.stdout.write(f"wrote {here / name}\n")
