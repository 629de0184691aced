"""Kubernetes matching rules as small immutable values: label selectors, node selector requirements,
taints and tolerations, pod (anti-)affinity terms and topology spread constraints.

Parsed once from the raw dicts at load time; every `from_dict` raises ValueError with the field name
on malformed input so the loader can report the object and skip it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

_EMPTY_DICT: dict[str, str] = {}


# --- Label selectors (metav1.LabelSelector) ---------------------------------------------------------


class LabelSelector:
    """matchLabels AND matchExpressions. An empty selector matches everything."""

    __slots__ = ("match_expressions", "match_labels")

    def __init__(
        self,
        match_labels: Mapping[str, str] | None = None,
        match_expressions: tuple[tuple[str, str, frozenset[str]], ...] = (),
    ) -> None:
        self.match_labels = dict(match_labels) if match_labels else _EMPTY_DICT
        self.match_expressions = match_expressions

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None, field: str = "selector") -> LabelSelector:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError(f"{field}: expected a label selector object")
        labels = raw.get("matchLabels") or {}
        if not isinstance(labels, Mapping):
            raise ValueError(f"{field}.matchLabels: expected a map")
        expressions = []
        for index, expr in enumerate(raw.get("matchExpressions") or ()):
            try:
                key, operator = expr["key"], expr["operator"]
            except (KeyError, TypeError):
                raise ValueError(f"{field}.matchExpressions[{index}]: needs key and operator") from None
            if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
                raise ValueError(f"{field}.matchExpressions[{index}]: unknown operator {operator!r}")
            expressions.append((key, operator, frozenset(str(v) for v in expr.get("values") or ())))
        return cls({str(k): str(v) for k, v in labels.items()}, tuple(expressions))

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return selector_matches(self.match_labels.items(), self.match_expressions, labels)

    def __repr__(self) -> str:
        return f"LabelSelector({self.match_labels!r}, {self.match_expressions!r})"


def selector_matches(
    match_labels: Iterable[tuple[str, str]],
    match_expressions: Iterable[tuple[str, str, frozenset[str]]],
    labels: Mapping[str, str],
) -> bool:
    """metav1.LabelSelector semantics over its parts (the scheduling simulation keeps its own hashable
    form of a selector and matches with this too)."""
    for key, value in match_labels:
        if labels.get(key) != value:
            return False
    for key, operator, values in match_expressions:
        present = key in labels
        if operator == "In":
            if not present or labels[key] not in values:
                return False
        elif operator == "NotIn":
            if present and labels[key] in values:
                return False
        elif operator == "Exists":
            if not present:
                return False
        elif present:  # DoesNotExist
            return False
    return True


# --- Node selector requirements (NodePool requirements, node affinity) ------------------------------

NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# Karpenter's NodePool/NodeClaim requirements also take the inclusive Gte and Lte (v1.9); Kubernetes
# node affinity does not, so only `Requirement(..., karpenter=True)` accepts them.
KARPENTER_OPERATORS = (*NODE_OPERATORS, "Gte", "Lte")
_BOUNDS = ("Gt", "Lt", "Gte", "Lte")


class Requirement:
    """One node selector requirement: `key operator values`."""

    __slots__ = ("key", "operator", "values")

    def __init__(
        self, key: str, operator: str, values: frozenset[str] = frozenset(), *, karpenter: bool = False
    ) -> None:
        if operator not in (KARPENTER_OPERATORS if karpenter else NODE_OPERATORS):
            raise ValueError(f"requirement {key}: unknown operator {operator!r}")
        if operator in _BOUNDS:
            if len(values) != 1:
                raise ValueError(f"requirement {key}: {operator} needs exactly one integer value")
            try:
                int(next(iter(values)))
            except ValueError:
                raise ValueError(f"requirement {key}: {operator} needs an integer value") from None
        self.key = key
        self.operator = operator
        self.values = values

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], field: str = "requirement") -> Requirement:
        try:
            return cls(
                str(raw["key"]), str(raw["operator"]), frozenset(str(v) for v in raw.get("values") or ())
            )
        except (KeyError, TypeError):
            raise ValueError(f"{field}: needs key and operator") from None
        except ValueError as err:
            raise ValueError(f"{field}: {err}") from None

    def matches_value(self, value: str | None) -> bool:
        """Whether a node whose label is `value` (None: label absent) satisfies the requirement."""
        op = self.operator
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None:
            return False
        try:
            number = int(value)
        except ValueError:
            return False
        bound = int(next(iter(self.values)))
        if op == "Gt":
            return number > bound
        if op == "Lt":
            return number < bound
        return number >= bound if op == "Gte" else number <= bound

    def matches(self, labels: Mapping[str, str]) -> bool:
        return self.matches_value(labels.get(self.key))

    def __repr__(self) -> str:
        return f"{self.key} {self.operator} {sorted(self.values)}"


def parse_node_selector_terms(raw: Any, field: str) -> tuple[tuple[Requirement, ...], ...]:
    """nodeSelectorTerms: a list (OR) of terms, each a list (AND) of requirements.

    matchFields (only `metadata.name` exists) is kept as a requirement on the pseudo-label
    `metadata.name`; `node_labels_for_matching` adds that key.
    """
    if not isinstance(raw, list):
        raise ValueError(f"{field}: expected a list of node selector terms")
    terms = []
    for index, term in enumerate(raw):
        if not isinstance(term, Mapping):
            raise ValueError(f"{field}[{index}]: expected an object")
        reqs = [
            Requirement.from_dict(r, f"{field}[{index}].matchExpressions[{j}]")
            for j, r in enumerate(term.get("matchExpressions") or ())
        ]
        reqs += [
            Requirement.from_dict(r, f"{field}[{index}].matchFields[{j}]")
            for j, r in enumerate(term.get("matchFields") or ())
        ]
        terms.append(tuple(reqs))
    return tuple(terms)


def terms_match(terms: tuple[tuple[Requirement, ...], ...], labels: Mapping[str, str]) -> bool:
    """Required node affinity: some term (OR) has all its requirements (AND) satisfied.

    An empty term matches nothing (Kubernetes semantics); no terms at all is "no constraint".
    """
    if not terms:
        return True
    return any(term and all(r.matches(labels) for r in term) for term in terms)


# --- Taints and tolerations -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Taint:
    """Values, hashable: the scheduling simulation keys pod signatures and node classes on them."""

    key: str
    value: str | None
    effect: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", self.value or None)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], field: str = "taint") -> Taint:
        try:
            return cls(str(raw["key"]), raw.get("value"), str(raw["effect"]))
        except (KeyError, TypeError):
            raise ValueError(f"{field}: needs key and effect") from None

    def blocks(self) -> bool:
        """PreferNoSchedule is a preference: it never stops a pod from landing."""
        return self.effect != "PreferNoSchedule"

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str | None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None
    toleration_seconds: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", self.key or None)
        object.__setattr__(self, "operator", self.operator or "Equal")
        object.__setattr__(self, "value", self.value or None)
        object.__setattr__(self, "effect", self.effect or None)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], field: str = "toleration") -> Toleration:
        if not isinstance(raw, Mapping):
            raise ValueError(f"{field}: expected an object")
        operator = raw.get("operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            raise ValueError(f"{field}: unknown operator {operator!r}")
        return cls(
            raw.get("key"), operator, raw.get("value"), raw.get("effect"), raw.get("tolerationSeconds")
        )

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' ToleratesTaint: empty effect matches all effects, empty key with Exists all keys."""
        if self.effect is not None and self.effect != taint.effect:
            return False
        if self.key is not None and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


