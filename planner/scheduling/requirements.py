"""Node-selector requirements as value sets, for the scheduling simulation.

One `Req` is what a label key may be: a finite set (`In`), everything but a set (`NotIn`, `Exists`),
integer bounds (`Gt`/`Lt`, and Karpenter's inclusive `Gte`/`Lte` of v1.9, held as the exclusive
bound one step further out), and whether the label may be absent altogether. The same object answers
two questions:

- does an existing node's label satisfy it (Kubernetes matching: `NotIn` and `DoesNotExist` accept
  a missing label, the others do not); and
- do two requirements overlap, the way Karpenter narrows a new NodeClaim's requirements pod by pod
  (an empty overlap is only acceptable when both sides accept the label being absent).

Requirement sets (`Reqs`, a key → Req mapping frozen into a tuple) are hashable so the simulation
can memoise intersections and instance-type compatibility by value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
GTE, LTE = "Gte", "Lte"  # Karpenter v1.9 (NodePool/NodeClaim requirements only; not in Kubernetes)
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT, GTE, LTE)


def _as_int(value: str) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Req:
    """The allowed values of one label key (immutable, hashable)."""

    __slots__ = ("_hash", "allow_absent", "complement", "gt", "key", "lt", "min_values", "values")

    def __init__(
        self,
        key: str,
        values: frozenset[str],
        *,
        complement: bool,
        allow_absent: bool,
        gt: int | None = None,
        lt: int | None = None,
        min_values: int | None = None,
    ) -> None:
        self.key = key
        self.complement = complement
        self.allow_absent = allow_absent
        self.gt = gt
        self.lt = lt
        self.min_values = min_values
        if not complement and (gt is not None or lt is not None):
            # A finite set under bounds is just the members inside the bounds.
            values = frozenset(v for v in values if self._within(v))
            self.gt = self.lt = None
        self.values = values
        self._hash = hash((key, values, complement, allow_absent, self.gt, self.lt, min_values))

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def of(cls, key: str, operator: str, values: Iterable[str] = (), min_values: int | None = None) -> Req:
        vals = frozenset(str(v) for v in values)
        if operator == IN:
            return cls(key, vals, complement=False, allow_absent=False, min_values=min_values)
        if operator == NOT_IN:
            return cls(key, vals, complement=True, allow_absent=True, min_values=min_values)
        if operator == EXISTS:
            return cls(key, frozenset(), complement=True, allow_absent=False, min_values=min_values)
        if operator == DOES_NOT_EXIST:
            return cls(key, frozenset(), complement=False, allow_absent=True)
        if operator in (GT, LT, GTE, LTE):
            if len(vals) != 1 or _as_int(next(iter(vals))) is None:
                raise ValueError(f"requirement {key}: operator {operator} needs exactly one integer value")
            bound = int(next(iter(vals)))
            # On integers `Gte N` is `Gt N-1` and `Lte N` is `Lt N+1` (Karpenter canonicalises the
            # other way round, pkg/scheduling/requirement.go; the sets are the same).
            lower = bound if operator == GT else bound - 1 if operator == GTE else None
            upper = bound if operator == LT else bound + 1 if operator == LTE else None
            return cls(
                key,
                frozenset(),
                complement=True,
                allow_absent=False,
                gt=lower,
                lt=upper,
                min_values=min_values,
            )
        raise ValueError(f"requirement {key}: unknown operator {operator!r} (expected one of {OPERATORS})")

    @classmethod
    def equals(cls, key: str, value: str) -> Req:
        return cls(key, frozenset((value,)), complement=False, allow_absent=False)

    # -- queries -----------------------------------------------------------------------------
    def _within(self, value: str) -> bool:
        if self.gt is None and self.lt is None:
            return True
        number = _as_int(value)
        if number is None:
            return False
        return (self.gt is None or number > self.gt) and (self.lt is None or number < self.lt)

    def has(self, value: str) -> bool:
        """Whether a node whose label is `value` satisfies the requirement."""
        if self.complement:
            return value not in self.values and self._within(value)
        return value in self.values

    def matches(self, value: str | None) -> bool:
        """Kubernetes label matching: `value` None means the node lacks the label."""
        return self.allow_absent if value is None else self.has(value)

    def any_value(self) -> bool:
        """Whether some concrete label value satisfies it (bounds permitting)."""
        if not self.complement:
            return bool(self.values)
        if self.gt is not None and self.lt is not None:
            return self.lt - self.gt > 1
        return True

    def intersect(self, other: Req) -> Req:
        gt = max((b for b in (self.gt, other.gt) if b is not None), default=None)
        lt = min((b for b in (self.lt, other.lt) if b is not None), default=None)
        allow_absent = self.allow_absent and other.allow_absent
        min_values = max((m for m in (self.min_values, other.min_values) if m is not None), default=None)
        if self.complement and other.complement:
            return Req(
                self.key,
                self.values | other.values,
                complement=True,
                allow_absent=allow_absent,
                gt=gt,
                lt=lt,
                min_values=min_values,
            )
        if self.complement:
            values = frozenset(v for v in other.values if self.has(v))
        elif other.complement:
            values = frozenset(v for v in self.values if other.has(v))
        else:
            values = self.values & other.values
        return Req(
            self.key, values, complement=False, allow_absent=allow_absent, gt=gt, lt=lt, min_values=min_values
        )

    def overlaps(self, other: Req) -> bool:
        """Karpenter's Intersects for one key: some value in common, or both accept absence."""
        merged = self.intersect(other)
        return merged.any_value() or merged.allow_absent

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Req)
            and self._hash == other._hash
            and self.key == other.key
            and self.values == other.values
            and self.complement == other.complement
            and self.allow_absent == other.allow_absent
            and self.gt == other.gt
            and self.lt == other.lt
            and self.min_values == other.min_values
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"{self.key} {self.describe()}"

    def describe(self) -> str:
        parts = []
        if self.complement:
            if self.values:
                parts.append(f"NotIn {sorted(self.values)}")
            elif self.gt is None and self.lt is None:
                parts.append("Exists" if not self.allow_absent else "(any)")
            if self.gt is not None:
                parts.append(f"Gt {self.gt}")
            if self.lt is not None:
                parts.append(f"Lt {self.lt}")
        elif self.values:
            parts.append(f"In {sorted(self.values)}")
        else:
            parts.append("DoesNotExist")
        return " ".join(parts)


# A requirement set frozen for hashing: a tuple of Req sorted by key (one Req per key).
Reqs = tuple[Req, ...]
EMPTY_REQS: Reqs = ()


def freeze(reqs: Iterable[Req]) -> Reqs:
    """Merge requirements on the same key (intersection) and sort them by key."""
    by_key: dict[str, Req] = {}
    for req in reqs:
        existing = by_key.get(req.key)
        by_key[req.key] = req if existing is None else existing.intersect(req)
    return tuple(by_key[k] for k in sorted(by_key))


def labels_match(reqs: Reqs, labels: Mapping[str, str]) -> bool:
    """Every requirement holds for a node with these labels (Kubernetes semantics)."""
    get = labels.get
    return all(r.matches(get(r.key)) for r in reqs)
