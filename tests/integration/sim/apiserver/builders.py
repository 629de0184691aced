"""Plain-dict builders for the objects the emulator tests create."""

from __future__ import annotations

from typing import Any

NODE_INFO = {
    "architecture": "amd64",
    "bootID": "boot",
    "containerRuntimeVersion": "containerd://1.7.0",
    "kernelVersion": "6.1.0",
    "kubeProxyVersion": "",
    "kubeletVersion": "v1.32.0",
    "machineID": "machine",
    "operatingSystem": "linux",
    "osImage": "Bottlerocket OS 1.20",
    "systemUUID": "uuid",
}


def node(
    name: str, *, ready: bool = True, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
            "nodeInfo": NODE_INFO,
        },
    }


def replicaset(name: str, replicas: int = 2, namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}]},
            },
        },
    }


def pod(
    name: str,
    node_name: str | None = "n1",
    *,
    app: str = "web",
    owner: dict[str, Any] | None = None,
    grace: int | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {"app": app}}
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "nginx"}]}
    if node_name:
        spec["nodeName"] = node_name
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


RUNNING_READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
RUNNING_UNREADY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}


def pdb(name: str, app: str = "web", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": app}}, **spec},
    }


def eviction(name: str, namespace: str = "default", **delete_options: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    if delete_options:
        body["deleteOptions"] = delete_options
    return body