def first_untolerated(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> Taint | None:
    """The first NoSchedule/NoExecute taint that no toleration covers, or None."""
    tols = tuple(tolerations)
    for taint in taints:
        if taint.blocks() and not any(t.tolerates(taint) for t in tols):
            return taint
    return None


def tolerates_all(tolerations: Iterable[Toleration], taints: Iterable[Taint]) -> bool:
    """Whether every NoSchedule/NoExecute taint is tolerated (PreferNoSchedule never blocks)."""
    return first_untolerated(tolerations, taints) is None


# --- Pod affinity and topology spread ---------------------------------------------------------------


class PodAffinityTerm:
    """A (preferred or required) pod affinity / anti-affinity term. `weight` is 0 for required terms."""

    __slots__ = (
        "label_selector",
        "match_label_keys",
        "namespace_selector",
        "namespaces",
        "topology_key",
        "weight",
    )

    def __init__(
        self,
        label_selector: LabelSelector | None,
        topology_key: str,
        namespaces: tuple[str, ...] = (),
        namespace_selector: LabelSelector | None = None,
        weight: int = 0,
        match_label_keys: tuple[str, ...] = (),
    ) -> None:
        self.label_selector = label_selector
        self.topology_key = topology_key
        self.namespaces = namespaces
        self.namespace_selector = namespace_selector
        self.weight = weight
        self.match_label_keys = match_label_keys

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], field: str, weight: int = 0) -> PodAffinityTerm:
        if not isinstance(raw, Mapping) or not raw.get("topologyKey"):
            raise ValueError(f"{field}: needs a topologyKey")
        selector = raw.get("labelSelector")
        ns_selector = raw.get("namespaceSelector")
        return cls(
            # A null labelSelector matches no pods (unlike an empty one).
            LabelSelector.from_dict(selector, f"{field}.labelSelector") if selector is not None else None,
            str(raw["topologyKey"]),
            tuple(raw.get("namespaces") or ()),
            LabelSelector.from_dict(ns_selector, f"{field}.namespaceSelector")
            if ns_selector is not None
            else None,
            weight,
            tuple(raw.get("matchLabelKeys") or ()),
        )

    def selects(self, owner_namespace: str, pod_namespace: str, pod_labels: Mapping[str, str]) -> bool:
        """Whether a pod (namespace, labels) is selected by this term of a pod in `owner_namespace`.

        namespaceSelector needs namespace labels, which a snapshot does not carry: a non-empty
        namespaceSelector is treated as "any namespace" (conservative for anti-affinity).
        """
        if self.label_selector is None:
            return False
        if self.namespaces or self.namespace_selector is not None:
            in_scope = pod_namespace in self.namespaces or self.namespace_selector is not None
        else:
            in_scope = pod_namespace == owner_namespace
        return in_scope and self.label_selector.matches(pod_labels)


