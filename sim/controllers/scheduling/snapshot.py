"""The nodes one scheduling pass places pods on, as arrays (kube-scheduler's snapshot of NodeInfos).

Nodes are in name order, so the first of equal best scores is the lowest name: a run is deterministic
where kube-scheduler picks one of the best at random. A node that changes or goes while the pass runs
(an informer event between two binds) is left out for the rest of the pass; the event wakes the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from planner.resources import ZERO, Resources
from sim.controllers.scheduling.cache import PodCache

Ints = npt.NDArray[np.int64]
Indexes = npt.NDArray[np.intp]


class PassNodes:
    def __init__(self, nodes: Mapping[str, tuple[dict[str, Any], Resources]], cache: PodCache) -> None:
        self.cache = cache
        self.names = sorted(nodes)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.objects = [nodes[name][0] for name in self.names]
        self.allocatable = [nodes[name][1] for name in self.names]
        self.labels: list[dict[str, str]] = [
            (obj.get("metadata") or {}).get("labels") or {} for obj in self.objects
        ]
        self.alloc_cpu = np.array([a.cpu for a in self.allocatable], dtype=np.int64)
        self.alloc_mem = np.array([a.memory for a in self.allocatable], dtype=np.int64)
        self.alloc_pods = np.array([a.pods for a in self.allocatable], dtype=np.int64)
        self.alloc_storage = np.array([a.ephemeral_storage for a in self.allocatable], dtype=np.int64)
        size = len(self.names)
        self.used_cpu = np.zeros(size, dtype=np.int64)
        self.used_mem = np.zeros(size, dtype=np.int64)
        self.used_pods = np.zeros(size, dtype=np.int64)
        self.used_storage = np.zeros(size, dtype=np.int64)
        self.nonzero_cpu = np.zeros(size, dtype=np.int64)
        self.nonzero_mem = np.zeros(size, dtype=np.int64)
        for i in range(size):
            self._load(i)
        self.excluded: set[int] = set()
        self._cursor = len(cache.changes or ())
        self._value_ids: dict[tuple[str, bool], tuple[Ints, list[str]]] = {}
        self._with_label: dict[tuple[str, str], Indexes] = {}

    def __len__(self) -> int:
        return len(self.names)

    def _load(self, i: int) -> None:
        name = self.names[i]
        used = self.cache.used.get(name, ZERO)
        self.used_cpu[i], self.used_mem[i] = used.cpu, used.memory
        self.used_pods[i], self.used_storage[i] = used.pods, used.ephemeral_storage
        self.nonzero_cpu[i], self.nonzero_mem[i] = self.cache.used_nonzero.get(name, (0, 0))

    def sync(self) -> None:
        """Bring the usage arrays up to date with the pass's changes (before a group is built)."""
        changes = self.cache.changes or []
        for change in changes[self._cursor :]:
            i = self.index.get(change.node)
            if i is not None:
                self._load(i)
        self._cursor = len(changes)

    def exclude(self, name: str) -> None:
        i = self.index.get(name)
        if i is not None:
            self.excluded.add(i)

    # --- labels ----------------------------------------------------------------------------------------

    def value_ids(self, key: str, missing_as_empty: bool = False) -> tuple[Ints, list[str]]:
        """Per node, the id of its value for `key` in the returned value list; -1 where the node has
        no such label (or the id of "" with `missing_as_empty`)."""
        cached = self._value_ids.get((key, missing_as_empty))
        if cached is not None:
            return cached
        values: list[str] = []
        ids: dict[str, int] = {}
        out = np.full(len(self.names), -1, dtype=np.int64)
        for i, labels in enumerate(self.labels):
            value = labels.get(key)
            if value is None:
                if not missing_as_empty:
                    continue
                value = ""
            found = ids.get(value)
            if found is None:
                found = ids[value] = len(values)
                values.append(value)
            out[i] = found
        self._value_ids[(key, missing_as_empty)] = (out, values)
        return out, values

    def has_label(self, key: str) -> npt.NDArray[np.bool_]:
        ids, _ = self.value_ids(key)
        out: npt.NDArray[np.bool_] = ids >= 0
        return out

    def with_label(self, key: str, value: str) -> Indexes:
        """The nodes labelled key=value."""
        cached = self._with_label.get((key, value))
        if cached is None:
            ids, values = self.value_ids(key)
            try:
                wanted = values.index(value)
            except ValueError:
                cached = np.zeros(0, dtype=np.intp)
            else:
                cached = np.flatnonzero(ids == wanted)
            self._with_label[(key, value)] = cached
        return cached
