"""Nodes, pods and a scheduler on the in-process store, for the simulated kube-scheduler's tests."""

from __future__ import annotations

from typing import Any

from sim.apiserver.store import Store
from sim.controllers.informer import Informer
from sim.controllers.node_objects import ready_condition
from sim.controllers.scheduler import Scheduler
from sim.timescale import TimeScale

HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"


def new_store() -> Store:
    return Store(TimeScale(0))


def make_node(
    store: Store,
    name: str,
    cpu: str = "4",
    memory: str = "16Gi",
    pods: str = "110",
    zone: str | None = None,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    ready: bool = True,
) -> None:
    all_labels = {HOSTNAME: name, **({ZONE: zone} if zone else {}), **(labels or {})}
    store.create(
        "nodes",
        {
            "metadata": {"name": name, "labels": all_labels},
            "spec": {"taints": taints or []},
            "status": {
                "allocatable": {"cpu": cpu, "memory": memory, "pods": pods},
                "conditions": [
                    ready_condition("True" if ready else "False", "r", "m", "2026-01-01T00:00:00Z")
                ],
            },
        },
        keep_status=True,
    )


def make_pod(
    store: Store,
    name: str,
    cpu: str | None = "100m",
    memory: str | None = "128Mi",
    labels: dict[str, str] | None = None,
    namespace: str = "default",
    owner: dict[str, Any] | None = None,
    ports: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    container: dict[str, Any] = {"name": "c", "image": "x", "resources": {"requests": requests}}
    if ports:
        container["ports"] = ports
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return store.create("pods", {"metadata": meta, "spec": {"containers": [container], **spec}})


def make_namespace(store: Store, name: str, labels: dict[str, str] | None = None) -> None:
    store.create("namespaces", {"metadata": {"name": name, "labels": labels or {}}})


def make_replicaset(store: Store, name: str, app: str, namespace: str = "default") -> dict[str, Any]:
    """A ReplicaSet object (nothing runs it here) and the ownerReference its pods carry."""
    rs = store.create(
        "replicasets",
        {
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": app}},
                "template": {
                    "metadata": {"labels": {"app": app}},
                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                },
            },
        },
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": name,
        "uid": rs["metadata"]["uid"],
        "controller": True,
    }


def scheduler_for(store: Store) -> Scheduler:
    # What the scheduler reads (sim.controllers.scheduler.RESOURCES), spelled out so that these tests
    # also run against a simulator from before it read namespaces, Services and ReplicaSets.
    informer = Informer(store, ["nodes", "pods", "namespaces", "services", "replicasets"])
    scheduler = Scheduler(store, informer)
    informer.start()
    return scheduler


def placement(store: Store) -> dict[str, str | None]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in store.list("pods").items}


def scheduled_condition(store: Store, name: str, namespace: str = "default") -> dict[str, Any] | None:
    pod = store.get("pods", name, namespace)
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond["type"] == "PodScheduled":
            return dict(cond)
    return None


def anti_affinity(app: str, key: str = HOSTNAME, **term: Any) -> dict[str, Any]:
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key, **term}
            ]
        }
    }


def affinity(app: str, key: str = ZONE, **term: Any) -> dict[str, Any]:
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key, **term}
            ]
        }
    }


def zone_spread(app: str, max_skew: int = 1, **constraint: Any) -> list[dict[str, Any]]:
    return [
        {
            "maxSkew": max_skew,
            "topologyKey": ZONE,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": app}},
            **constraint,
        }
    ]
