"""Kubernetes' JSONPath, as far as CRD printer columns use it (k8s.io/client-go/util/jsonpath:
parser.go and jsonpath.go), and its printing of a result.

    find({"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
         '.status.conditions[?(@.type=="Ready")].status')            -> ["True"]

Supported: `.field` (a `\\.` in a name is a literal dot: `.metadata.labels.karpenter\\.sh/nodepool`),
`['field']` and `['a','b']`, `[n]`, `[start:end:step]` (negative bounds count from the end),
`[*]` and `.*`, `..field` (recursive descent), filters `[?(@.path OP literal)]` with ==, !=, <, >,
<=, >= and `[?(@.path)]` (exists), literals quoted with ' or ", numbers, true/false. Missing keys
give no result (`AllowMissingKeys(true)`, what the table convertor sets); a malformed expression
raises ValueError (the API server refuses such a CRD column).

`text(value)` is `PrintResults` of one value: a string as is, maps and lists as compact JSON
(Go's encoding/json: sorted keys, `<`, `>`, `&` escaped), anything else as Go's fmt prints it
(`true`, `3`, `1e+06`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

Step = Callable[[list[Any]], list[Any]]
_MISSING = object()


@dataclass(frozen=True)
class _Comparison:
    path: list[Step]
    operator: str  # "exists" or a comparison
    literal: Any


def find(obj: Any, expression: str) -> list[Any]:
    """Every value `expression` (a CRD column's jsonPath, without the braces) selects in `obj`."""
    values = [obj]
    for step in parse(expression):
        values = step(values)
    return values


def parse(expression: str) -> list[Step]:
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    steps, rest = _steps(text)
    if rest:
        raise ValueError(f"unrecognized character in JSONPath {expression!r} at {rest!r}")
    return steps


def _steps(text: str) -> tuple[list[Step], str]:
    steps: list[Step] = []
    while text:
        if text.startswith(".."):
            name, text = _name(text[2:])
            steps.append(_recursive(name))
        elif text.startswith(".*"):
            steps.append(_wildcard)
            text = text[2:]
        elif text.startswith("."):
            name, text = _name(text[1:])
            if name:
                steps.append(_field(name))
        elif text.startswith("["):
            step, text = _bracket(text)
            steps.append(step)
        else:
            break
    return steps, text


def _name(text: str) -> tuple[str, str]:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            out.append(text[i + 1])
            i += 2
            continue
        if ch in ".[" or ch.isspace() or ch in "=!<>)":
            break
        out.append(ch)
        i += 1
    return "".join(out), text[i:]


def _closing(text: str, start: int) -> int:
    """Index of the `]` that closes the `[` at `start`, quotes and nested brackets respected."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unclosed array in JSONPath at {text!r}")


def _bracket(text: str) -> tuple[Step, str]:
    end = _closing(text, 0)
    inner, rest = text[1:end].strip(), text[end + 1 :]
    if inner.startswith("?"):
        if not (inner[1:].lstrip().startswith("(") and inner.endswith(")")):
            raise ValueError(f"malformed filter in JSONPath: {inner!r}")
        return _filter(_comparison(inner[1:].strip()[1:-1].strip())), rest
    if inner == "*":
        return _wildcard, rest
    if inner[:1] in "'\"":
        names = [_literal(part.strip()) for part in _split_commas(inner)]
        return _fields([str(n) for n in names]), rest
    if re.fullmatch(r"-?\d*(:-?\d*){0,2}", inner) and inner:
        return _slice(inner), rest
    raise ValueError(f"unsupported array expression in JSONPath: [{inner}]")


def _split_commas(text: str) -> list[str]:
    parts, quote, start = [], "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _comparison(text: str) -> _Comparison:
    if not text.startswith("@"):
        raise ValueError(f"a filter must start with @: {text!r}")
    path, rest = _steps(text[1:])
    rest = rest.strip()
    if not rest:
        return _Comparison(path, "exists", None)
    match = re.match(r"(==|!=|<=|>=|<|>)\s*(.*)$", rest, re.S)
    if match is None:
        raise ValueError(f"unrecognized filter operator in {text!r}")
    return _Comparison(path, match.group(1), _literal(match.group(2).strip()))


def _literal(text: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError as err:
        raise ValueError(f"unrecognized literal in JSONPath: {text!r}") from err


# --- steps --------------------------------------------------------------------------------------------


def _field(name: str) -> Step:
    def step(values: list[Any]) -> list[Any]:
        return [v[name] for v in values if isinstance(v, dict) and name in v]

    return step


def _fields(names: list[str]) -> Step:
    def step(values: list[Any]) -> list[Any]:
        return [v[n] for v in values if isinstance(v, dict) for n in names if n in v]

    return step


def _wildcard(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if isinstance(v, dict):
            out.extend(v.values())
        elif isinstance(v, list):
            out.extend(v)
    return out


def _recursive(name: str) -> Step:
    def walk(value: Any, out: list[Any]) -> None:
        if isinstance(value, dict):
            if name in value:
                out.append(value[name])
            for child in value.values():
                walk(child, out)
        elif isinstance(value, list):
            for child in value:
                walk(child, out)

    def step(values: list[Any]) -> list[Any]:
        out: list[Any] = []
        for v in values:
            walk(v, out)
        return out

    return step


def _slice(spec: str) -> Step:
    parts = spec.split(":")

    def bound(text: str) -> int | None:
        return int(text) if text not in ("", "-") else None

    def step(values: list[Any]) -> list[Any]:
        out: list[Any] = []
        for v in values:
            if not isinstance(v, list):
                continue
            if len(parts) == 1:
                index = int(parts[0])
                if -len(v) <= index < len(v):
                    out.append(v[index])
                continue
            start, stop = bound(parts[0]), bound(parts[1])
            stride = bound(parts[2]) if len(parts) == 3 else None
            out.extend(v[slice(start, stop, stride)])
        return out

    return step


def _compare(left: Any, operator: str, right: Any) -> bool:
    if operator == "==":
        return bool(left == right)
    if operator == "!=":
        return bool(left != right)
    numbers = (int, float)
    comparable = (isinstance(left, numbers) and isinstance(right, numbers)) or (
        isinstance(left, str) and isinstance(right, str)
    )
    if not comparable or isinstance(left, bool) or isinstance(right, bool):
        return False  # "incompatible types for comparison" is ignored, not matched
    return bool({"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[operator])


def _filter(cond: _Comparison) -> Step:
    def step(values: list[Any]) -> list[Any]:
        out: list[Any] = []
        for v in values:
            for item in v if isinstance(v, list) else [v]:
                lefts = [item]
                for s in cond.path:
                    lefts = s(lefts)
                if not lefts:
                    continue
                if cond.operator == "exists" or _compare(lefts[0], cond.operator, cond.literal):
                    out.append(item)
        return out

    return step


# --- printing -------------------------------------------------------------------------------------------


def go_float(value: float) -> str:
    """fmt's %v of a float64 (strconv 'g' with the shortest precision): the shortest digits, in
    exponent form when the exponent is below -4 or 6 and above (`1e+06`, `1.5e-05`)."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    digits_tuple = Decimal(repr(value)).normalize().as_tuple()
    digits = "".join(str(d) for d in digits_tuple.digits)
    exponent = int(digits_tuple.exponent)
    point = len(digits) + exponent  # position of the decimal point
    sign = "-" if digits_tuple.sign else ""
    exp = point - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _go_json(value: Any) -> str:
    def integral(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
            return int(v)
        if isinstance(v, dict):
            return {k: integral(x) for k, x in v.items()}
        if isinstance(v, list):
            return [integral(x) for x in v]
        return v

    text = json.dumps(integral(value), separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def text(value: Any) -> str:
    """`PrintResults` of one result."""
    if isinstance(value, dict | list):
        return _go_json(value)
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    return str(value)
