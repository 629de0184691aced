"""Requirements and topology: what a pod signature asks at each relaxation level of its
preferences, and the topology groups (spread, pod affinity, anti-affinity) that count placed pods.

A part of `Simulator` (planner/scheduling/simulator.py): the state and the other rooms' methods it
reads are declared in `SimulatorState` (state.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from kube.selectors import Toleration
from planner.scheduling.inputs import LabelSelector, PodAffinityTerm, PodConstraints
from planner.scheduling.requirements import EMPTY_REQS, Reqs, freeze, labels_match
from planner.scheduling.results import IGNORE
from planner.scheduling.state import (
    AFFINITY,
    ANTI,
    HOSTNAME,
    SPREAD,
    Effective,
    GroupKey,
    LabelSet,
    PreparedNode,
    Probe,
    SimulatorState,
    TopologyGroup,
)

_T = TypeVar("_T")


def _by_weight(items: Sequence[tuple[int, _T]]) -> list[tuple[int, _T]]:
    """Weighted preferences, heaviest first (stable: equal weights keep their order)."""
    return sorted(items, key=lambda wt: -wt[0])


class Topology(SimulatorState):
    """Pod signatures at each relaxation level, and the topology groups that count placed pods."""

    def _levels(self, sig: PodConstraints) -> int:
        """How many relaxations a signature has (0 when preferences are ignored or absent)."""
        n = self._levels_cache.get(sig)
        if n is None:
            n = (
                len(sig.preferred_affinity)
                + len(sig.preferred_anti_affinity)
                + len(sig.preferred_node_terms)
                + sum(1 for s in sig.spreads if not s.hard)
            )
            self._levels_cache[sig] = n
        return n

    def _eff(self, sig: PodConstraints, level: int) -> Effective:
        cached = self._eff_cache.get((sig, level))
        if cached is not None:
            return cached
        if self.preference_policy == IGNORE:
            level = self._levels(sig)
        left = level

        def drop(items: Sequence[_T]) -> list[_T]:
            nonlocal left
            n = min(left, len(items))
            left -= n
            return list(items[n:])

        pref_aff = [t for _, t in drop(_by_weight(sig.preferred_affinity))]
        pref_anti = [t for _, t in drop(_by_weight(sig.preferred_anti_affinity))]
        pref_node = [t for _, t in drop(_by_weight(sig.preferred_node_terms))]
        soft = [s for s in sig.spreads if not s.hard]
        soft = drop(soft)
        spreads = [s for s in sig.spreads if s.hard] + soft

        required = sig.node_terms or (EMPTY_REQS,)
        terms = tuple(freeze((*t, *pref_node[0])) for t in required) if pref_node else required
        self._note_keys(terms)
        groups: list[int] = []
        for s in spreads:
            groups.append(
                self._group(
                    SPREAD,
                    s.topology_key,
                    frozenset((sig.namespace,)),
                    s.selector,
                    s.max_skew,
                    s.min_domains,
                    required,
                    sig,
                )
            )
        for term in [*sig.affinity, *pref_aff]:
            groups.append(
                self._group(AFFINITY, term.topology_key, term.namespaces, term.selector, 0, None, (), sig)
            )
        for term in [*sig.anti_affinity, *pref_anti]:
            groups.append(
                self._group(ANTI, term.topology_key, term.namespaces, term.selector, 0, None, (), sig)
            )
        vec = self._vec(sig.requests)
        static_key = (terms, sig.tolerations)
        hostname_reqs = tuple(tuple(r for r in t if r.key == HOSTNAME) for t in terms)
        eff = Effective(
            sig=sig,
            vec=vec,
            terms=terms,
            filter_terms=required,
            tolerations=sig.tolerations,
            ports=sig.host_ports,
            groups=tuple(dict.fromkeys(groups)),
            owned_anti=sig.anti_affinity,
            fitkey=(static_key, vec, sig.host_ports),
            static_key=static_key,
            labelset=(sig.namespace, sig.labels),
            hostname_reqs=hostname_reqs,
            monotone=all(self._groups[g].kind == ANTI for g in groups),
        )
        self._eff_cache[(sig, level)] = eff
        return eff

    def _group(
        self,
        kind: int,
        key: str,
        namespaces: frozenset[str] | None,
        selector: LabelSelector,
        max_skew: int,
        min_domains: int | None,
        filter_terms: tuple[Reqs, ...],
        owner: PodConstraints,
    ) -> int:
        gkey: GroupKey = (
            kind,
            key,
            namespaces,
            selector,
            max_skew,
            min_domains,
            filter_terms if kind == SPREAD else (),
        )
        gid = self._group_ids.get(gkey)
        if gid is not None:
            return gid
        gid = len(self._groups)
        probe = TopologyGroup(
            gid, *gkey, {}, {}, frozenset()
        )  # the key's fields are TopologyGroup's, in order

        unfiltered = kind != SPREAD or EMPTY_REQS in filter_terms  # no node affinity: every node counts

        def node_passes(n: PreparedNode) -> bool:
            return unfiltered or any(labels_match(t, n.labels) for t in filter_terms)

        for ns, labels in self._labelsets_for(selector):
            if probe.selects(ns, dict(labels)):
                for idx, count in self._labelsets[(ns, labels)].items():
                    if node_passes(self.nodes[idx]):
                        probe.per_node[idx] = probe.per_node.get(idx, 0) + count
        for idx, count in probe.per_node.items():
            domain = self.nodes[idx].labels.get(key)
            if domain is not None:
                probe.baseline[domain] = probe.baseline.get(domain, 0) + count
        if kind == SPREAD and key != HOSTNAME:
            probe.universe = self._universe(key, filter_terms, owner.tolerations, node_passes)
        self._groups.append(probe)
        self._group_ids[gkey] = gid
        match_labels = selector.match_labels
        if selector.nothing:
            pass  # selects no pod: never counts anything
        elif match_labels:
            self._groups_by_label.setdefault(match_labels[0], []).append(gid)
        else:
            self._groups_scan.append(gid)
        return gid

    def _universe(
        self,
        key: str,
        filter_terms: tuple[Reqs, ...],
        tolerations: tuple[Toleration, ...],
        node_passes: Callable[[PreparedNode], bool],
    ) -> frozenset[str]:
        """The domains a spread may use: those of existing nodes its pods may run on, and those new
        nodes from the pools they tolerate could get. Shared by every group with the same inputs."""
        ck = (key, filter_terms, tolerations)
        cached = self._universes.get(ck)
        if cached is not None:
            return cached
        universe = {n.labels[key] for n in self.nodes if key in n.labels and node_passes(n)}
        for pool in self._pools:
            if not self._pool_tolerated(pool, tolerations):
                continue
            for term in filter_terms:
                merged = self._merge(pool.base, pool.base_keys, term)
                if merged is not None:
                    universe |= self._pool_domains(pool, merged, key, frozenset())
        result = self._universes[ck] = frozenset(universe)
        return result

    def _labelsets_for(self, selector: LabelSelector) -> Iterable[LabelSet]:
        """Bound-pod label sets a selector may match: through the label index when it has matchLabels."""
        if selector.nothing:
            return ()
        match_labels = selector.match_labels
        if not match_labels:
            return list(self._labelsets)
        lists = [self._labelset_index.get(pair, ()) for pair in match_labels]
        return min(lists, key=len)

    def _selecting(self, labelset: LabelSet) -> list[TopologyGroup]:
        """Groups whose selector selects pods with these (namespace, labels)."""
        cached = self._selecting_cache.get(labelset)
        if cached is not None and cached[0] == len(self._groups):
            return cached[1]
        ns, labels = labelset
        lm = dict(labels)
        gids = set(self._groups_scan)
        for pair in labels:
            gids.update(self._groups_by_label.get(pair, ()))
        out = [self._groups[g] for g in sorted(gids) if self._groups[g].selects(ns, lm)]
        self._selecting_cache[labelset] = (len(self._groups), out)
        return out

    def _index_inverse(self, term: PodAffinityTerm) -> None:
        selector = term.selector
        if selector.nothing:
            return
        if selector.match_labels:
            self._inv_by_label.setdefault(selector.match_labels[0], []).append(term)
        else:
            self._inv_scan.append(term)

    def _inverse_terms(self, labelset: LabelSet) -> list[PodAffinityTerm]:
        """Required anti-affinity terms of placed pods that select pods with these (namespace, labels)."""
        cached = self._inv_cache.get(labelset)
        if cached is not None and cached[0] == self._inv_version:
            return cached[1]
        ns, labels = labelset
        lm = dict(labels)
        candidates = list(self._inv_scan)
        for pair in labels:
            candidates.extend(self._inv_by_label.get(pair, ()))
        out = [t for t in dict.fromkeys(candidates) if t.selects(ns, lm)]
        self._inv_cache[labelset] = (self._inv_version, out)
        return out

    def _count(self, probe: Probe, g: TopologyGroup, domain: str) -> int:
        delta = probe.delta.get(g.gid)
        if delta is None:
            delta = self._start_delta(probe, g)
        return g.baseline.get(domain, 0) + delta.get(domain, 0)

    def _start_delta(self, probe: Probe, g: TopologyGroup) -> dict[str, int]:
        delta: dict[str, int] = {}
        for idx in probe.removed:
            c = g.per_node.get(idx)
            if c:
                d = self.nodes[idx].labels.get(g.key)
                if d is not None:
                    delta[d] = delta.get(d, 0) - c
        probe.delta[g.gid] = delta
        return delta

    def _inv_delta(self, probe: Probe, term: PodAffinityTerm) -> dict[str, int]:
        delta = probe.inv_delta.get(term)
        if delta is None:
            delta = {}
            owners: Mapping[int, int] = self._inv_terms.get(term, {})
            for idx in probe.removed:
                c = owners.get(idx)
                if c:
                    d = self.nodes[idx].labels.get(term.topology_key)
                    if d is not None:
                        delta[d] = delta.get(d, 0) - c
            probe.inv_delta[term] = delta
        return delta

    def _inv_count(self, probe: Probe, term: PodAffinityTerm, domain: str) -> int:
        """Pods in `domain` whose required anti-affinity `term` forbids company it selects."""
        base = self._inv_base.get(term)
        if base is None:
            base = {}
            for idx, c in self._inv_terms.get(term, {}).items():
                d = self.nodes[idx].labels.get(term.topology_key)
                if d is not None:
                    base[d] = base.get(d, 0) + c
            self._inv_base[term] = base
        return base.get(domain, 0) + self._inv_delta(probe, term).get(domain, 0)

    def _min_count(self, probe: Probe, g: TopologyGroup) -> int:
        if g.key == HOSTNAME:
            return 0  # a new node is always an empty hostname domain
        if g.min_domains is not None and len(g.universe) < g.min_domains:
            return 0
        return min((self._count(probe, g, d) for d in g.universe), default=0)

    def _domain_ok(
        self, probe: Probe, eff: Effective, g: TopologyGroup, domain: str, lm: dict[str, str]
    ) -> bool:
        if g.kind == SPREAD:
            count = self._count(probe, g, domain) + (1 if g.selects(eff.sig.namespace, lm) else 0)
            return count - self._min_count(probe, g) <= g.max_skew
        if g.kind == ANTI:
            return self._count(probe, g, domain) == 0
        # Affinity: a domain with a matching pod, or anywhere if nothing matches yet and the pod
        # matches itself (the first replica of a self-affine workload).
        if self._count(probe, g, domain) > 0:
            return True
        return g.selects(eff.sig.namespace, lm) and self._total(probe, g) == 0

    def _total(self, probe: Probe, g: TopologyGroup) -> int:
        delta = probe.delta.get(g.gid)
        if delta is None:
            delta = self._start_delta(probe, g)
        return sum(g.baseline.values()) + sum(delta.values())

    def _topology_ok_node(self, probe: Probe, eff: Effective, node: PreparedNode) -> bool:
        if eff.groups:
            lm = eff.sig.label_map
            for gid in eff.groups:
                g = self._groups[gid]
                domain = node.labels.get(g.key)
                if domain is None:
                    if g.kind == ANTI:
                        continue  # no domain: nothing shares it
                    return False
                if not self._domain_ok(probe, eff, g, domain, lm):
                    return False
        if self._inv_terms:
            for term in self._inverse_terms(eff.labelset):
                domain = node.labels.get(term.topology_key)
                if domain is not None and self._inv_count(probe, term, domain) > 0:
                    return False
        return True

    def _record(
        self,
        probe: Probe,
        eff: Effective,
        domains_for: Callable[[str], frozenset[str]],
        filter_ok: Callable[[TopologyGroup], bool],
        sign: int = 1,
    ) -> None:
        """Count a placed pod (sign -1: uncount it) in every topology group that selects it."""
        for g in self._selecting(eff.labelset):
            domains = domains_for(g.key)
            if not domains or not filter_ok(g):
                continue
            if g.kind != ANTI and len(domains) != 1:
                continue  # spread and affinity count a pod only once its domain is known
            delta = probe.delta.get(g.gid)
            if delta is None:
                delta = self._start_delta(probe, g)
            for d in domains:
                delta[d] = delta.get(d, 0) + sign
        for term in eff.owned_anti:
            if term not in self._inv_terms:
                self._inv_terms[term] = Counter()
                self._index_inverse(term)
                self._inv_version += 1
            delta = self._inv_delta(probe, term)
            for d in domains_for(term.topology_key):
                delta[d] = delta.get(d, 0) + sign

    @staticmethod
    def _node_domains(node: PreparedNode) -> Callable[[str], frozenset[str]]:
        return lambda key: frozenset((node.labels[key],)) if key in node.labels else frozenset()

    @staticmethod
    def _node_filter(node: PreparedNode) -> Callable[[TopologyGroup], bool]:
        return lambda g: (
            not g.filter_terms
            or EMPTY_REQS in g.filter_terms
            or any(labels_match(t, node.labels) for t in g.filter_terms)
        )
