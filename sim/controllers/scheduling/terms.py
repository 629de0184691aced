"""Pod (anti-)affinity terms, topology spread constraints and the default spread selector, parsed
as kube-scheduler parses them (kubernetes/kubernetes v1.33-v1.35):

- `AffinityTerm` is framework.AffinityTerm (pkg/scheduler/framework/types.go `newAffinityTerm`,
  `getNamespacesFromPodAffinityTerm`): a term without namespaces and without namespaceSelector is
  the pod's own namespace; a null namespaceSelector selects no namespace, an empty one every
  namespace. For the incoming pod the selector is unrolled into namespace names once
  (interpodaffinity/plugin.go `mergeAffinityTermNamespacesIfNotEmpty`), so its terms match an
  existing pod by name alone; an existing pod's terms match the incoming pod with the incoming pod's
  namespace labels (`GetNamespaceLabelsSnapshot`). matchLabelKeys / mismatchLabelKeys add
  `key in (value)` / `key notin (value)` of the term owner's labels (what kube-apiserver merges into
  the selector since v1.31; merging twice changes nothing).
- `SpreadConstraint` is podtopologyspread/common.go `topologySpreadConstraint`: minDomains 1,
  nodeAffinityPolicy Honor and nodeTaintsPolicy Ignore unless given; matchLabelKeys add the pod's
  own values. `system_default_constraints` are plugin.go `systemDefaultConstraints` (hostname
  maxSkew 3, zone maxSkew 5, ScheduleAnyway) and `default_selector` is
  plugins/helper/spread.go `DefaultSelector` (the Services selecting the pod, then its controlling
  ReplicationController, ReplicaSet or StatefulSet).

Selectors are the emulator's own (sim/apiserver/selectors.py), never karpflow's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from api.constants import HOSTNAME_LABEL, ZONE_LABEL
from sim.apiserver.selectors import (
    EVERYTHING,
    NOTHING,
    Requirement,
    Selector,
    selector_from_label_selector,
)

DO_NOT_SCHEDULE = "DoNotSchedule"
SCHEDULE_ANYWAY = "ScheduleAnyway"


class TermError(ValueError):
    """A selector in the pod's affinity or spread constraints that does not parse."""


def _selector(obj: Mapping[str, Any] | None) -> Selector:
    try:
        return selector_from_label_selector(obj)
    except ValueError as err:
        raise TermError(str(err)) from None


def _with(selector: Selector, extra: list[Requirement]) -> Selector:
    if not extra or selector.matches_nothing:
        return selector
    return Selector((*extra, *selector.requirements))


@dataclass(frozen=True, slots=True)
class AffinityTerm:
    namespaces: frozenset[str]
    selector: Selector
    topology_key: str
    namespace_selector: Selector = NOTHING

    def matches(self, namespace: str, labels: Mapping[str, str], namespace_labels: Mapping[str, str]) -> bool:
        """framework.AffinityTerm.Matches: the pod's namespace is named or selected, and its labels
        match."""
        if namespace in self.namespaces or self.namespace_selector.matches(namespace_labels):
            return self.selector.matches(labels)
        return False


@dataclass(frozen=True, slots=True)
class WeightedTerm:
    term: AffinityTerm
    weight: int


@dataclass(frozen=True, slots=True)
class PodTerms:
    required_affinity: tuple[AffinityTerm, ...] = ()
    required_anti: tuple[AffinityTerm, ...] = ()
    preferred_affinity: tuple[WeightedTerm, ...] = ()
    preferred_anti: tuple[WeightedTerm, ...] = ()

    @property
    def preferred(self) -> bool:
        return bool(self.preferred_affinity or self.preferred_anti)


def _term(namespace: str, labels: Mapping[str, str], raw: Mapping[str, Any]) -> AffinityTerm:
    selector = _selector(raw.get("labelSelector"))
    extra = [Requirement(k, "in", (labels[k],)) for k in raw.get("matchLabelKeys") or () if k in labels]
    extra += [
        Requirement(k, "notin", (labels[k],)) for k in raw.get("mismatchLabelKeys") or () if k in labels
    ]
    names = raw.get("namespaces") or ()
    ns_selector = raw.get("namespaceSelector")
    namespaces = frozenset(names) if names or ns_selector is not None else frozenset((namespace,))
    return AffinityTerm(
        namespaces=namespaces,
        selector=_with(selector, extra),
        topology_key=str(raw.get("topologyKey") or ""),
        namespace_selector=_selector(ns_selector) if ns_selector is not None else NOTHING,
    )


def pod_terms(namespace: str, labels: Mapping[str, str], spec: Mapping[str, Any]) -> PodTerms | None:
    """The pod's inter-pod (anti-)affinity, or None when it has neither (it is then not among the
    NodeInfo's PodsWithAffinity). Raises TermError on a selector that does not parse."""
    affinity = spec.get("affinity") or {}
    positive, negative = affinity.get("podAffinity"), affinity.get("podAntiAffinity")
    if positive is None and negative is None:
        return None
    positive, negative = positive or {}, negative or {}

    def required(block: Mapping[str, Any]) -> tuple[AffinityTerm, ...]:
        return tuple(
            _term(namespace, labels, t)
            for t in block.get("requiredDuringSchedulingIgnoredDuringExecution") or ()
        )

    def preferred(block: Mapping[str, Any]) -> tuple[WeightedTerm, ...]:
        return tuple(
            WeightedTerm(_term(namespace, labels, t.get("podAffinityTerm") or {}), int(t.get("weight") or 0))
            for t in block.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
        )

    return PodTerms(required(positive), required(negative), preferred(positive), preferred(negative))


