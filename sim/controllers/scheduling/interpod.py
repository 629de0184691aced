"""InterPodAffinity for one pod group, kept current bind by bind (kubernetes/kubernetes v1.33-v1.35,
pkg/scheduler/framework/plugins/interpodaffinity/).

Filter (filtering.go), counted per topology pair (key, value) of the nodes the matching pods run on
(terminating pods included, as NodeInfo keeps them):
- the incoming pod's required affinity: a node must carry every term's key, and an existing pod
  matching all the terms must run in the node's domain of each — unless no pod anywhere matches them
  and the pod matches its own terms (the first of a group that attracts itself) — "node(s) didn't
  match pod affinity rules";
- its required anti-affinity: no pod matching a term in the node's domain of that term's key —
  "node(s) didn't match pod anti-affinity rules";
- the existing pods' required anti-affinity: no pod whose term matches the incoming pod (with the
  incoming pod's namespace labels) in any domain the node is in — "node(s) didn't satisfy existing
  pods anti-affinity rules".

Score (scoring.go), per topology pair of an existing pod's node: + / - the weight of each of the
incoming pod's preferred affinity / anti-affinity terms the existing pod matches, + 1 (the default
hardPodAffinityWeight) for each of the existing pod's required affinity terms and + / - the weight of
each of its preferred terms the incoming pod matches; a node scores the sum over its labels,
normalized between the lowest and the highest candidate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from sim.controllers.scheduling.cache import Change, PodCache, PodInfo
from sim.controllers.scheduling.scores import Ints, inter_pod_normalized
from sim.controllers.scheduling.snapshot import PassNodes
from sim.controllers.scheduling.terms import AffinityTerm, PodTerms, WeightedTerm

Bools = npt.NDArray[np.bool_]
REASON_AFFINITY = "node(s) didn't match pod affinity rules"
REASON_ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
REASON_EXISTING_ANTI_AFFINITY = "node(s) didn't satisfy existing pods anti-affinity rules"
HARD_POD_AFFINITY_WEIGHT = 1
_NO_LABELS: Mapping[str, str] = {}


class _Incoming:
    """The pod being placed, and what every rule needs of it."""

    def __init__(
        self, namespace: str, labels: Mapping[str, str], terms: PodTerms, namespace_labels: Mapping[str, str]
    ) -> None:
        self.namespace = namespace
        self.labels = labels
        self.terms = terms  # namespace selectors already unrolled into names
        self.namespace_labels = namespace_labels
        # Per existing pods' terms (one object per distinct affinity: the scheduler interns them).
        self._repelled: dict[int, list[str]] = {}
        self._attracted: dict[int, list[tuple[str, int]]] = {}

    def matched_by(self, term: AffinityTerm) -> bool:
        """An existing pod's term selects the incoming pod."""
        return term.matches(self.namespace, self.labels, self.namespace_labels)

    def repelled_by(self, terms: PodTerms) -> list[str]:
        """The topology keys of the existing pods' required anti-affinity terms that select it."""
        found = self._repelled.get(id(terms))
        if found is None:
            found = self._repelled[id(terms)] = [
                t.topology_key for t in terms.required_anti if self.matched_by(t)
            ]
        return found

    def attracted_by(self, terms: PodTerms) -> list[tuple[str, int]]:
        """(topology key, score per pod) of the existing pods' terms that select it: required
        affinity at the hard-affinity weight, preferred terms at theirs (anti-affinity negative)."""
        found = self._attracted.get(id(terms))
        if found is None:
            found = [
                (t.topology_key, HARD_POD_AFFINITY_WEIGHT)
                for t in terms.required_affinity
                if self.matched_by(t)
            ]
            found += [
                (weighted.term.topology_key, sign * weighted.weight)
                for weighted, sign in _signed(terms)
                if self.matched_by(weighted.term)
            ]
            self._attracted[id(terms)] = found
        return found


def _namespaces(cache: PodCache, term: AffinityTerm) -> Iterable[str]:
    """Where one of the incoming pod's terms looks: the names, or every namespace for an empty
    namespaceSelector (the only selector left once unrolled)."""
    if term.namespace_selector.empty:
        return list(cache.in_namespace)
    return term.namespaces


def _selects(term: AffinityTerm, pod: PodInfo) -> bool:
    """One of the incoming pod's terms selects an existing pod (names only: selectors unrolled)."""
    return term.matches(pod.namespace, pod.labels, _NO_LABELS)


