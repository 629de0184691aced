"""The Node object a kubelet on an EC2 instance would register, built from DescribeInstances output.

Conventions (as on EKS with Karpenter):
- name and `kubernetes.io/hostname`: the private DNS name built from the private IP,
  `ip-10-0-1-2.<region>.compute.internal` (`ip-10-0-1-2.ec2.internal` in us-east-1). moto's own
  PrivateDnsName is not used because its fleet instances always say `ec2.internal`.
- `spec.providerID`: `aws:///<zone>/<instance-id>`.
- labels: what the kubelet and the cloud provider write (hostname, instance type, zone, region,
  arch, os), then every `--node-labels` label of its user data (sim/controllers/bootstrap.py).
  Nothing else: Karpenter's `karpenter.sh/*` and `karpenter.k8s.aws/*` labels reach a real node
  only through its user data or whoever registers it (karpflow's registration, or Karpenter's).
- taints: `node.kubernetes.io/not-ready:NoSchedule` until Ready, and the `--register-with-taints`
  taints of its user data; those its NodePool lists as startupTaints are the node agents' to remove.
- capacity / allocatable: the instance type's hardware (planner.catalog) as the kubelet's
  configuration in the user data shapes it (sim/controllers/kubelet_config.py): with the defaults,
  exactly `InstanceType.capacity` / `.allocatable`, the numbers the planner packs against.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from api.constants import (
    ARCH_LABEL,
    HOSTNAME_LABEL,
    INSTANCE_TYPE_LABEL,
    NOT_READY_TAINT_KEY,
    OS_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
    aws_provider_id,
)
from planner.catalog import InstanceType
from sim.controllers.bootstrap import KubeletBoot
from sim.controllers.kubelet_config import KubeletSettings, as_kube, resources

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
    kubelet: KubeletSettings = field(default_factory=KubeletSettings)

    @classmethod
    def from_boot(cls, boot: KubeletBoot, startup: list[dict[str, Any]]) -> LaunchedNodeSpec:
        def is_startup(taint: dict[str, str]) -> bool:
            return any(t.get("key") == taint["key"] and t.get("effect") == taint["effect"] for t in startup)

        return cls(
            labels=dict(boot.labels),
            taints=[t for t in boot.taints if not is_startup(t)],
            startup_taints=[t for t in boot.taints if is_startup(t)],
            kubelet=KubeletSettings(
                max_pods=boot.max_pods,
                use_max_pods=boot.use_max_pods,
                system_reserved=dict(boot.system_reserved),
                kube_reserved=dict(boot.kube_reserved),
                eviction_hard=dict(boot.eviction_hard),
            ),
        )


def node_labels(
    instance: Mapping[str, Any], region: str, name: str, itype: InstanceType, launch: LaunchedNodeSpec
) -> dict[str, str]:
    """The kubelet's own labels (with the cloud provider's topology ones), then its --node-labels."""
    zone = (instance.get("Placement") or {}).get("AvailabilityZone", "")
    instance_type = str(instance.get("InstanceType", itype.name))
    arch = itype.arch or _ARCH.get(str(instance.get("Architecture")), "amd64")
    labels = {
        HOSTNAME_LABEL: name,
        INSTANCE_TYPE_LABEL: instance_type,
        "beta.kubernetes.io/instance-type": instance_type,
        ZONE_LABEL: zone,
        REGION_LABEL: region,
        ARCH_LABEL: arch,
        "beta.kubernetes.io/arch": arch,
        OS_LABEL: "linux",
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "failure-domain.beta.kubernetes.io/region": region,
    }
    labels.update(launch.labels)
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
    capacity, allocatable = resources(itype, launch.kubelet)
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
            "capacity": as_kube(capacity),
            "allocatable": as_kube(allocatable),
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