def unroll_namespace_selectors(
    terms: PodTerms, namespace_labels: Callable[[], Iterable[tuple[str, Mapping[str, str]]]]
) -> PodTerms:
    """The incoming pod's terms with each non-empty namespaceSelector turned into the names of the
    namespaces it selects (an empty selector stays: it matches every namespace)."""

    def unroll(term: AffinityTerm) -> AffinityTerm:
        selector = term.namespace_selector
        if selector.empty:
            return term
        chosen = {name for name, ns_labels in namespace_labels() if selector.matches(ns_labels)}
        return AffinityTerm(term.namespaces | chosen, term.selector, term.topology_key, NOTHING)

    return PodTerms(
        tuple(unroll(t) for t in terms.required_affinity),
        tuple(unroll(t) for t in terms.required_anti),
        tuple(WeightedTerm(unroll(w.term), w.weight) for w in terms.preferred_affinity),
        tuple(WeightedTerm(unroll(w.term), w.weight) for w in terms.preferred_anti),
    )


# --- topology spread ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    max_skew: int
    topology_key: str
    selector: Selector
    min_domains: int = 1
    honor_node_affinity: bool = True
    honor_taints: bool = False


def spread_constraints(
    spec: Mapping[str, Any], labels: Mapping[str, str], when_unsatisfiable: str
) -> tuple[SpreadConstraint, ...]:
    """The pod's own constraints with that `whenUnsatisfiable` (filterTopologySpreadConstraints)."""
    found = []
    for raw in spec.get("topologySpreadConstraints") or ():
        if (raw.get("whenUnsatisfiable") or DO_NOT_SCHEDULE) != when_unsatisfiable:
            continue
        selector = _selector(raw.get("labelSelector"))
        extra = [Requirement(k, "=", (labels[k],)) for k in raw.get("matchLabelKeys") or () if k in labels]
        min_domains = raw.get("minDomains")
        found.append(
            SpreadConstraint(
                max_skew=int(raw.get("maxSkew") or 1),
                topology_key=str(raw.get("topologyKey") or ""),
                selector=_with(selector, extra),
                min_domains=int(min_domains) if min_domains is not None else 1,
                honor_node_affinity=(raw.get("nodeAffinityPolicy") or "Honor") == "Honor",
                honor_taints=(raw.get("nodeTaintsPolicy") or "Ignore") == "Honor",
            )
        )
    return tuple(found)


def system_default_constraints(selector: Selector) -> tuple[SpreadConstraint, ...]:
    return (
        SpreadConstraint(3, HOSTNAME_LABEL, selector),
        SpreadConstraint(5, ZONE_LABEL, selector),
    )


_CONTROLLERS = {("v1", "ReplicationController"), ("apps/v1", "ReplicaSet"), ("apps/v1", "StatefulSet")}


def default_selector(
    namespace: str,
    labels: Mapping[str, str],
    meta: Mapping[str, Any],
    services: Iterable[Mapping[str, Any]],
    controller: Callable[[str, str, str], Mapping[str, Any] | None],
) -> Selector | None:
    """DefaultSelector: the merged selectors of the pod's namespace's Services that select it, then
    its controller's selector; None when that is empty (no default constraints). `controller(kind,
    namespace, name)` finds the owner in the informer's cache."""
    merged: dict[str, str] = {}
    for service in services:
        if (service.get("metadata") or {}).get("namespace", "default") != namespace:
            continue
        chosen = (service.get("spec") or {}).get("selector")
        if chosen is None:
            continue  # a Service without a selector selects nothing, not everything
        if all(labels.get(k) == v for k, v in chosen.items()):
            merged.update({str(k): str(v) for k, v in chosen.items()})
    requirements = [Requirement(k, "=", (v,)) for k, v in sorted(merged.items())]
    owner = next((r for r in meta.get("ownerReferences") or () if r.get("controller")), None)
    if owner is not None and (owner.get("apiVersion"), owner.get("kind")) in _CONTROLLERS:
        found = controller(str(owner.get("kind")), namespace, str(owner.get("name")))
        if found is not None:
            chosen = (found.get("spec") or {}).get("selector")
            if owner.get("kind") == "ReplicationController":
                for k, v in sorted((chosen or {}).items()):
                    merged[str(k)] = str(v)
                requirements = [Requirement(k, "=", (v,)) for k, v in sorted(merged.items())]
            else:
                try:
                    parsed = selector_from_label_selector(chosen)
                except ValueError:
                    parsed = EVERYTHING
                if not parsed.matches_nothing:
                    requirements += list(parsed.requirements)
    if not requirements:
        return None
    return Selector(tuple(requirements))
