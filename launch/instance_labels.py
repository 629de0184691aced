"""The labels Karpenter gives a node of an instance type and offering, from EC2's own description.

Karpenter's AWS provider computes them from DescribeInstanceTypes (pkg/providers/instancetype,
`computeRequirements`) and its offering (zone, zone id, capacity type); the NodeClaim carries them and
its registration copies them onto the Node. karpflow launches without NodeClaims, so its registration
writes them itself (activities/node_registration.py), from what the launch activity read here. Pods that
select `karpenter.k8s.aws/instance-family` and the like then find karpflow's replacements too, as the
planner's scheduling simulation assumed when it chose them.

Network bandwidth is the sum of the network cards' baseline bandwidth in Mbps (the figure Karpenter
bundles from the same EC2 data); a label whose fact EC2 does not give is left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Protocol

from api.constants import (
    ARCH_LABEL,
    CAPACITY_RESERVATION_ID_LABEL,
    CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL,
    CAPACITY_RESERVATION_TYPE_LABEL,
    CAPACITY_TYPE_LABEL,
    INSTANCE_TYPE_LABEL,
    OS_LABEL,
    REGION_LABEL,
    ZONE_LABEL,
)

AWS = "karpenter.k8s.aws/"
ZONE_ID_LABEL = "topology.k8s.aws/zone-id"
# category, optional "-<n>tb" (u-6tb1...), generation: m5d.large -> m, 5; u-6tb1.metal -> u, 1.
_FAMILY_SCHEME = re.compile(r"^([a-z]+)(-[0-9]+tb)?([0-9]+).*\.")
_KUBE_ARCH = {"x86_64": "amd64", "arm64": "arm64"}


def _kebab(text: str) -> str:
    return text.lower().replace(" ", "-")


def instance_type_labels(info: Mapping[str, Any]) -> dict[str, str]:
    """Karpenter's labels for one DescribeInstanceTypes entry."""
    name = str(info["InstanceType"])
    processor = info.get("ProcessorInfo") or {}
    network = info.get("NetworkInfo") or {}
    arches = [_KUBE_ARCH[a] for a in processor.get("SupportedArchitectures") or () if a in _KUBE_ARCH]
    labels = {
        INSTANCE_TYPE_LABEL: name,
        OS_LABEL: "linux",
        AWS + "instance-cpu": str((info.get("VCpuInfo") or {}).get("DefaultVCpus", "")),
        AWS + "instance-memory": str((info.get("MemoryInfo") or {}).get("SizeInMiB", "")),
        AWS + "instance-hypervisor": str(info.get("Hypervisor") or ""),
        AWS + "instance-encryption-in-transit-supported": str(
            bool(network.get("EncryptionInTransitSupported"))
        ).lower(),
    }
    if arches:
        labels[ARCH_LABEL] = arches[0]
    scheme = _FAMILY_SCHEME.match(name)
    if scheme:
        labels[AWS + "instance-category"] = scheme[1]
        labels[AWS + "instance-generation"] = scheme[3]
    family, dot, size = name.partition(".")
    if dot:
        labels[AWS + "instance-family"] = family
        labels[AWS + "instance-size"] = size
    if processor.get("Manufacturer"):
        labels[AWS + "instance-cpu-manufacturer"] = _kebab(processor["Manufacturer"])
    if processor.get("SustainedClockSpeedInGhz"):
        labels[AWS + "instance-cpu-sustained-clock-speed-mhz"] = str(
            round(float(processor["SustainedClockSpeedInGhz"]) * 1000)
        )
    storage = info.get("InstanceStorageInfo") or {}
    if storage and storage.get("NvmeSupport") != "unsupported" and storage.get("TotalSizeInGB"):
        labels[AWS + "instance-local-nvme"] = str(storage["TotalSizeInGB"])
    baseline = [c.get("BaselineBandwidthInGbps") for c in network.get("NetworkCards") or ()]
    if baseline and all(b is not None for b in baseline):
        labels[AWS + "instance-network-bandwidth"] = str(round(sum(float(b) for b in baseline) * 1000))
    ebs = info.get("EbsInfo") or {}
    if ebs.get("EbsOptimizedSupport") == "default" and (ebs.get("EbsOptimizedInfo") or {}).get(
        "MaximumBandwidthInMbps"
    ):
        labels[AWS + "instance-ebs-bandwidth"] = str(ebs["EbsOptimizedInfo"]["MaximumBandwidthInMbps"])
    gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
    if len(gpus) == 1:
        gpu = gpus[0]
        labels[AWS + "instance-gpu-name"] = _kebab(str(gpu.get("Name", "")))
        labels[AWS + "instance-gpu-manufacturer"] = _kebab(str(gpu.get("Manufacturer", "")))
        labels[AWS + "instance-gpu-count"] = str(gpu.get("Count", ""))
        labels[AWS + "instance-gpu-memory"] = str((gpu.get("MemoryInfo") or {}).get("SizeInMiB", ""))
    accelerators = (info.get("InferenceAcceleratorInfo") or {}).get("Accelerators") or []
    if len(accelerators) == 1:
        accelerator = accelerators[0]
        labels[AWS + "instance-accelerator-name"] = _kebab(str(accelerator.get("Name", "")))
        labels[AWS + "instance-accelerator-manufacturer"] = _kebab(str(accelerator.get("Manufacturer", "")))
        labels[AWS + "instance-accelerator-count"] = str(accelerator.get("Count", ""))
    return {key: value for key, value in labels.items() if value != "" or key.endswith("hypervisor")}


def eni_max_pods(info: Mapping[str, Any]) -> int:
    """The pods an EKS AMI lets a node of this type run with the VPC CNI (no prefix delegation):
    ENIs x (IPv4 addresses per ENI - 1) + 2, the eni-max-pods.txt figure. The planner's catalog
    counts the same (planner.catalog.eks_max_pods; tests/unit/test_instance_labels.py holds them
    together), so the kubelet is told what the planner packs against."""
    network = info.get("NetworkInfo") or {}
    enis = int(network.get("MaximumNetworkInterfaces", 1))
    return enis * (int(network.get("Ipv4AddressesPerInterface", 2)) - 1) + 2


def offering_labels(zone: str, zone_id: str | None, capacity_type: str, region: str | None) -> dict[str, str]:
    """Where and how the instance runs: zone (and its id), region, capacity type."""
    labels = {ZONE_LABEL: zone, CAPACITY_TYPE_LABEL: capacity_type}
    if zone_id:
        labels[ZONE_ID_LABEL] = zone_id
    if region:
        labels[REGION_LABEL] = region
    return labels


class ReservedOffering(Protocol):
    """api.workflow_io.Offering, read only (what the reservation labels and launch parameters read)."""

    @property
    def capacity_type(self) -> str: ...
    @property
    def reservation_id(self) -> str | None: ...
    @property
    def reservation_type(self) -> str: ...
    @property
    def interruptible(self) -> bool: ...


def reservation_labels(offering: ReservedOffering) -> dict[str, str]:
    """A reserved node's reservation labels (Karpenter's reserved offering requirements, which its
    NodeClaim carries): id, type and interruptible; none on any other node."""
    if offering.capacity_type != "reserved" or not offering.reservation_id:
        return {}
    return {
        CAPACITY_RESERVATION_ID_LABEL: offering.reservation_id,
        CAPACITY_RESERVATION_TYPE_LABEL: offering.reservation_type,
        CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL: str(offering.interruptible).lower(),
    }
