"""The scheduler's cache of the pods that count on nodes, indexed for affinity and spread counting.

kube-scheduler keeps, per node, the pods assigned to it that are not finished (its pod informer
lists `status.phase!=Succeeded,status.phase!=Failed`: pkg/scheduler/scheduler.go) — their requests,
their host ports, and the subsets with pod affinity and with required anti-affinity
(pkg/scheduler/framework/types.go NodeInfo). Terminating pods still count; topology spread skips
them when it counts (podtopologyspread/common.go `countPodsMatchSelector`).

Counting matching pods per candidate node by scanning every pod would be O(pods x nodes) per
pod scheduled. Here each counted pod is indexed by node, by namespace and by (namespace, label,
value), so the pods a selector matches are found from its most selective `key=value` / `key in`
requirement; the pods with pod affinity terms are kept apart, as NodeInfo keeps them.

While a scheduling pass runs, every change to what counts (a bind the pass assumed, an informer
event between two binds) is appended to `changes`; each pod group catches up from it before its
next pod (sim/controllers/scheduling/group.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from planner.resources import ZERO, Resources
from sim.apiserver.selectors import Selector
from sim.controllers.predicates import HostPort
from sim.controllers.scheduling.terms import PodTerms

Key = tuple[str, str]  # (namespace, name)


@dataclass(slots=True)
class PodInfo:
    """What the scheduler knows of one pod. Replaced, never edited, on an informer event; the pass
    edits only `pending` / `node` / `counts` when it assumes its own bind."""

    key: Key
    labels: dict[str, str]
    node: str
    requests: Resources
    nonzero: tuple[int, int]  # (millicores, bytes) with scoring's defaults for containers naming none
    counts: bool  # bound and not finished: it takes room and counts for affinity and spread
    terminating: bool
    pending: bool
    terms: PodTerms | None
    ports: tuple[HostPort, ...]
    signature: bytes = b""
    order: tuple[Any, ...] = ()
    unschedulable_message: str | None = None  # the PodScheduled=False message it carries

    @property
    def namespace(self) -> str:
        return self.key[0]

    def same_footprint(self, other: PodInfo) -> bool:
        """Whether swapping `other` for this one changes nothing that counts (a status update)."""
        return (
            self.counts == other.counts
            and self.node == other.node
            and self.terminating == other.terminating
            and self.labels == other.labels
            and (self.requests is other.requests or self.requests == other.requests)
        )


@dataclass(slots=True)
class Change:
    """One pod that started (+1) or stopped (-1) counting on a node, during a pass."""

    pod: PodInfo
    node: str
    delta: int


@dataclass(slots=True)
class TermHolders:
    """The counted pods that share one parsed set of pod (anti-)affinity terms, per node: the
    replicas of a workload, whose terms are matched against an incoming pod once, not pod by pod."""

    terms: PodTerms
    on_nodes: Counter[str] = field(default_factory=Counter)


@dataclass
class PodCache:
    pods: dict[Key, PodInfo] = field(default_factory=dict)
    used: dict[str, Resources] = field(default_factory=dict)
    used_nonzero: dict[str, tuple[int, int]] = field(default_factory=dict)
    on_node: dict[str, set[Key]] = field(default_factory=dict)
    in_namespace: dict[str, set[Key]] = field(default_factory=dict)
    by_label: dict[tuple[str, str, str], set[Key]] = field(default_factory=dict)
    # Counted pods with pod (anti-)affinity (NodeInfo.PodsWithAffinity), by terms (`id(terms)`:
    # the scheduler parses equal affinities once).
    with_affinity: dict[int, TermHolders] = field(default_factory=dict)
    required_anti_pods: int = 0  # how many of them have required anti-affinity
    # Which of those could select a pod with a given label: each term is filed under the
    # (key, value) pairs of its selector's `key=value` / `key in (...)` requirement, or as unfiled.
    _holders_by_label: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    _holders_unfiled: set[int] = field(default_factory=set)
    ports: dict[str, Counter[HostPort]] = field(default_factory=dict)
    changes: list[Change] | None = None  # set while a pass runs

    # --- counting ----------------------------------------------------------------------------------

    def replace(self, before: PodInfo | None, after: PodInfo | None) -> None:
        """Swap the cached info of one pod; the indexes follow what counts."""
        if after is not None:
            self.pods[after.key] = after
        elif before is not None:
            self.pods.pop(before.key, None)
        if before is not None and after is not None and before.counts and after.same_footprint(before):
            return  # a status update: the spec (terms, ports) is immutable, nothing is re-indexed
        if before is not None and before.counts:
            self._uncount(before)
        if after is not None and after.counts:
            self._count(after)

    def assume(self, info: PodInfo, node: str) -> None:
        """The pass bound `info` to `node`: it counts there at once (kube-scheduler's assume)."""
        info.pending, info.node, info.counts = False, node, True
        self._count(info)

    def _count(self, info: PodInfo) -> None:
        key, node, ns = info.key, info.node, info.namespace
        self.used[node] = self.used.get(node, ZERO) + info.requests
        cpu, memory = self.used_nonzero.get(node, (0, 0))
        self.used_nonzero[node] = (cpu + info.nonzero[0], memory + info.nonzero[1])
        self.on_node.setdefault(node, set()).add(key)
        self.in_namespace.setdefault(ns, set()).add(key)
        for label in info.labels.items():
            self.by_label.setdefault((ns, *label), set()).add(key)
        if info.terms is not None:
            holders = self.with_affinity.get(id(info.terms))
            if holders is None:
                holders = self.with_affinity[id(info.terms)] = TermHolders(info.terms)
                self._file(info.terms, add=True)
            holders.on_nodes[node] += 1
            if info.terms.required_anti:
                self.required_anti_pods += 1
        if info.ports:
            self.ports.setdefault(node, Counter()).update(info.ports)
        if self.changes is not None:
            self.changes.append(Change(info, node, +1))

    def _uncount(self, info: PodInfo) -> None:
        key, node, ns = info.key, info.node, info.namespace
        self.used[node] = self.used.get(node, ZERO) - info.requests
        cpu, memory = self.used_nonzero.get(node, (0, 0))
        self.used_nonzero[node] = (cpu - info.nonzero[0], memory - info.nonzero[1])
        _discard(self.on_node, node, key)
        _discard(self.in_namespace, ns, key)
        for label in info.labels.items():
            _discard(self.by_label, (ns, *label), key)
        if info.terms is not None:
            holders = self.with_affinity.get(id(info.terms))
            if holders is not None:
                holders.on_nodes[node] -= 1
                if holders.on_nodes[node] <= 0:
                    del holders.on_nodes[node]
                if not holders.on_nodes:
                    del self.with_affinity[id(info.terms)]
                    self._file(info.terms, add=False)
            if info.terms.required_anti:
                self.required_anti_pods -= 1
        if info.ports:
            used = self.ports.get(node)
            if used is not None:
                used.subtract(info.ports)
                for port in info.ports:
                    if used[port] <= 0:
                        del used[port]
        if self.changes is not None:
            self.changes.append(Change(info, node, -1))

    def _file(self, terms: PodTerms, add: bool) -> None:
        ident = id(terms)
        every = (
            *terms.required_affinity,
            *terms.required_anti,
            *(w.term for w in terms.preferred_affinity),
            *(w.term for w in terms.preferred_anti),
        )
        for term in every:
            pairs = next(
                ([(r.key, v) for v in r.values] for r in term.selector.requirements if r.op in ("=", "in")),
                None,
            )
            if pairs is None:
                places: list[set[int]] = [self._holders_unfiled]
            else:
                places = [self._holders_by_label.setdefault(pair, set()) for pair in pairs]
            for place in places:
                if add:
                    place.add(ident)
                else:
                    place.discard(ident)
        if not add:
            for pair in [p for p, ids in self._holders_by_label.items() if not ids]:
                del self._holders_by_label[pair]

    # --- reads -------------------------------------------------------------------------------------

    def holders_for(self, labels: Mapping[str, str]) -> Iterator[TermHolders]:
        """The counted pods' terms that may select a pod with these labels (a superset)."""
        ids = set(self._holders_unfiled)
        for pair in labels.items():
            found = self._holders_by_label.get(pair)
            if found:
                ids |= found
        for ident in ids:
            holders = self.with_affinity.get(ident)
            if holders is not None:
                yield holders

    def matching(self, namespaces: Iterable[str], selector: Selector) -> Iterator[PodInfo]:
        """The counted pods in these namespaces whose labels the selector matches."""
        if selector.matches_nothing:
            return
        for ns in namespaces:
            for key in self._candidates(ns, selector):
                info = self.pods.get(key)
                if info is not None and info.counts and selector.matches(info.labels):
                    yield info

    def _candidates(self, namespace: str, selector: Selector) -> Iterable[Key]:
        best: set[Key] | None = None
        for req in selector.requirements:
            if req.op not in ("=", "in"):
                continue
            found: set[Key] = set()
            for value in req.values:
                found |= self.by_label.get((namespace, req.key, value), set())
            if best is None or len(found) < len(best):
                best = found
            if not best:
                break
        if best is not None:
            return best
        return self.in_namespace.get(namespace, ())

    def counted(self, keys: Iterable[Key]) -> Iterator[PodInfo]:
        for key in keys:
            info = self.pods.get(key)
            if info is not None and info.counts:
                yield info


def _discard(index: dict[Any, set[Key]], where: Any, key: Key) -> None:
    keys = index.get(where)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[where]
