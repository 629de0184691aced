"""Instance types for simulated nodes: the planner's catalog first, moto's DescribeInstanceTypes second.

Using `planner.catalog` keeps the simulated nodes and the planner in agreement to the byte. A type the
catalog lacks is built from DescribeInstanceTypes (vCPUs, memory, ENIs x IPv4 per ENI → EKS max
pods) with the catalog's own `InstanceType`, so its allocatable follows the same formula. A type
neither knows (moto accepts any string) gets a generic 2 vCPU / 8 GiB shape and a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from planner.catalog import GIB, MIB, Catalog, InstanceType, eks_max_pods

log = logging.getLogger(__name__)

_ARCH = {"x86_64": "amd64", "arm64": "arm64"}

DescribeTypes = Callable[[list[str]], list[Mapping[str, Any]]]


def from_describe_instance_types(entry: Mapping[str, Any]) -> InstanceType:
    network = entry.get("NetworkInfo") or {}
    arches = (entry.get("ProcessorInfo") or {}).get("SupportedArchitectures") or ["x86_64"]
    return InstanceType(
        name=str(entry["InstanceType"]),
        cpu=int((entry.get("VCpuInfo") or {}).get("DefaultVCpus", 2)) * 1000,
        memory=int((entry.get("MemoryInfo") or {}).get("SizeInMiB", 8192)) * MIB,
        pods=eks_max_pods(
            int(network.get("MaximumNetworkInterfaces", 3)), int(network.get("Ipv4AddressesPerInterface", 10))
        ),
        arch=_ARCH.get(arches[0], "amd64"),
    )


def generic(name: str) -> InstanceType:
    return InstanceType(name=name, cpu=2000, memory=8 * GIB, pods=29)


class InstanceTypes:
    """Name → InstanceType with a cache; `fill` does blocking EC2 calls and runs in a worker thread."""

    def __init__(self, catalog: Catalog, describe: DescribeTypes | None = None) -> None:
        self.catalog = catalog
        self._describe = describe
        self._extra: dict[str, InstanceType] = {}

    def get(self, name: str) -> InstanceType | None:
        return self.catalog.get(name) or self._extra.get(name)

    def missing(self, names: Iterable[str]) -> list[str]:
        return sorted({n for n in names if self.get(n) is None})

    def fill(self, names: Iterable[str]) -> None:
        """Resolve unknown names through DescribeInstanceTypes (blocking)."""
        wanted = self.missing(names)
        if not wanted:
            return
        found: dict[str, InstanceType] = {}
        if self._describe is not None:
            for start in range(0, len(wanted), 100):  # the API's page limit for explicit names
                try:
                    entries = self._describe(wanted[start : start + 100])
                except Exception as err:  # an unknown name fails the whole call: go one by one
                    log.debug("DescribeInstanceTypes %s failed: %s", wanted[start : start + 100], err)
                    entries = []
                    for name in wanted[start : start + 100]:
                        try:
                            entries.extend(self._describe([name]))
                        except Exception:
                            continue
                for entry in entries:
                    itype = from_describe_instance_types(entry)
                    found[itype.name] = itype
        for name in wanted:
            if name not in found:
                log.warning("instance type %s is in neither the catalog nor EC2: using 2 vCPU / 8 GiB", name)
                found[name] = generic(name)
        self._extra.update(found)