class InterPodFilter:
    def __init__(self, nodes: PassNodes, cache: PodCache, incoming: _Incoming) -> None:
        self.nodes = nodes
        self.incoming = incoming
        self.touched = False  # whether any count was ever not zero (else every node passes)
        size = len(nodes)
        self.existing_anti = np.zeros(size, dtype=np.int64)  # matching pairs a node is in
        self.anti = np.zeros(size, dtype=np.int64)
        terms = incoming.terms
        self.affinity_keys = sorted({t.topology_key for t in terms.required_affinity})
        self.affinity = {key: np.zeros(size, dtype=np.int64) for key in self.affinity_keys}
        self.affinity_total = 0
        has_keys = np.ones(size, dtype=np.bool_)
        for key in self.affinity_keys:
            has_keys &= nodes.has_label(key)
        self.has_affinity_keys = has_keys
        self.self_match = bool(terms.required_affinity) and all(
            t.matches(incoming.namespace, incoming.labels, _NO_LABELS) for t in terms.required_affinity
        )
        for holders in cache.holders_for(incoming.labels):
            for key in incoming.repelled_by(holders.terms):
                for node, count in holders.on_nodes.items():
                    self._bump(self.existing_anti, key, node, count)
        if terms.required_affinity:
            first = terms.required_affinity[0]
            for pod in cache.matching(_namespaces(cache, first), first.selector):
                self._affinity(pod, pod.node, 1)
        for term in terms.required_anti:
            for pod in cache.matching(_namespaces(cache, term), term.selector):
                self._bump(self.anti, term.topology_key, pod.node, 1)

    def _bump(self, counts: Ints, key: str, node_name: str, delta: int) -> bool:
        node = self.nodes.index.get(node_name)
        if node is None:
            return False
        value = self.nodes.labels[node].get(key)
        if value is None:
            return False
        counts[self.nodes.with_label(key, value)] += delta
        self.touched = True
        return True

    def _existing(self, pod: PodInfo, node: str, delta: int) -> None:
        if pod.terms is not None:
            for key in self.incoming.repelled_by(pod.terms):
                self._bump(self.existing_anti, key, node, delta)

    def _affinity(self, pod: PodInfo, node: str, delta: int) -> None:
        terms = self.incoming.terms.required_affinity
        if terms and all(_selects(t, pod) for t in terms):
            for term in terms:
                if self._bump(self.affinity[term.topology_key], term.topology_key, node, delta):
                    self.affinity_total += delta

    def apply(self, change: Change) -> None:
        pod, node, delta = change.pod, change.node, change.delta
        self._existing(pod, node, delta)
        self._affinity(pod, node, delta)
        for term in self.incoming.terms.required_anti:
            if _selects(term, pod):
                self._bump(self.anti, term.topology_key, node, delta)

    def _affinity_ok(self) -> Bools:
        if not self.affinity_keys:
            return np.ones(len(self.nodes), dtype=np.bool_)
        exist = np.ones(len(self.nodes), dtype=np.bool_)
        for key in self.affinity_keys:
            exist &= self.affinity[key] > 0
        if self.affinity_total == 0 and self.self_match:
            exist[:] = True
        out: Bools = self.has_affinity_keys & exist
        return out

    def mask(self) -> Bools | None:
        """Which nodes pass; None when all do (nothing counted and no affinity of its own)."""
        if not self.touched and not self.affinity_keys:
            return None
        out: Bools = self._affinity_ok() & (self.anti == 0) & (self.existing_anti == 0)
        return out

    def reasons(self) -> list[str | None]:
        affinity = self._affinity_ok()
        out: list[str | None] = []
        for node in range(len(self.nodes)):
            if not affinity[node]:
                out.append(REASON_AFFINITY)
            elif self.anti[node]:
                out.append(REASON_ANTI_AFFINITY)
            elif self.existing_anti[node]:
                out.append(REASON_EXISTING_ANTI_AFFINITY)
            else:
                out.append(None)
        return out


class InterPodScore:
    def __init__(self, nodes: PassNodes, cache: PodCache, incoming: _Incoming) -> None:
        self.nodes = nodes
        self.incoming = incoming
        self.raw = np.zeros(len(nodes), dtype=np.int64)
        self.touched = False  # all scores 0 until then: normalized, every node scores 0
        terms = incoming.terms
        for weighted, sign in _signed(terms):
            term = weighted.term
            for pod in cache.matching(_namespaces(cache, term), term.selector):
                self._add(term.topology_key, pod.node, sign * weighted.weight)
        for holders in cache.holders_for(incoming.labels):
            for key, amount in incoming.attracted_by(holders.terms):
                for node, count in holders.on_nodes.items():
                    self._add(key, node, amount * count)

    def _add(self, key: str, node_name: str, amount: int) -> None:
        node = self.nodes.index.get(node_name)
        if node is None or amount == 0:
            return
        value = self.nodes.labels[node].get(key)
        if value is not None:
            self.raw[self.nodes.with_label(key, value)] += amount
            self.touched = True

    def apply(self, change: Change) -> None:
        pod, node, delta = change.pod, change.node, change.delta
        for weighted, sign in _signed(self.incoming.terms):
            if _selects(weighted.term, pod):
                self._add(weighted.term.topology_key, node, sign * weighted.weight * delta)
        if pod.terms is not None:
            for key, amount in self.incoming.attracted_by(pod.terms):
                self._add(key, node, amount * delta)

    def scores(self, candidates: npt.NDArray[np.intp]) -> Ints | None:
        """The normalized scores of the candidates; None when they are all 0."""
        if not self.touched:
            return None
        return inter_pod_normalized(self.raw[candidates])


def _signed(terms: PodTerms) -> Iterable[tuple[WeightedTerm, int]]:
    for weighted in terms.preferred_affinity:
        yield weighted, 1
    for weighted in terms.preferred_anti:
        yield weighted, -1


def incoming(
    namespace: str, labels: Mapping[str, str], terms: PodTerms, namespace_labels: Mapping[str, str]
) -> _Incoming:
    return _Incoming(namespace, labels, terms, namespace_labels)
