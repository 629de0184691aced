"""What the pod groups of one scheduling pass share: the nodes, the pod cache, the informer's other
kinds, and memos of what does not depend on other pods (the node-local filters of a set of
tolerations and node selection, the PreferNoSchedule counts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from sim.controllers.predicates import (
    REASON_PREFILTER_NODE_AFFINITY,
    node_selection_matches,
    preferred_against,
    prefilter_node_names,
    static_failure,
)
from sim.controllers.scheduling.cache import PodCache
from sim.controllers.scheduling.snapshot import PassNodes

Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Lookups:
    """What the scheduler's informer holds beside nodes and pods."""

    namespaces: Callable[[], Iterable[tuple[str, Mapping[str, str]]]]
    namespace_labels: Callable[[str], Mapping[str, str]]
    services: Callable[[str], Iterable[Mapping[str, Any]]]
    controller: Callable[[str, str, str], Mapping[str, Any] | None]


class PassContext:
    """What the groups of one pass share: the nodes, the pod cache, and per-pass memos of what does
    not depend on other pods."""

    def __init__(self, nodes: PassNodes, cache: PodCache, lookups: Lookups) -> None:
        self.nodes = nodes
        self.cache = cache
        self.lookups = lookups
        self._static: dict[bytes, tuple[Bools, list[str | None]]] = {}
        self._taints: dict[bytes, Ints | None] = {}
        self._selection: dict[bytes, Bools] = {}

    def static(self, spec: Mapping[str, Any]) -> tuple[Bools, list[str | None]]:
        """NodeUnschedulable, TaintToleration and NodeAffinity for every node: (passes, reasons)."""
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        key = orjson.dumps(
            [spec.get("tolerations"), spec.get("nodeSelector"), affinity], option=orjson.OPT_SORT_KEYS
        )
        found = self._static.get(key)
        if found is None:
            nodes = self.nodes
            pinned = prefilter_node_names(spec)
            if pinned is None:
                reasons = [static_failure(spec, obj) for obj in nodes.objects]
            else:
                reasons = [REASON_PREFILTER_NODE_AFFINITY] * len(nodes)
                for name in pinned:
                    i = nodes.index.get(name)
                    if i is not None:
                        reasons[i] = static_failure(spec, nodes.objects[i])
            found = (np.array([r is None for r in reasons], dtype=np.bool_), reasons)
            self._static[key] = found
        return found

    def node_selection(self, spec: Mapping[str, Any]) -> Bools:
        """Which nodes the pod's nodeSelector and required node affinity select."""
        affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        key = orjson.dumps([spec.get("nodeSelector"), affinity], option=orjson.OPT_SORT_KEYS)
        found = self._selection.get(key)
        if found is None:
            if not spec.get("nodeSelector") and affinity is None:
                found = np.ones(len(self.nodes), dtype=np.bool_)
            else:
                found = np.array(
                    [node_selection_matches(spec, obj) for obj in self.nodes.objects], dtype=np.bool_
                )
            self._selection[key] = found
        return found

    def taint_counts(self, spec: Mapping[str, Any]) -> Ints | None:
        """TaintToleration's raw scores, None when no node has a PreferNoSchedule taint against it."""
        key = orjson.dumps(spec.get("tolerations"), option=orjson.OPT_SORT_KEYS)
        if key not in self._taints:
            raw = np.array([preferred_against(spec, obj) for obj in self.nodes.objects], dtype=np.int64)
            self._taints[key] = raw if raw.any() else None
        return self._taints[key]
