"""The instance catalog: EC2 instance types, what a node of each type can hold, and what it costs.

One source of truth for capacity and allocatable. The planner packs pods against
`InstanceType.allocatable_resources`, and the simulator registers Node objects with exactly
`InstanceType.capacity` / `InstanceType.allocatable`, so both sides agree to the byte.

Three ways to get a catalog, all returning the same `Catalog`:
- `bundled_catalog(region)`: the table shipped in `planner/data/instance-types.yaml` (sources and the
  spot estimate are documented in its header);
- `load_catalog_file(path)`: a file in the override format (see `catalog_from_dict`);
- `planner.catalog_live.live_catalog(ec2, pricing)`: EC2 DescribeInstanceTypes + spot price history +
  the Pricing API, falling back to this table (I/O lives in that module, not here);
  `karpflow plan --live-catalog` uses it through `fetch_live_catalog` (boto3's standard chain).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

import yaml

from api.constants import ARCH_LABEL, CAPACITY_ON_DEMAND, CAPACITY_SPOT, INSTANCE_TYPE_LABEL, OS_LABEL
from api.quantity import QuantityError, format_bytes, format_millicores, millicores, to_int
from planner.resources import Resources

DEFAULT_REGION = "us-west-2"
KNOWN_CAPACITY_TYPES = (CAPACITY_ON_DEMAND, CAPACITY_SPOT, "reserved")

MIB = 1 << 20
GIB = 1 << 30

# --- Allocatable arithmetic -------------------------------------------------------------------------
# Karpenter's AWS provider predicts a node's capacity and allocatable before launch with these
# defaults; EKS-optimized AMIs configure the kubelet the same way, so the prediction matches the
# real node.
#
# Memory the hypervisor and firmware keep from the guest: Karpenter's `--vm-memory-overhead-percent`
# default (0.075). The node's reported memory *capacity* is already net of it.
VM_MEMORY_OVERHEAD_PERCENT = 0.075
# kube-reserved memory: 11 MiB per pod the node can run + 255 MiB (amazon-eks-ami bootstrap, the
# formula Karpenter's AWS provider reproduces).
KUBE_RESERVED_MEMORY_PER_POD = 11 * MIB
KUBE_RESERVED_MEMORY_BASE = 255 * MIB
# kubelet hard eviction threshold `memory.available<100Mi` (kubelet default, kept by the EKS AMI).
EVICTION_THRESHOLD_MEMORY = 100 * MIB
# kube-reserved cpu, tiered per core (GKE's published table, adopted by amazon-eks-ami and Karpenter):
# 6% of the first core, 1% of the second, 0.5% of the third and fourth, 0.25% of every core above 4.
KUBE_RESERVED_CPU_TIERS = ((1, 0.06), (1, 0.01), (2, 0.005), (math.inf, 0.0025))
# Root volume: Karpenter's default block device mapping is 20 GiB; kube-reserved ephemeral storage
# is 1 GiB and the kubelet evicts at `nodefs.available<10%`.
DEFAULT_EPHEMERAL_STORAGE = 20 * GIB
KUBE_RESERVED_EPHEMERAL_STORAGE = 1 * GIB
EVICTION_THRESHOLD_NODEFS_PERCENT = 0.10


class CatalogError(ValueError):
    """A catalog file or entry is invalid; the message names the file and the instance type."""


def kube_reserved_cpu_millicores(cpu_millicores: int) -> int:
    """kube-reserved cpu for a node with this many millicores (tiered table above)."""
    remaining: float = cpu_millicores  # the last tier has no end (math.inf cores)
    reserved = 0.0
    for cores, fraction in KUBE_RESERVED_CPU_TIERS:
        span = min(remaining, cores * 1000)
        reserved += span * fraction
        remaining -= span
        if remaining <= 0:
            break
    return math.ceil(reserved)


def vm_memory_overhead_bytes(memory_bytes: int) -> int:
    """Memory lost to virtualisation, rounded up to whole MiB as Karpenter does."""
    return math.ceil(memory_bytes / MIB * VM_MEMORY_OVERHEAD_PERCENT) * MIB


def kube_reserved_memory_bytes(max_pods: int) -> int:
    return KUBE_RESERVED_MEMORY_PER_POD * max_pods + KUBE_RESERVED_MEMORY_BASE


def eks_max_pods(enis: int, ipv4_per_eni: int) -> int:
    """EKS max pods for the VPC CNI without prefix delegation (eni-max-pods.txt formula)."""
    return enis * (ipv4_per_eni - 1) + 2


# --- Types ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reservation:
    """The capacity reservation behind a reserved offering (planner/reservations.py builds them):
    its id, type (default or capacity-block), whether EC2 may reclaim it, the instances it can still
    take, and the EC2NodeClasses whose capacityReservationSelectorTerms select it (None: any)."""

    id: str
    reservation_type: str = "default"
    interruptible: bool = False
    remaining: int = 0
    nodeclasses: frozenset[str] | None = None

    def serves(self, nodeclass: str | None) -> bool:
        return self.nodeclasses is None or (nodeclass or "") in self.nodeclasses


@dataclass(frozen=True, slots=True)
class Offering:
    """One (zone, capacity type) in which the type can be launched, and its hourly price in USD; a
    reserved offering (capacity type "reserved") names its reservation."""

    zone: str
    capacity_type: str
    price: float
    available: bool = True
    reservation: Reservation | None = None


_NAME = re.compile(r"^(?P<family>(?P<category>[a-z]+)(?P<generation>\d+)[a-z0-9-]*)\.(?P<size>[a-z0-9-]+)$")


@dataclass(frozen=True)
class InstanceType:
    """An EC2 instance type. `cpu` is in millicores and `memory` in bytes (the hardware figures)."""

    name: str
    cpu: int
    memory: int
    pods: int
    arch: str = "amd64"
    offerings: tuple[Offering, ...] = ()
    # A catalog file may state allocatable outright (e.g. measured on a real node); otherwise derived.
    explicit_allocatable: Resources | None = field(default=None, compare=False)
    ephemeral_storage: int = DEFAULT_EPHEMERAL_STORAGE

    # -- capacity / allocatable: what the kubelet would report --------------------------------------
    @cached_property
    def capacity_resources(self) -> Resources:
        return Resources(
            cpu=self.cpu,
            memory=self.memory - vm_memory_overhead_bytes(self.memory),
            pods=self.pods,
            ephemeral_storage=self.ephemeral_storage,
        )

    @cached_property
    def allocatable_resources(self) -> Resources:
        if self.explicit_allocatable is not None:
            return self.explicit_allocatable
        capacity = self.capacity_resources
        storage_reserved = KUBE_RESERVED_EPHEMERAL_STORAGE + math.ceil(
            capacity.ephemeral_storage * EVICTION_THRESHOLD_NODEFS_PERCENT
        )
        return Resources(
            cpu=capacity.cpu - kube_reserved_cpu_millicores(capacity.cpu),
            memory=capacity.memory - kube_reserved_memory_bytes(self.pods) - EVICTION_THRESHOLD_MEMORY,
            pods=self.pods,
            ephemeral_storage=capacity.ephemeral_storage - storage_reserved,
        )

    @property
    def capacity(self) -> dict[str, str]:
        """Node.status.capacity as Kubernetes would print it."""
        return _kube_resource_dict(self.capacity_resources)

    @property
    def allocatable(self) -> dict[str, str]:
        """Node.status.allocatable as Kubernetes would print it."""
        return _kube_resource_dict(self.allocatable_resources)

    # -- labels ------------------------------------------------------------------------------------
    @cached_property
    def labels(self) -> dict[str, str]:
        """The well-known labels a node of this type carries (Karpenter AWS names)."""
        labels = {
            INSTANCE_TYPE_LABEL: self.name,
            ARCH_LABEL: self.arch,
            OS_LABEL: "linux",
            "karpenter.k8s.aws/instance-cpu": str(self.cpu // 1000),
            "karpenter.k8s.aws/instance-memory": str(self.memory // MIB),
        }
        match = _NAME.match(self.name)
        if match:
            labels["karpenter.k8s.aws/instance-category"] = match["category"]
            labels["karpenter.k8s.aws/instance-family"] = match["family"]
            labels["karpenter.k8s.aws/instance-generation"] = match["generation"]
            labels["karpenter.k8s.aws/instance-size"] = match["size"]
        return labels

    @property
    def family(self) -> str:
        return self.labels.get("karpenter.k8s.aws/instance-family", self.name.split(".")[0])

    # -- prices ------------------------------------------------------------------------------------
    def offering(self, zone: str, capacity_type: str) -> Offering | None:
        for offering in self.offerings:
            if offering.zone == zone and offering.capacity_type == capacity_type:
                return offering
        return None

    def price(self, zone: str, capacity_type: str) -> float | None:
        offering = self.offering(zone, capacity_type)
        return offering.price if offering else None

    def compatible_offerings(
        self, capacity_types: Iterable[str] | None = None, zones: Iterable[str] | None = None
    ) -> list[Offering]:
        """Available offerings, optionally restricted to capacity types and zones."""
        ct = set(capacity_types) if capacity_types is not None else None
        zs = set(zones) if zones is not None else None
        return [
            o
            for o in self.offerings
            if o.available and (ct is None or o.capacity_type in ct) and (zs is None or o.zone in zs)
        ]

    def cheapest_price(
        self, capacity_types: Iterable[str] | None = None, zones: Iterable[str] | None = None
    ) -> float | None:
        prices = [o.price for o in self.compatible_offerings(capacity_types, zones)]
        return min(prices) if prices else None

    def worst_case_price(
        self, capacity_types: Iterable[str] | None = None, zones: Iterable[str] | None = None
    ) -> float | None:
        """The most expensive compatible offering: what a flexible launch may end up paying."""
        prices = [o.price for o in self.compatible_offerings(capacity_types, zones)]
        return max(prices) if prices else None


def _kube_resource_dict(res: Resources) -> dict[str, str]:
    return {
        "cpu": format_millicores(res.cpu),
        "memory": format_bytes(res.memory),
        "pods": str(res.pods),
        "ephemeral-storage": format_bytes(res.ephemeral_storage),
    }


# --- Catalog --------------------------------------------------------------------------------------


@dataclass
class Catalog:
    """Instance types of one region, by name."""

    region: str
    types: dict[str, InstanceType]
    source: str = "bundled"
    # NodeOverlay (planner/node_overlay.py): the catalog each NodePool sees, its prices and extended
    # capacity overlaid; a pool without one sees this catalog.
    pool_views: dict[str, Catalog] = field(default_factory=dict, repr=False, compare=False)

    def get(self, name: str | None) -> InstanceType | None:
        return self.types.get(name) if name else None

    def for_pool(self, nodepool: str | None) -> Catalog:
        """The catalog as `nodepool` sees it (NodeOverlays applied)."""
        return self.pool_views.get(nodepool, self) if nodepool else self

    def __contains__(self, name: object) -> bool:
        return name in self.types

    def __iter__(self) -> Iterator[InstanceType]:
        return iter(self.types.values())

    def __len__(self) -> int:
        return len(self.types)

    @property
    def zones(self) -> list[str]:
        return sorted({o.zone for t in self.types.values() for o in t.offerings})


# --- The bundled table ----------------------------------------------------------------------------


def _bundled_data() -> dict[str, Any]:
    text = importlib_resources.files("planner").joinpath("data/instance-types.yaml").read_text()
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def bundled_catalog(region: str = DEFAULT_REGION) -> Catalog:
    """The catalog shipped with karpflow for us-east-1 or us-west-2."""
    data = _bundled_data()
    zones = data["regions"].get(region)
    if zones is None:
        raise CatalogError(
            f"bundled catalog: no data for region {region!r} (bundled: {', '.join(sorted(data['regions']))});"
            " pass --catalog FILE"
        )
    ratios: dict[str, float] = data["spotRatio"]
    types: dict[str, InstanceType] = {}
    for name, (vcpu, memory_gib, arch, enis, ips, on_demand) in data["instanceTypes"].items():
        family = name.split(".")[0]
        spot = round(on_demand * ratios[family], 4)
        offerings = tuple(
            Offering(zone, capacity_type, price)
            for zone in zones
            for capacity_type, price in ((CAPACITY_ON_DEMAND, on_demand), (CAPACITY_SPOT, spot))
        )
        types[name] = InstanceType(
            name=name,
            cpu=vcpu * 1000,
            memory=int(memory_gib * GIB),
            pods=eks_max_pods(enis, ips),
            arch=arch,
            offerings=offerings,
        )
    return Catalog(region=region, types=types, source="bundled table (on-demand 2026-01, spot estimated)")


# --- The override file format ---------------------------------------------------------------------


def catalog_from_dict(data: Mapping[str, Any], source: str = "<catalog>") -> Catalog:
    """Build a catalog from the file format:

    region: us-west-2
    instanceTypes:
    - name: m5.large
      cpu: "2"                     # any Kubernetes quantity
      memory: 8Gi
      pods: 29
      arch: amd64                  # default amd64
      allocatable: {cpu: 1930m, memory: 7Gi, pods: "29"}   # optional; derived when absent
      offerings:
      - {zone: us-west-2a, capacityType: on-demand, price: 0.096}
      - {zone: us-west-2a, capacityType: spot, price: 0.038, available: true}
      # a capacity reservation (planner/reservations.py): its id, type, flag, instances left, and
      # the EC2NodeClasses that select it (absent: every class)
      - {zone: us-west-2a, capacityType: reserved, price: 0.0000000096, reservationID: cr-0abc,
         reservationType: default, interruptible: false, remaining: 2, nodeClasses: [default]}
    """
    if not isinstance(data, Mapping):
        raise CatalogError(f"{source}: expected a mapping with 'region' and 'instanceTypes'")
    region = data.get("region")
    if not isinstance(region, str) or not region:
        raise CatalogError(f"{source}: 'region' is required (e.g. us-west-2)")
    entries = data.get("instanceTypes")
    if not isinstance(entries, list) or not entries:
        raise CatalogError(f"{source}: 'instanceTypes' must be a non-empty list")
    types: dict[str, InstanceType] = {}
    for index, entry in enumerate(entries):
        where = f"{source}: instanceTypes[{index}]"
        if not isinstance(entry, Mapping) or not entry.get("name"):
            raise CatalogError(f"{where}: each instance type needs a 'name'")
        name = str(entry["name"])
        where = f"{source}: instance type {name}"
        if name in types:
            raise CatalogError(f"{where}: listed twice")
        types[name] = _instance_type_from_dict(entry, where)
    return Catalog(region=region, types=types, source=source)


def _instance_type_from_dict(entry: Mapping[str, Any], where: str) -> InstanceType:
    try:
        cpu = millicores(entry["cpu"])
        memory = to_int(entry["memory"])
        pods = int(entry["pods"])
    except KeyError as err:
        missing = err.args[0]
        raise CatalogError(f"{where}: missing field {missing!r} (cpu, memory, pods are required)") from None
    except (QuantityError, ValueError, TypeError) as err:
        raise CatalogError(f"{where}: {err}") from None
    if cpu <= 0 or memory <= 0 or pods <= 0:
        raise CatalogError(f"{where}: cpu, memory and pods must be positive")
    arch = str(entry.get("arch", "amd64"))
    if arch not in ("amd64", "arm64"):
        raise CatalogError(f"{where}: arch {arch!r} must be amd64 or arm64")
    allocatable = None
    if entry.get("allocatable") is not None:
        try:
            allocatable = Resources.from_kube(entry["allocatable"])
        except (QuantityError, AttributeError) as err:
            raise CatalogError(f"{where}: allocatable: {err}") from None
        if not allocatable.pods:
            allocatable = Resources(allocatable.cpu, allocatable.memory, pods, allocatable.ephemeral_storage)
    offerings = []
    for index, raw in enumerate(entry.get("offerings") or []):
        try:
            capacity_type = str(raw["capacityType"])
            offering = Offering(
                zone=str(raw["zone"]),
                capacity_type=capacity_type,
                price=float(raw["price"]),
                available=bool(raw.get("available", True)),
                reservation=_reservation_from_dict(raw, capacity_type),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise CatalogError(
                f"{where}: offerings[{index}]: needs zone, capacityType and a numeric price, and a "
                f"reserved one a reservationID and a whole remaining count ({err})"
            ) from None
        if capacity_type not in KNOWN_CAPACITY_TYPES:
            raise CatalogError(
                f"{where}: offerings[{index}]: capacityType {capacity_type!r} must be one of "
                f"{', '.join(KNOWN_CAPACITY_TYPES)}"
            )
        if offering.price < 0:
            raise CatalogError(f"{where}: offerings[{index}]: price must not be negative")
        if offering.reservation is not None and offering.reservation.remaining == 0:
            offering = replace(offering, available=False)  # Karpenter: no count left, not available
        offerings.append(offering)
    if not offerings:
        raise CatalogError(f"{where}: at least one offering is required")
    return InstanceType(
        name=str(entry["name"]),
        cpu=cpu,
        memory=memory,
        pods=pods,
        arch=arch,
        offerings=tuple(offerings),
        explicit_allocatable=allocatable,
    )


RESERVATION_TYPES = ("default", "capacity-block")


def _reservation_from_dict(raw: Mapping[str, Any], capacity_type: str) -> Reservation | None:
    """A reserved offering's reservation: `reservationID` (required), `reservationType` (default or
    capacity-block), `interruptible`, `remaining` (instances it can still take, 0 when absent, as
    Karpenter counts a reservation it has not synced), `nodeClasses` (the EC2NodeClasses that select
    it; all when absent)."""
    if capacity_type != "reserved":
        return None
    kind = str(raw.get("reservationType", "default"))
    if kind not in RESERVATION_TYPES:
        raise ValueError(f"reservationType {kind!r} must be one of {', '.join(RESERVATION_TYPES)}")
    remaining = raw.get("remaining", 0)
    if isinstance(remaining, bool) or not isinstance(remaining, int) or remaining < 0:
        raise ValueError(f"remaining {remaining!r} must be a whole number, 0 or more")
    classes = raw.get("nodeClasses")
    return Reservation(
        id=str(raw["reservationID"]),
        reservation_type=kind,
        interruptible=raw.get("interruptible", False) is True,
        remaining=remaining,
        nodeclasses=None if classes is None else frozenset(str(c) for c in classes),
    )


def _reservation_to_dict(reservation: Reservation | None) -> dict[str, Any]:
    if reservation is None:
        return {}
    out: dict[str, Any] = {
        "reservationID": reservation.id,
        "reservationType": reservation.reservation_type,
        "interruptible": reservation.interruptible,
        "remaining": reservation.remaining,
    }
    if reservation.nodeclasses is not None:
        out["nodeClasses"] = sorted(reservation.nodeclasses)
    return out


def catalog_to_dict(catalog: Catalog) -> dict[str, Any]:
    """The catalog in the file format (round-trips through `catalog_from_dict`)."""
    return {
        "region": catalog.region,
        "instanceTypes": [
            {
                "name": t.name,
                "cpu": format_millicores(t.cpu),
                "memory": format_bytes(t.memory),
                "pods": t.pods,
                "arch": t.arch,
                **({"allocatable": t.allocatable} if t.explicit_allocatable is not None else {}),
                "offerings": [
                    {
                        "zone": o.zone,
                        "capacityType": o.capacity_type,
                        "price": o.price,
                        **({} if o.available else {"available": False}),
                        **_reservation_to_dict(o.reservation),
                    }
                    for o in t.offerings
                ],
            }
            for t in catalog.types.values()
        ],
    }


def load_catalog_file(path: str | Path) -> Catalog:
    """Read a catalog file (YAML or JSON); CatalogError names the file and the bad entry."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise CatalogError(f"{path}: cannot read catalog ({err.strerror or err})") from None
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        raise CatalogError(f"{path}: not valid YAML/JSON: {err}") from None
    return catalog_from_dict(data, source=str(path))


def load_catalog(path: str | Path | None = None, region: str | None = None) -> Catalog:
    """A catalog file when given, else the bundled table for the region (default us-west-2)."""
    if path is not None:
        return load_catalog_file(path)
    return bundled_catalog(region or DEFAULT_REGION)
