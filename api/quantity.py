"""Kubernetes resource quantities ("250m", "1.5Gi", "2e3") as plain numbers.

The grammar is Kubernetes' (resource.Quantity): a signed decimal number, optionally with an
exponent (`e3`), followed by a binary suffix (Ki..Ei), a decimal suffix (n, u, m, k, M..E) or nothing.
It is parsed here rather than with `kubernetes.utils.parse_quantity` because importing that module
loads the whole generated client (~0.5 s), which every `karpflow plan` would pay. Results are
memoised: a 100,000-pod snapshot repeats a handful of distinct request strings.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from functools import lru_cache

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


class QuantityError(ValueError):
    pass


@lru_cache(maxsize=65536)
def _parse(value: str) -> Decimal:
    match = _QUANTITY.match(value)
    if match is None:
        raise QuantityError(f"invalid quantity {value!r}")
    number, exponent, suffix = match.groups()
    try:
        base = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the regex admits only valid decimals
        raise QuantityError(f"invalid quantity {value!r}") from err
    if exponent:
        return base.scaleb(int(exponent[1:]))
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base.scaleb(_DECIMAL[suffix or ""])


def parse(value: str | int | float | None) -> Decimal:
    """A quantity as a Decimal; None and "" count as zero."""
    if value is None or value == "":
        return Decimal(0)
    if isinstance(value, int | float):
        return Decimal(str(value))
    return _parse(str(value).strip())


def millicores(value: str | int | float | None) -> int:
    """CPU in millicores, rounded up like the scheduler does (0.0001 cpu needs a whole milli)."""
    return math.ceil(parse(value) * 1000)


def to_int(value: str | int | float | None) -> int:
    """Memory, storage, pods and extended resources: whole units, rounded up."""
    return math.ceil(parse(value))


def format_millicores(milli: int) -> str:
    return f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m"


def format_bytes(value: int) -> str:
    for suffix, size in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value % size == 0 and value >= size:
            return f"{value // size}{suffix}"
    return str(value)
