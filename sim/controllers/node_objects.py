"""The Node object a kubelet on an EC2 instance would register, built from DescribeInstances output.

Conventions (as on EKS with Karpenter):
- name and `kubernetes.io/hostname`: the private DNS name built from the private IP,
  `ip-10-0-1-2.<region>.compute.internal` (`ip-10-0-1-2.ec2.internal` in us-east-1). moto's own
  PrivateDnsName is not used because its fleet instances always say `ec2.internal`.
- `spec.providerID`: `aws:///<zone>/<instance-id>`.
- labels: instance type, zone, region, arch, os, `karpenter.sh/capacity-type` (spot when EC2 says
  `InstanceLifecycle: spot`, else the value the launch labels ask for, else on-demand), the
  `karpenter.k8s.aws/instance-*` labels of the catalog, `karpenter.sh/nodepool` from the
  instance's nodepool tag, then every `--node-labels` label of its user data (sim/controllers/bootstrap.py).
- taints: `node.kubernetes.io/not-ready:NoSchedule` until Ready, and the `--register-with-taints`
  taints of its user data; those its NodePool lists as startupTaints are the node agents' to remove.
- capacity / allocatable: `planner.catalog.InstanceType.capacity` / `.allocatable`, the very
  numbers the planner packs against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.constants import (
    ARCH_LABEL,
    CAPACITY_ON_DEMAND,
    CAPACITY_SPOT,
    CAPACITY_TYPE_LABEL,
    HOSTNAME_LABEL,
    INSTANCE_TYPE_LABEL,
    NODEPOOL_LABEL,
    NOT_READY_TAINT_KEY,
    OS_LABEL,
    REGION_LABEL,
    TAG_NODEPOOL,
    ZONE_LABEL,
    aws_provider_id,
)
from planner.catalog import InstanceType
from sim.controllers.bootstrap import KubeletBoot

KUBELET_VERSION = "v1.32.0-eks-sim"
NOT_READY_TAINT = {"key": NOT_READY_TAINT_KEY, "effect": "NoSchedule"}
_ARCH = {"x86_64": "amd64", "arm64": "arm64", "amd64": "amd64"}


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tags_of(instance: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or () if "Key" in t}


def node_name(instance: Mapping[str, Any], region: str) -> str:
    ip = instance.get("PrivateIpAddress")
    if not ip:
        # Without an IP EKS would have no name either; fall back to moto's DNS name or the id.
        return instance.get("PrivateDnsName") or str(instance["InstanceId"])
    domain = "ec2.internal" if region == "us-east-1" else f"{region}.compute.internal"
    return f"ip-{ip.replace('.', '-')}.{domain}"


def provider_id(instance: Mapping[str, Any]) -> str:
    zone = (instance.get("Placement") or {}).get("AvailabilityZone", "")
    return aws_provider_id(zone, instance["InstanceId"])


def instance_id_from_provider_id(value: str | None) -> str | None:
    if not value or not value.startswith("aws://"):
        return None
    tail = value.rsplit("/", 1)[-1]
    return tail if tail.startswith("i-") else None


@dataclass(frozen=True)
class LaunchedNodeSpec:
    """What the instance's user data asks the kubelet for; `startup_taints` are the registered taints
    that the node's agents remove once it is Ready (its NodePool's startupTaints)."""

    labels: dict[str, str]
    taints: list[dict[str, str]]
    startup_taints: list[dict[str, str]]

    @classmethod
    def from_boot(cls, boot: KubeletBoot, startup: list[dict[str, Any]]) -> LaunchedNodeSpec:
        def is_startup(taint: dict[str, str]) -> bool:
            return any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"] for t in startup)

        return cls(
            labels=dict(boot.labels),
            taints=[t for t in boot.taints if not is_startup(t)],
            startup_taints=[t for t in boot.taints if is_startup(t)],
        )


def capacity_type(instance: Mapping[str, Any], launch_labels: Mapping[str, str]) -> str:
    if instance.get("InstanceLifecycle") == CAPACITY_SPOT:
        return CAPACITY_SPOT
    return launch_labels.get(CAPACITY_TYPE_LABEL) or CAPACITY_ON_DEMAND


def node_labels(
    instance: Mapping[str, Any], region: str, name: str, itype: InstanceType, launch: LaunchedNodeSpec
) -> dict[str, str]:
    zone = (instance.get("Placement") or {}).get("AvailabilityZone", "")
    labels = dict(itype.labels)
    labels.update(
        {
            HOSTNAME_LABEL: name,
            INSTANCE_TYPE_LABEL: str(instance.get("InstanceType", itype.name)),
            ZONE_LABEL: zone,
            REGION_LABEL: region,
            ARCH_LABEL: itype.arch or _ARCH.get(str(instance.get("Architecture")), "amd64"),
            OS_LABEL: "linux",
            "failure-domain.beta.kubernetes.io/zone": zone,
            "failure-domain.beta.kubernetes.io/region": region,
        }
    )
    nodepool = tags_of(instance).get(TAG_NODEPOOL)
    if nodepool:
        labels[NODEPOOL_LABEL] = nodepool
    labels.update(launch.labels)
    labels[CAPACITY_TYPE_LABEL] = capacity_type(instance, launch.labels)
    return labels


def ready_condition(status: str, reason: str, message: str, at: str) -> dict[str, str]:
    return {
        "type": "Ready",
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": at,
        "lastTransitionTime": at,
    }


def registered_node(
    instance: Mapping[str, Any], region: str, itype: InstanceType, launch: LaunchedNodeSpec
) -> dict[str, Any]:
    """The Node as the kubelet first posts it: NotReady, tainted not-ready, with its launch taints."""
    name = node_name(instance, region)
    at = now_rfc3339()
    taints = [dict(NOT_READY_TAINT), *launch.taints, *launch.startup_taints]
    addresses = [{"type": "InternalIP", "address": instance.get("PrivateIpAddress", "")}]
    addresses += [{"type": "InternalDNS", "address": name}, {"type": "Hostname", "address": name}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": node_labels(instance, region, name, itype, launch),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": provider_id(instance), "taints": taints},
        "status": {
            "capacity": itype.capacity,
            "allocatable": itype.allocatable,
            "conditions": [ready_condition("False", "KubeletNotReady", "container runtime is starting", at)],
            "addresses": addresses,
            "nodeInfo": {
                "architecture": itype.arch,
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023 (simulated)",
                "kernelVersion": "6.1.0-sim",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": KUBELET_VERSION,
                "containerRuntimeVersion": "containerd://1.7.0-sim",
                "machineID": str(instance["InstanceId"]),
                "systemUUID": str(instance["InstanceId"]),
                "bootID": str(instance["InstanceId"]),
            },
            "phase": "Running",
        },
    }
