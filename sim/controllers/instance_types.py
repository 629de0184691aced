"""Instance types for simulated nodes: the planner's catalog first, moto's DescribeInstanceTypes second.

Using `planner.catalog` keeps the simulated nodes and the planner in agreement to the byte. A type the
catalog lacks is built from DescribeInstanceTypes (vCPUs, memory, ENIs x IPv4 per ENI → EKS max
pods) by the live catalog's own `instance_type_from_describe`, so its allocatable follows the same
formula. A type neither knows (moto accepts any string) gets a generic 2 vCPU / 8 GiB shape and a
warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from planner.catalog import GIB, Catalog, InstanceType
from planner.catalog_live import instance_type_from_describe

log = logging.getLogger(__name__)

DescribeTypes = Callable[[list[str]], list[Mapping[str, Any]]]


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
                    itype = instance_type_from_describe(entry)
                    found[itype.name] = itype
        for name in wanted:
            if name not in found:
                log.warning("instance type %s is in neither the catalog nor EC2: using 2 vCPU / 8 GiB", name)
                found[name] = generic(name)
        self._extra.update(found)
