"""Small clusters as Kubernetes objects for the scheduling-simulation and consolidation tests.

Everything goes through the real loaders (`Snapshot.from_objects`, `catalog_from_dict`), so the
tests exercise the same path as `karpflow plan`. Allocatable equals capacity in the test catalog to
keep the arithmetic in the tests obvious.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from planner.catalog import Catalog, catalog_from_dict
from planner.model import PlanContext, PlanOptions
from planner.scheduling.adapter import SnapshotSimulation
from planner.snapshot import Snapshot

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LONG_AGO = (NOW - timedelta(days=2)).isoformat()
ZONES = ("test-1a", "test-1b")

# name: (cpu, memory GiB, arch, on-demand $/h, spot $/h)
TYPES: dict[str, tuple[int, int, str, float, float]] = {
    "c5.large": (2, 4, "amd64", 0.085, 0.035),
    "c5.xlarge": (4, 8, "amd64", 0.170, 0.070),
    "m5.large": (2, 8, "amd64", 0.096, 0.040),
    "m5.xlarge": (4, 16, "amd64", 0.192, 0.080),
    "m5.2xlarge": (8, 32, "amd64", 0.384, 0.160),
    "m5.4xlarge": (16, 64, "amd64", 0.768, 0.320),
    "r5.large": (2, 16, "amd64", 0.126, 0.050),
    "m6g.large": (2, 8, "arm64", 0.077, 0.032),
}


def make_catalog(
    types: Mapping[str, tuple[int, int, str, float, float]] = TYPES,
    zones: Iterable[str] = ZONES,
    unavailable: Iterable[tuple[str, str, str]] = (),
) -> Catalog:
    off = set(unavailable)
    return catalog_from_dict(
        {
            "region": "test-1",
            "instanceTypes": [
                {
                    "name": name,
                    "cpu": str(cpu),
                    "memory": f"{mem}Gi",
                    "pods": 30,
                    "arch": arch,
                    "allocatable": {"cpu": str(cpu), "memory": f"{mem}Gi", "pods": "30"},
                    "offerings": [
                        {"zone": z, "capacityType": ct, "price": price, "available": (name, z, ct) not in off}
                        for z in zones
                        for ct, price in (("on-demand", od), ("spot", spot))
                    ],
                }
                for name, (cpu, mem, arch, od, spot) in types.items()
            ],
        },
        source="test catalog",
    )


CATALOG = make_catalog()


def node(
    name: str,
    instance_type: str = "m5.xlarge",
    *,
    zone: str = "test-1a",
    capacity_type: str = "on-demand",
    pool: str | None = "default",
    initialized: bool = True,
    taints: list[dict] | None = None,
    labels: dict[str, str] | None = None,
    deleting: bool = False,
    unschedulable: bool = False,
    annotations: dict[str, str] | None = None,
    created: str = LONG_AGO,
) -> dict[str, Any]:
    cpu, mem, arch, _, _ = TYPES.get(instance_type, (4, 16, "amd64", 0, 0))
    all_labels = {
        "kubernetes.io/hostname": name,
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/zone": zone,
        "kubernetes.io/arch": arch,
        "kubernetes.io/os": "linux",
        "karpenter.sh/capacity-type": capacity_type,
        **(labels or {}),
    }
    if pool is not None:
        all_labels["karpenter.sh/nodepool"] = pool
        if initialized:
            all_labels["karpenter.sh/initialized"] = "true"
    meta: dict[str, Any] = {
        "name": name,
        "labels": all_labels,
        "creationTimestamp": created,
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = NOW.isoformat()
    resources = {"cpu": str(cpu), "memory": f"{mem}Gi", "pods": "30"}
    return {
        "kind": "Node",
        "metadata": meta,
        "spec": {
            "taints": taints or [],
            "unschedulable": unschedulable,
            "providerID": f"aws:///{zone}/i-{name}",
        },
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": LONG_AGO}],
        },
    }


def pod(
    name: str,
    node_name: str | None = None,
    *,
    cpu: str = "1",
    memory: str = "1Gi",
    ns: str = "default",
    labels: dict[str, str] | None = None,
    owner: str | None = "ReplicaSet",
    annotations: dict | None = None,
    **spec: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "labels": labels or {"app": name},
        "annotations": annotations or {},
        "creationTimestamp": LONG_AGO,
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True}]
    body: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        **spec,
    }
    if node_name:
        body["nodeName"] = node_name
    status: dict[str, Any] = {
        "phase": "Running" if node_name else "Pending",
        "startTime": LONG_AGO,
        "conditions": [{"type": "Ready", "status": "True"}] if node_name else [],
    }
    return {"kind": "Pod", "metadata": meta, "spec": body, "status": status}


def replicas(prefix: str, nodes_and_counts: Iterable[tuple[str | None, int]], **kwargs: Any) -> list[dict]:
    """Pods of one workload (shared labels) spread over nodes: [(node, count), ...]."""
    out = []
    i = 0
    labels = kwargs.pop("labels", None) or {"app": prefix}
    for node_name, count in nodes_and_counts:
        for _ in range(count):
            out.append(pod(f"{prefix}-{i}", node_name, labels=labels, **kwargs))
            i += 1
    return out


def nodepool(
    name: str = "default",
    *,
    requirements: list[dict] | None = None,
    taints: list[dict] | None = None,
    startup_taints: list[dict] | None = None,
    limits: dict | None = None,
    labels: dict | None = None,
    weight: int | None = None,
    policy: str = "WhenEmptyOrUnderutilized",
    consolidate_after: str = "0s",
    budgets: list[dict] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"labels": labels or {}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": requirements
                if requirements is not None
                else [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}],
                "taints": taints or [],
                "startupTaints": startup_taints or [],
            },
        },
        "disruption": {
            "consolidationPolicy": policy,
            "consolidateAfter": consolidate_after,
            "budgets": budgets or [{"nodes": "100%"}],
        },
    }
    if limits:
        spec["limits"] = limits
    if weight is not None:
        spec["weight"] = weight
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec}


def daemonset(name: str, *, cpu: str = "100m", memory: str = "128Mi", **spec: Any) -> dict[str, Any]:
    return {
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "kube-system"},
        "spec": {
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "d", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
                    **spec,
                },
            }
        },
    }


def from_yaml(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def snapshot(*objects: dict | Iterable[dict], now: datetime = NOW) -> Snapshot:
    flat: list[dict] = []
    for obj in objects:
        if isinstance(obj, Mapping):
            flat.append(dict(obj))
        else:
            flat.extend(obj)
    snap = Snapshot.from_objects(flat, now=now, source="test")
    assert not snap.problems, snap.problems
    return snap


def simulation(snap: Snapshot, catalog: Catalog = CATALOG, policy: str = "Respect") -> SnapshotSimulation:
    return SnapshotSimulation(snap, catalog, policy)  # type: ignore[arg-type]


def context(snap: Snapshot, catalog: Catalog = CATALOG, **options: Any) -> PlanContext:
    return PlanContext(snapshot=snap, catalog=catalog, options=PlanOptions(**options))