class TopologySpreadConstraint:
    __slots__ = (
        "label_selector",
        "match_label_keys",
        "max_skew",
        "min_domains",
        "node_affinity_policy",
        "node_taints_policy",
        "topology_key",
        "when_unsatisfiable",
    )

    def __init__(
        self,
        max_skew: int,
        topology_key: str,
        when_unsatisfiable: str,
        label_selector: LabelSelector | None,
        min_domains: int | None = None,
        node_affinity_policy: str = "Honor",
        node_taints_policy: str = "Ignore",
        match_label_keys: tuple[str, ...] = (),
    ) -> None:
        self.max_skew = max_skew
        self.topology_key = topology_key
        self.when_unsatisfiable = when_unsatisfiable
        self.label_selector = label_selector
        self.min_domains = min_domains
        self.node_affinity_policy = node_affinity_policy
        self.node_taints_policy = node_taints_policy
        self.match_label_keys = match_label_keys

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], field: str) -> TopologySpreadConstraint:
        try:
            max_skew = int(raw["maxSkew"])
            key = str(raw["topologyKey"])
            when = str(raw.get("whenUnsatisfiable") or "DoNotSchedule")
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{field}: needs maxSkew and topologyKey") from None
        if when not in ("DoNotSchedule", "ScheduleAnyway"):
            raise ValueError(f"{field}: whenUnsatisfiable {when!r} is not DoNotSchedule or ScheduleAnyway")
        selector = raw.get("labelSelector")
        return cls(
            max_skew,
            key,
            when,
            LabelSelector.from_dict(selector, f"{field}.labelSelector") if selector is not None else None,
            raw.get("minDomains"),
            raw.get("nodeAffinityPolicy") or "Honor",
            raw.get("nodeTaintsPolicy") or "Ignore",
            tuple(raw.get("matchLabelKeys") or ()),
        )

    @property
    def required(self) -> bool:
        return self.when_unsatisfiable == "DoNotSchedule"
