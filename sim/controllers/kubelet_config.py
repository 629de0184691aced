"""What a simulated kubelet reports as capacity and allocatable, from the configuration it booted with.

The instance type gives the hardware (planner.catalog: data, not rules); the kubelet's configuration
decides the rest, as on an EKS AMI:

- pods: `maxPods` when given; else 110 (the kubelet's own default) when AL2's bootstrap.sh was told
  `--use-max-pods false`; else the AMI's ENI-limited value (the catalog's);
- allocatable = capacity - kubeReserved - systemReserved - the hard eviction thresholds, where an
  unset kubeReserved is the AMI's default (its cpu tiers, 11 MiB per pod + 255 MiB, 1 GiB of disk)
  and unset thresholds are `memory.available<100Mi` and `nodefs.available<10%`.

So a bootstrap that forgets max pods, or drops the reservations it was given, shows up as a node
whose numbers differ from what the planner packed against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from api.quantity import QuantityError, format_bytes, format_millicores, millicores, to_int
from planner.catalog import (
    EVICTION_THRESHOLD_MEMORY,
    EVICTION_THRESHOLD_NODEFS_PERCENT,
    KUBE_RESERVED_EPHEMERAL_STORAGE,
    InstanceType,
    kube_reserved_cpu_millicores,
    kube_reserved_memory_bytes,
)
from planner.resources import Resources

KUBELET_DEFAULT_MAX_PODS = 110


@dataclass(frozen=True)
class KubeletSettings:
    max_pods: int | None = None
    use_max_pods: bool = True
    system_reserved: Mapping[str, str] = field(default_factory=dict)
    kube_reserved: Mapping[str, str] = field(default_factory=dict)
    eviction_hard: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_default(self) -> bool:
        return (
            self.max_pods is None
            and self.use_max_pods
            and not (self.system_reserved or self.kube_reserved or self.eviction_hard)
        )


def pods(itype: InstanceType, settings: KubeletSettings) -> int:
    if settings.max_pods is not None:
        return settings.max_pods
    return itype.pods if settings.use_max_pods else KUBELET_DEFAULT_MAX_PODS


def _threshold(value: str | None, total: int, default: int) -> int:
    """An eviction threshold: a quantity, or a percentage of the resource's capacity."""
    if value is None:
        return default
    if value.endswith("%"):
        return math.ceil(total * float(value[:-1]) / 100)
    return to_int(value)


def resources(itype: InstanceType, settings: KubeletSettings) -> tuple[Resources, Resources]:
    """(capacity, allocatable) of a node of `itype` whose kubelet runs with `settings`."""
    if settings.is_default:
        return itype.capacity_resources, itype.allocatable_resources
    max_pods = pods(itype, settings)
    hardware = itype.capacity_resources
    capacity = Resources(
        cpu=hardware.cpu, memory=hardware.memory, pods=max_pods, ephemeral_storage=hardware.ephemeral_storage
    )
    try:
        kube, system = settings.kube_reserved, settings.system_reserved
        reserved_cpu = (
            millicores(kube["cpu"]) if "cpu" in kube else kube_reserved_cpu_millicores(capacity.cpu)
        ) + millicores(system.get("cpu"))
        reserved_memory = (
            to_int(kube["memory"]) if "memory" in kube else kube_reserved_memory_bytes(max_pods)
        ) + to_int(system.get("memory"))
        reserved_storage = (
            to_int(kube["ephemeral-storage"])
            if "ephemeral-storage" in kube
            else KUBE_RESERVED_EPHEMERAL_STORAGE
        ) + to_int(system.get("ephemeral-storage"))
        evicted_memory = _threshold(
            settings.eviction_hard.get("memory.available"), capacity.memory, EVICTION_THRESHOLD_MEMORY
        )
        evicted_storage = _threshold(
            settings.eviction_hard.get("nodefs.available"),
            capacity.ephemeral_storage,
            math.ceil(capacity.ephemeral_storage * EVICTION_THRESHOLD_NODEFS_PERCENT),
        )
    except (QuantityError, ValueError) as err:
        raise ValueError(f"the kubelet refuses its reservations: {err}") from None
    allocatable = Resources(
        cpu=max(0, capacity.cpu - reserved_cpu),
        memory=max(0, capacity.memory - reserved_memory - evicted_memory),
        pods=max_pods,
        ephemeral_storage=max(0, capacity.ephemeral_storage - reserved_storage - evicted_storage),
    )
    return capacity, allocatable


def as_kube(res: Resources) -> dict[str, str]:
    """Node.status.capacity / allocatable as the kubelet posts them."""
    return {
        "cpu": format_millicores(res.cpu),
        "memory": format_bytes(res.memory),
        "pods": str(res.pods),
        "ephemeral-storage": format_bytes(res.ephemeral_storage),
    }
