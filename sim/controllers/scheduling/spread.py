"""PodTopologySpread for one pod group, kept current bind by bind (kubernetes/kubernetes v1.33-v1.35,
pkg/scheduler/framework/plugins/podtopologyspread/).

Filter (filtering.go, the pod's DoNotSchedule constraints): the matching pods are counted per domain
over the nodes that carry every constraint's key and pass the constraint's inclusion policies
(nodeAffinityPolicy Honor: the pod's nodeSelector and required node affinity; nodeTaintsPolicy
Honor: no untolerated NoSchedule / NoExecute taint), in the pod's namespace, terminating pods left
out (common.go `countPodsMatchSelector`). A node passes when it has every key and, per constraint,
`count(its domain) + (1 if the pod matches its own selector) - min` is at most maxSkew, where `min`
is the smallest count over the domains, or 0 while there are fewer domains than minDomains.
Reasons: "node(s) didn't match pod topology spread constraints" and "... (missing required label)".

Score (scoring.go, ScheduleAnyway constraints; when the pod has no constraints at all, the system
defaults with `DefaultSelector`, and then a node missing a key is not ignored): per constraint, the
count of the node's domain (pods on the node itself for the hostname key; over all nodes passing the
inclusion policies otherwise) times `log(number of domains among the candidate nodes + 2)`, plus
`maxSkew - 1`; summed, rounded, then normalized so that the least crowded node scores 100.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from api.constants import HOSTNAME_LABEL
from sim.controllers.predicates import SCHEDULING_EFFECTS, node_taints_for_scheduling, untolerated_taints
from sim.controllers.scheduling.cache import Change
from sim.controllers.scheduling.context import PassContext
from sim.controllers.scheduling.scores import Ints, go_round, spread_normalized
from sim.controllers.scheduling.snapshot import PassNodes
from sim.controllers.scheduling.terms import SpreadConstraint

Bools = npt.NDArray[np.bool_]
REASON_SKEW = "node(s) didn't match pod topology spread constraints"
REASON_MISSING_LABEL = REASON_SKEW + " (missing required label)"


def _inclusion(ctx: PassContext, spec: Mapping[str, Any], constraint: SpreadConstraint) -> Bools:
    """matchNodeInclusionPolicies for every node."""
    nodes = ctx.nodes
    included = np.ones(len(nodes), dtype=np.bool_)
    if constraint.honor_node_affinity:
        included &= ctx.node_selection(spec)
    if constraint.honor_taints:
        tolerations = spec.get("tolerations") or ()
        included &= np.array(
            [
                not untolerated_taints(tolerations, node_taints_for_scheduling(obj), SCHEDULING_EFFECTS)
                for obj in nodes.objects
            ],
            dtype=np.bool_,
        )
    return included


class _Counts:
    """One constraint's matching pods, per domain (value id) and, for scoring, per node."""

    def __init__(
        self, nodes: PassNodes, constraint: SpreadConstraint, included: Bools, missing_as_empty: bool
    ) -> None:
        self.constraint = constraint
        self.ids, self.values = nodes.value_ids(constraint.topology_key, missing_as_empty)
        self.has = nodes.has_label(constraint.topology_key)
        self.everywhere = bool(self.has.all())
        self.included = included
        self.per_domain = np.zeros(max(1, len(self.values)), dtype=np.int64)
        self.per_node = np.zeros(len(nodes), dtype=np.int64)

    def add(self, node: int, delta: int) -> None:
        self.per_node[node] += delta
        if self.included[node] and self.ids[node] >= 0:
            self.per_domain[self.ids[node]] += delta


