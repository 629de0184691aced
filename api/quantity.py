"""Kubernetes resource quantities ("250m", "1.5Gi", "2e3") as plain numbers.

Parsing is delegated to the official client's parser and memoised: a 100,000-pod snapshot repeats a
handful of distinct request strings, so the cache turns parsing into a dict lookup.
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import lru_cache

from kubernetes.utils.quantity import parse_quantity


class QuantityError(ValueError):
    pass


@lru_cache(maxsize=65536)
def _parse(value: str) -> Decimal:
    try:
        return parse_quantity(value)
    except ValueError as err:
        raise QuantityError(f"invalid quantity {value!r}") from err


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
