"""Label and field selectors, parsed and matched the way kube-apiserver does.

Label selector strings support every operator: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
`k notin (a,b)`, `k` (exists), `!k` (does not exist), and the numeric `k>n` / `k<n`. `!=` and
`notin` also match objects without the key, as in Kubernetes. `LabelSelector` objects
(matchLabels / matchExpressions, as in a PDB or a Deployment) become the same `Selector`.

Field selectors are `field=value`, `field==value`, `field!=value` terms joined by commas, with
`\\,` `\\=` `\\\\` escapes. Which fields a resource supports is in `resources.py`; an unsupported field
is a 400, as on a real cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.apiserver.errors import BadRequest

# --- labels ------------------------------------------------------------------------------------------

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
_KEY_RE = re.compile(rf"^({_PREFIX}/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^({_NAME})?$")


def label_key_error(key: str) -> str | None:
    """Why `key` is not a valid label key (qualified name), or None."""
    if "/" in key:
        prefix = key.split("/", 1)[0]
        if len(prefix) > 253:
            return f"prefix part of {key!r} must be no more than 253 characters"
    if not _KEY_RE.match(key):
        return (
            f"name part of {key!r} must consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character (at most 63 characters), with an optional "
            "DNS subdomain prefix and '/'"
        )
    return None


def label_value_error(value: str) -> str | None:
    if not isinstance(value, str) or not _VALUE_RE.match(value):
        return (
            f"a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            f"and must start and end with an alphanumeric character (at most 63), got {value!r}"
        )
    return None


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.op
        if op == "exists":
            return self.key in labels
        if op == "!":
            return self.key not in labels
        if op in ("=", "in"):
            return self.key in labels and labels[self.key] in self.values
        if op in ("!=", "notin"):
            return self.key not in labels or labels[self.key] not in self.values
        # gt / lt: the label must exist and parse as an integer.
        if self.key not in labels:
            return False
        try:
            have = int(labels[self.key])
        except ValueError:
            return False
        want = int(self.values[0])
        return have > want if op == "gt" else have < want


@dataclass(frozen=True)
class Selector:
    """A conjunction of requirements. `Selector(())` matches everything; `NOTHING` nothing."""

    requirements: tuple[Requirement, ...] = ()
    matches_nothing: bool = False

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.matches_nothing:
            return False
        labels = labels or {}
        # A loop, not all(generator): this is the simulated scheduler's hot path.
        for requirement in self.requirements:  # noqa: SIM110
            if not requirement.matches(labels):
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.requirements and not self.matches_nothing

    def __str__(self) -> str:
        parts = []
        for r in self.requirements:
            if r.op == "exists":
                parts.append(r.key)
            elif r.op == "!":
                parts.append(f"!{r.key}")
            elif r.op in ("=", "!="):
                parts.append(f"{r.key}{r.op}{r.values[0]}")
            elif r.op in ("in", "notin"):
                parts.append(f"{r.key} {r.op} ({','.join(r.values)})")
            else:
                parts.append(f"{r.key}{'>' if r.op == 'gt' else '<'}{r.values[0]}")
        return ",".join(parts)


EVERYTHING = Selector()
NOTHING = Selector(matches_nothing=True)

_TOKEN_RE = re.compile(r"\s*(==|!=|=|!|\(|\)|,|>|<|[^\s,()=!<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise BadRequest(f"unable to parse requirement: unexpected character in {text!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


def parse_label_selector(text: str | None) -> Selector:
    """Parse `?labelSelector=` syntax. Raises BadRequest (400) on bad syntax, as kube-apiserver."""
    if text is None or not text.strip():
        return EVERYTHING
    toks = _tokens(text)
    reqs: list[Requirement] = []
    i = 0

    def fail(why: str) -> BadRequest:
        return BadRequest(f"unable to parse requirement: {why} (in label selector {text!r})")

    def word(at: int) -> str:
        if at >= len(toks) or toks[at] in ("==", "!=", "=", "!", "(", ")", ",", ">", "<"):
            raise fail("expected a key or value")
        return toks[at]

    while i < len(toks):
        if toks[i] == "!":
            key = word(i + 1)
            reqs.append(Requirement(key, "!"))
            i += 2
        else:
            key = word(i)
            i += 1
            nxt = toks[i] if i < len(toks) else ","
            if nxt == ",":
                reqs.append(Requirement(key, "exists"))
            elif nxt in ("=", "==", "!="):
                value = ""
                if i + 1 < len(toks) and toks[i + 1] not in (",",):
                    value = word(i + 1)
                    i += 1
                if err := label_value_error(value):
                    raise fail(err)
                reqs.append(Requirement(key, "!=" if nxt == "!=" else "=", (value,)))
                i += 1
            elif nxt in (">", "<"):
                value = word(i + 1)
                try:
                    int(value)
                except ValueError:
                    raise fail(f"for '{nxt}' operator the value must be an integer, got {value!r}") from None
                reqs.append(Requirement(key, "gt" if nxt == ">" else "lt", (value,)))
                i += 2
            elif nxt in ("in", "notin"):
                if i + 1 >= len(toks) or toks[i + 1] != "(":
                    raise fail(f"expected '(' after '{nxt}'")
                i += 2
                values: list[str] = []
                while True:
                    if i >= len(toks):
                        raise fail("expected ')'")
                    if toks[i] == ")":
                        i += 1
                        break
                    if toks[i] == ",":
                        i += 1
                        continue
                    values.append(word(i))
                    i += 1
                if not values and nxt == "in":
                    raise fail("for 'in' operator, at least one value is required")
                reqs.append(Requirement(key, nxt, tuple(values)))
            else:
                raise fail(f"found {nxt!r}, expected one of =, ==, !=, in, notin, >, < or ','")
        if err := label_key_error(reqs[-1].key):
            raise fail(err)
        if i < len(toks):
            if toks[i] != ",":
                raise fail(f"found {toks[i]!r}, expected ','")
            i += 1
    return Selector(tuple(reqs))


_EXPRESSION_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


def selector_from_label_selector(
    obj: Mapping[str, Any] | None, *, none_matches_all: bool = False
) -> Selector:
    """A metav1.LabelSelector (`{matchLabels, matchExpressions}`) as a Selector.

    A null selector matches nothing (policy/v1 PDB, Deployment validation) unless
    `none_matches_all`; an empty one `{}` matches everything. Raises ValueError on a bad operator.
    """
    if obj is None:
        return EVERYTHING if none_matches_all else NOTHING
    reqs = [Requirement(k, "=", (str(v),)) for k, v in sorted((obj.get("matchLabels") or {}).items())]
    for expr in obj.get("matchExpressions") or []:
        op = _EXPRESSION_OPS.get(expr.get("operator", ""))
        if op is None:
            raise ValueError(f"{expr.get('operator')!r} is not a valid label selector operator")
        values = tuple(str(v) for v in expr.get("values") or ())
        if op in ("in", "notin") and not values:
            raise ValueError(f"values: must be specified when operator is {expr.get('operator')}")
        if op in ("exists", "!") and values:
            raise ValueError(f"values: may not be specified when operator is {expr.get('operator')}")
        reqs.append(Requirement(str(expr.get("key", "")), op, values))
    return Selector(tuple(reqs))


# --- fields -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    negate: bool = False

    def matches(self, fields: Mapping[str, str]) -> bool:
        return (fields.get(self.field, "") == self.value) != self.negate


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, fields: Mapping[str, str]) -> bool:
        return all(t.matches(fields) for t in self.terms)

    def equals(self, field: str) -> str | None:
        """The value `field` must equal, if a positive term pins it (lets the store use an index)."""
        for t in self.terms:
            if t.field == field and not t.negate:
                return t.value
        return None

    @property
    def fields(self) -> set[str]:
        return {t.field for t in self.terms}


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i : i + 2])
            i += 2
            continue
        if ch == sep:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def parse_field_selector(text: str | None) -> FieldSelector:
    if text is None or not text.strip():
        return FieldSelector()
    terms = []
    for part in _split_unescaped(text, ","):
        if not part.strip():
            continue
        m = re.match(r"^(.*?)(==|!=|=)(.*)$", _mask_escapes(part))
        if not m:
            raise BadRequest(f"invalid selector: {text!r}; can't understand {part!r}")
        field_len, op_len = len(m.group(1)), len(m.group(2))
        field, value = part[:field_len], part[field_len + op_len :]
        terms.append(FieldTerm(field.strip(), _unescape(value), negate=m.group(2) == "!="))
    return FieldSelector(tuple(terms))


def _mask_escapes(text: str) -> str:
    # Keep positions but hide escaped characters from the operator search.
    return re.sub(r"\\.", "__", text)
