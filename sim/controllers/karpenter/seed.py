"""A scenario beside Karpenter: every node of a NodePool is one Karpenter launched, so it has the
NodeClaim Karpenter created for it (launched, registered, initialized as its node is), its Node the
finalizer and owner reference Karpenter's registration adds, and its instance the tags Karpenter's
launch and tagging controller write (`eks:eks-cluster-name`, `karpenter.k8s.aws/ec2nodeclass`,
`karpenter.sh/nodeclaim`). Without them the neighbour's instance garbage collection would take
the scenario's own nodes for leaks."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from api import constants as k
from sim.apiserver.store import Store
from sim.controllers.karpenter.conditions import initialize, set_condition

Obj = dict[str, Any]
# Labels of the kubelet's own, or of registration and initialization: not the NodeClaim's.
NOT_NODECLAIM_LABELS = (
    k.HOSTNAME_LABEL,
    k.REGISTERED_LABEL,
    k.INITIALIZED_LABEL,
    k.EXCLUDE_LB_LABEL,
)
NOT_NODECLAIM_PREFIXES = ("beta.kubernetes.io/", "failure-domain.beta.kubernetes.io/")
HASH_ANNOTATIONS = (
    k.NODEPOOL_HASH_ANNOTATION,
    k.NODEPOOL_HASH_VERSION_ANNOTATION,
    k.NODECLASS_HASH_ANNOTATION,
    k.NODECLASS_HASH_VERSION_ANNOTATION,
)


def _claim_name(pool: str, node: Obj) -> str:
    suffix = hashlib.sha256(node["metadata"]["name"].encode()).hexdigest()[:5]
    return f"{pool}-{suffix}"


def _conditions(initialized: bool, at: str) -> list[Obj]:
    """What Karpenter's lifecycle had written by now: launched and registered, maybe initialized,
    and Ready following them (conditions.py)."""
    status: Obj = {}
    initialize(status, at=at)
    for kind in ("Launched", "Registered", *(("Initialized",) if initialized else ())):
        set_condition(status, kind, "True", kind, at=at)
    return list(status["conditions"])


def nodeclaim_for(node: Obj, pool: Obj, image_id: str | None) -> Obj:
    meta = node["metadata"]
    labels = meta.get("labels") or {}
    pool_name = pool["metadata"]["name"]
    template = (pool.get("spec") or {}).get("template") or {}
    spec = template.get("spec") or {}
    ref = dict(spec.get("nodeClassRef") or {})
    if labels.get(k.EC2NODECLASS_LABEL):
        ref = {"group": k.AWS_GROUP, "kind": k.EC2NODECLASS_KIND, "name": labels[k.EC2NODECLASS_LABEL]}
    claim_spec: Obj = {
        "nodeClassRef": ref,
        "requirements": [
            *(r for r in spec.get("requirements") or () if r.get("key") != k.NODEPOOL_LABEL),
            {"key": k.NODEPOOL_LABEL, "operator": "In", "values": [pool_name]},
        ],
    }
    for field in ("taints", "startupTaints", "expireAfter", "terminationGracePeriod"):
        if spec.get(field):
            claim_spec[field] = spec[field]
    claim_labels = {
        key: value
        for key, value in labels.items()
        if key not in NOT_NODECLAIM_LABELS and not key.startswith(NOT_NODECLAIM_PREFIXES)
    }
    at = meta.get("creationTimestamp") or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    initialized = labels.get(k.INITIALIZED_LABEL) == "true"
    status = node.get("status") or {}
    return {
        "apiVersion": f"{k.KARPENTER_GROUP}/{k.KARPENTER_VERSION}",
        "kind": "NodeClaim",
        "metadata": {
            "name": _claim_name(pool_name, node),
            "labels": claim_labels,
            "annotations": {
                key: value
                for key, value in (meta.get("annotations") or {}).items()
                if key in HASH_ANNOTATIONS
            },
            "finalizers": [k.TERMINATION_FINALIZER],
            "ownerReferences": [
                {
                    "apiVersion": f"{k.KARPENTER_GROUP}/{k.KARPENTER_VERSION}",
                    "kind": "NodePool",
                    "name": pool_name,
                    "uid": pool["metadata"]["uid"],
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": claim_spec,
        "status": {
            "providerID": (node.get("spec") or {}).get("providerID"),
            "nodeName": meta["name"],
            **({"imageID": image_id} if image_id else {}),
            "capacity": dict(status.get("capacity") or {}),
            "allocatable": dict(status.get("allocatable") or {}),
            "conditions": _conditions(initialized, at),
        },
    }


def seed_nodeclaims(store: Store, ec2: Any, cluster_name: str) -> list[str]:
    """NodeClaims for the store's nodes of a NodePool; returns their names (blocking: EC2 calls)."""
    pools = {p["metadata"]["name"]: p for p in store.list("nodepools").items}
    nodes = [
        n
        for n in store.list("nodes").items
        if (n["metadata"].get("labels") or {}).get(k.NODEPOOL_LABEL) in pools
        and (n.get("spec") or {}).get("providerID", "").startswith("aws://")
    ]
    ids = {n["metadata"]["name"]: n["spec"]["providerID"].rsplit("/", 1)[-1] for n in nodes}
    instances: dict[str, Obj] = {}
    if ids:
        response = ec2.describe_instances(InstanceIds=sorted(ids.values()))
        instances = {
            i["InstanceId"]: i for r in response.get("Reservations") or () for i in r.get("Instances") or ()
        }
    created = []
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        pool = pools[labels[k.NODEPOOL_LABEL]]
        instance = instances.get(ids[node["metadata"]["name"]]) or {}
        claim = store.create(
            "nodeclaims", nodeclaim_for(node, pool, instance.get("ImageId")), keep_status=True
        )
        claim_meta = claim["metadata"]

        def adopt(obj: Obj, claim_meta: Obj = claim_meta) -> None:
            meta = obj["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if k.TERMINATION_FINALIZER not in finalizers:
                meta["finalizers"] = [*finalizers, k.TERMINATION_FINALIZER]
            meta["ownerReferences"] = [
                *(meta.get("ownerReferences") or []),
                {
                    "apiVersion": f"{k.KARPENTER_GROUP}/{k.KARPENTER_VERSION}",
                    "kind": "NodeClaim",
                    "name": claim_meta["name"],
                    "uid": claim_meta["uid"],
                    "blockOwnerDeletion": True,
                },
            ]

        store.mutate("nodes", node["metadata"]["name"], adopt)
        tags = {
            k.TAG_EKS_CLUSTER_NAME: cluster_name,
            k.TAG_NODECLAIM: claim_meta["name"],
            k.TAG_NODE_NAME: node["metadata"]["name"],
            k.TAG_NODECLASS: claim["spec"]["nodeClassRef"]["name"],
        }
        if instance:
            ec2.create_tags(
                Resources=[instance["InstanceId"]], Tags=[{"Key": key, "Value": v} for key, v in tags.items()]
            )
        created.append(claim_meta["name"])
    return created