class _Constraints:
    """What the filter and the score share: the constraints' counts, kept from the pass's changes."""

    def __init__(
        self,
        ctx: PassContext,
        namespace: str,
        spec: Mapping[str, Any],
        constraints: tuple[SpreadConstraint, ...],
        require_all_keys: bool,
    ) -> None:
        nodes = self.nodes = ctx.nodes
        self.namespace = namespace
        self.constraints = constraints
        has_all = np.ones(len(nodes), dtype=np.bool_)
        if require_all_keys:
            for c in constraints:
                has_all &= nodes.has_label(c.topology_key)
        self.has_all = has_all
        self.keys_everywhere = bool(has_all.all())
        self.counts = [
            _Counts(nodes, c, has_all & _inclusion(ctx, spec, c), not require_all_keys) for c in constraints
        ]
        for counts in self.counts:
            for pod in ctx.cache.matching((namespace,), counts.constraint.selector):
                node = nodes.index.get(pod.node)
                if node is not None and not pod.terminating:
                    counts.add(node, 1)

    def apply(self, change: Change, node: int) -> None:
        pod = change.pod
        if pod.terminating or pod.namespace != self.namespace:
            return
        for counts in self.counts:
            if counts.constraint.selector.matches(pod.labels):
                counts.add(node, change.delta)


class SpreadFilter(_Constraints):
    def __init__(
        self,
        ctx: PassContext,
        namespace: str,
        labels: Mapping[str, str],
        spec: Mapping[str, Any],
        constraints: tuple[SpreadConstraint, ...],
    ) -> None:
        super().__init__(ctx, namespace, spec, constraints, require_all_keys=True)
        self.self_match = [int(c.selector.matches(labels)) for c in constraints]
        # The domains: every value of a node counted (even with no matching pod).
        self.domains = []
        for counts in self.counts:
            present = np.zeros(counts.per_domain.shape, dtype=np.bool_)
            present[counts.ids[counts.included & (counts.ids >= 0)]] = True
            self.domains.append(present)

    def _skews(self, i: int) -> Ints:
        counts, present = self.counts[i], self.domains[i]
        domains = int(present.sum())
        low = 0 if domains < counts.constraint.min_domains else int(counts.per_domain[present].min())
        matched = np.where(counts.ids >= 0, counts.per_domain[np.maximum(counts.ids, 0)], 0)
        out: Ints = matched + self.self_match[i] - low
        return out

    def mask(self) -> Bools:
        ok = np.ones(len(self.nodes), dtype=np.bool_)
        for i, counts in enumerate(self.counts):
            ok &= counts.has & (self._skews(i) <= counts.constraint.max_skew)
        return ok

    def reasons(self) -> list[str | None]:
        """Per node, why the filter refuses it (None: it passes)."""
        out: list[str | None] = [None] * len(self.nodes)
        for i, counts in enumerate(self.counts):
            over = self._skews(i) > counts.constraint.max_skew
            for node in range(len(self.nodes)):
                if out[node] is None:
                    if not counts.has[node]:
                        out[node] = REASON_MISSING_LABEL
                    elif over[node]:
                        out[node] = REASON_SKEW
        return out


class SpreadScore(_Constraints):
    def __init__(
        self,
        ctx: PassContext,
        namespace: str,
        spec: Mapping[str, Any],
        constraints: tuple[SpreadConstraint, ...],
        require_all_keys: bool,
    ) -> None:
        super().__init__(ctx, namespace, spec, constraints, require_all_keys)
        self.require_all_keys = require_all_keys

    def scores(self, candidates: npt.NDArray[np.intp]) -> Ints:
        """The normalized scores of the candidate nodes (those that passed every filter)."""
        ignored: Bools | None = None
        counted = candidates
        if self.require_all_keys and not self.keys_everywhere:
            ignored = ~self.has_all[candidates]
            counted = candidates[~ignored]
        total = np.zeros(len(candidates), dtype=np.float64)
        for counts in self.counts:
            c = counts.constraint
            if c.topology_key == HOSTNAME_LABEL:
                size = len(counted)
                found = counts.per_node[candidates]
            else:
                size = int(np.count_nonzero(np.bincount(counts.ids[counted], minlength=1)))
                found = counts.per_domain[np.maximum(counts.ids[candidates], 0)]
            weight = math.log(size + 2)
            added = found * weight + float(c.max_skew - 1)
            total = total + (added if counts.everywhere else np.where(counts.has[candidates], added, 0.0))
        raw = go_round(total)
        if ignored is None:
            return spread_normalized(raw, None)
        return spread_normalized(np.where(ignored, 0, raw), ignored)
