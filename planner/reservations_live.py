"""The capacity reservations the EC2NodeClasses select, from EC2's DescribeCapacityReservations (the
I/O beside planner/reservations.py, as planner/catalog_live.py is beside planner/catalog.py).

Karpenter's AWS provider (pkg/providers/capacityreservation/provider.go `List`) asks once per query
its selector terms make, pages through the answers, treats NotFound for an id as "none", and keeps
each reservation once; the availability count is what EC2 answers (AvailableInstanceCount). A
reservation EC2 describes that Karpenter would not use (an unknown match criteria or type) is left
out and reported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from api.nodepool import EC2NodeClass
from planner.reservations import (
    CapacityReservation,
    ReservationProblem,
    describe_queries,
    selected,
    valid_terms,
)

log = logging.getLogger(__name__)
NOT_FOUND = ("InvalidCapacityReservationId.NotFound", "InvalidCapacityReservationId.Malformed")


def _error_code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str((response.get("Error") or {}).get("Code") or "")


def describe_reservations(ec2: Any, query: dict[str, Any]) -> list[dict[str, Any]]:
    """Every page of one DescribeCapacityReservations query; an unknown id is no reservation."""
    out: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs = dict(query, **({"NextToken": token} if token else {}))
        try:
            page = ec2.describe_capacity_reservations(**kwargs)
        except Exception as err:
            if _error_code(err) in NOT_FOUND:
                return out
            raise
        out.extend(page.get("CapacityReservations") or ())
        token = page.get("NextToken")
        if not token:
            return out


def read_reservations(
    ec2: Any, nodeclasses: Iterable[EC2NodeClass], now: datetime
) -> tuple[dict[str, list[CapacityReservation]], list[str]]:
    """EC2NodeClass name -> the reservations its capacityReservationSelectorTerms select now, and the
    problems met (bad terms, reservations Karpenter would not use). Each query is asked once even when
    several classes make it. Raises what EC2 raises otherwise (the caller keeps its last reading)."""
    answers: dict[str, list[dict[str, Any]]] = {}
    by_class: dict[str, list[CapacityReservation]] = {}
    problems: list[str] = []
    for nodeclass in nodeclasses:
        terms, bad = valid_terms(nodeclass)
        problems.extend(bad)
        if not terms:
            continue
        found: list[CapacityReservation] = []
        for query in describe_queries(terms):
            key = repr(sorted(query.items()))
            if key not in answers:
                answers[key] = describe_reservations(ec2, query)
            for entry in answers[key]:
                try:
                    found.append(CapacityReservation.from_ec2(entry, now))
                except ReservationProblem as err:
                    problems.append(f"EC2NodeClass {nodeclass.name}: capacity reservation {err}; not used")
        by_class[nodeclass.name] = selected(found, now)
    for problem in problems:
        log.warning("%s", problem)
    return by_class, problems
