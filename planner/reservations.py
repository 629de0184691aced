"""Capacity reservations (on-demand capacity reservations and capacity blocks) as reserved offerings,
the way Karpenter's AWS provider models them, and the count a pass consumes.

Read in aws/karpenter-provider-aws: pkg/providers/capacityreservation (selector terms as
DescribeCapacityReservations queries, the availability count), pkg/apis/v1/ec2nodeclass_status.go
`CapacityReservationFromEC2` (the type, interruptible flag, and "expiring" 40 minutes before a
capacity block ends), pkg/providers/instancetype/offering/reserved_capacity_resolver.go (one reserved
offering per selected reservation, priced at the on-demand price / 10,000,000, available while it
has a count and is not expiring); and kubernetes-sigs/karpenter
pkg/controllers/provisioning/scheduling/reservationmanager.go (every new node reserves one instance
of each reservation it could launch into, so two new nodes never take the last one).

A reserved offering costs almost nothing, so consolidation moves on-demand and spot nodes into
reservations, and moves a reserved node only into a cheaper reservation (the near-zero prices keep
the on-demand order), never out to on-demand or spot, as Karpenter does.

Pure: the I/O (DescribeCapacityReservations) is the caller's (planner/catalog_live.py,
activities/capacity_reservations.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.constants import (
    CAPACITY_ON_DEMAND,
    CAPACITY_RESERVATION_ID_LABEL,
    CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL,
    CAPACITY_RESERVATION_TYPE_LABEL,
    CAPACITY_RESERVED,
)
from api.nodepool import CapacityReservationSelectorTerm, EC2NodeClass
from planner.catalog import Catalog, InstanceType, Offering, Reservation
from planner.model import Command, PlanContext, Replacement

# reserved_capacity_resolver.go: the on-demand price divided by this, "free" but still ordered.
RESERVED_PRICE_DIVISOR = 10_000_000.0
# ec2nodeclass_status.go: a capacity block is "expiring" 40 minutes before its end (EC2 starts
# reclaiming 30 minutes before; Karpenter drains 10 minutes ahead of that).
CAPACITY_BLOCK_EXPIRY = timedelta(minutes=40)
ReservationType = Literal["default", "capacity-block"]
MATCH_CRITERIA = ("open", "targeted")
_ID = re.compile(r"^cr-[0-9a-z]+$")
_OWNER = re.compile(r"^[0-9]{12}$")


def reserved_price(on_demand: float) -> float:
    return on_demand / RESERVED_PRICE_DIVISOR


class ReservationProblem(ValueError):
    """A reservation EC2 described that Karpenter would not use (left out and reported)."""


class CapacityReservation(BaseModel):
    """One reservation as DescribeCapacityReservations describes it (the fields Karpenter reads)."""

    model_config = ConfigDict(frozen=True)

    id: str
    instance_type: str
    zone: str
    owner_id: str = ""
    instance_match_criteria: str = "targeted"
    reservation_type: ReservationType = "default"
    interruptible: bool = False
    available: int = Field(default=0, ge=0)
    end_time: datetime | None = None
    state: Literal["active", "expiring"] = "active"
    tags: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_ec2(cls, entry: Mapping[str, Any], now: datetime) -> CapacityReservation:
        """Karpenter's CapacityReservationFromEC2: an unknown match criteria or reservation type is
        refused (ReservationProblem), as Karpenter guards against values EC2 may add."""
        rid = str(entry.get("CapacityReservationId") or "")
        criteria = str(entry.get("InstanceMatchCriteria") or "")
        if criteria not in MATCH_CRITERIA:
            raise ReservationProblem(f"{rid}: unsupported instance match criteria {criteria!r}")
        kind = str(entry.get("ReservationType") or "default")
        if kind not in ("default", "capacity-block"):
            raise ReservationProblem(f"{rid}: unsupported reservation type {kind!r}")
        end = entry.get("EndDate")
        end_time = end if isinstance(end, datetime) else None
        expiring = (
            kind == "capacity-block" and end_time is not None and now >= end_time - CAPACITY_BLOCK_EXPIRY
        )
        return cls(
            id=rid,
            instance_type=str(entry.get("InstanceType") or ""),
            zone=str(entry.get("AvailabilityZone") or ""),
            owner_id=str(entry.get("OwnerId") or ""),
            instance_match_criteria=criteria,
            reservation_type="capacity-block" if kind == "capacity-block" else "default",
            interruptible=entry.get("Interruptible") is True,
            available=max(int(entry.get("AvailableInstanceCount") or 0), 0),
            end_time=end_time,
            state="expiring" if expiring else "active",
            tags={str(t.get("Key")): str(t.get("Value")) for t in entry.get("Tags") or ()},
        )


# --- selector terms --------------------------------------------------------------------------------


def term_problem(term: CapacityReservationSelectorTerm) -> str | None:
    """Karpenter's CRD rules on one term (ec2nodeclass.go): id alone, else tags or
    instanceMatchCriteria; well-formed ids, owners and criteria; no empty tag keys or values."""
    if term.id is not None:
        if term.tags or term.owner_id is not None or term.instance_match_criteria is not None:
            return "'id' is mutually exclusive, cannot be set along with other fields"
        if not _ID.match(term.id):
            return f"id {term.id!r} must match ^cr-[0-9a-z]+$"
        return None
    if not term.tags and term.instance_match_criteria is None:
        return "expected at least one, got none, ['tags', 'id', 'instanceMatchCriteria']"
    if term.owner_id is not None and not _OWNER.match(term.owner_id):
        return f"ownerID {term.owner_id!r} must be a 12-digit account id"
    if term.instance_match_criteria is not None and term.instance_match_criteria not in MATCH_CRITERIA:
        return f"instanceMatchCriteria {term.instance_match_criteria!r} must be open or targeted"
    if any(k == "" or v == "" for k, v in term.tags.items()):
        return "empty tag keys or values aren't supported"
    return None


def valid_terms(
    nodeclass: EC2NodeClass,
) -> tuple[list[CapacityReservationSelectorTerm], list[str]]:
    """The class's terms that select anything, and a problem for each one that does not (a bad term
    selects nothing: fail closed)."""
    terms, problems = [], []
    for index, term in enumerate(nodeclass.spec.capacity_reservation_selector_terms):
        why = term_problem(term)
        if why is None:
            terms.append(term)
        else:
            problems.append(
                f"EC2NodeClass {nodeclass.name}: capacityReservationSelectorTerms[{index}]: {why}; "
                "it selects no reservation"
            )
    return terms, problems


def describe_queries(terms: Iterable[CapacityReservationSelectorTerm]) -> list[dict[str, Any]]:
    """DescribeCapacityReservations inputs for the terms, as Karpenter builds them
    (QueriesFromSelectorTerms, DescribeCapacityReservationsInput): active reservations only; an id by
    itself; otherwise owner, tags (`*`: any value of the key) and match criteria as filters."""
    active = {"Name": "state", "Values": ["active"]}
    queries: list[dict[str, Any]] = []
    for term in terms:
        if term.id:
            queries.append({"CapacityReservationIds": [term.id], "Filters": [active]})
        if term.tags or term.instance_match_criteria:
            filters = [active]
            if term.owner_id:
                filters.append({"Name": "owner-id", "Values": [term.owner_id]})
            for key, value in sorted(term.tags.items()):
                if value == "*":
                    filters.append({"Name": "tag-key", "Values": [key]})
                else:
                    filters.append({"Name": f"tag:{key}", "Values": [value]})
            if term.instance_match_criteria:
                filters.append({"Name": "instance-match-criteria", "Values": [term.instance_match_criteria]})
            queries.append({"Filters": filters, "MaxResults": 1000})
    return queries


def selected(reservations: Iterable[CapacityReservation], now: datetime) -> list[CapacityReservation]:
    """Karpenter's filterReservations: each id once, none past its end."""
    seen: dict[str, CapacityReservation] = {}
    for reservation in reservations:
        if reservation.end_time is not None and reservation.end_time <= now:
            continue
        seen.setdefault(reservation.id, reservation)
    return sorted(seen.values(), key=lambda r: r.id)


# --- offerings -------------------------------------------------------------------------------------


def reserved_offering(
    instance_type: InstanceType, reservation: CapacityReservation, nodeclasses: frozenset[str]
) -> Offering:
    """Karpenter's reserved offering of one reservation: near-zero price (none known: 0), available
    while it has a count left, is offered in a zone the type is, and is not an expiring block."""
    on_demand = instance_type.cheapest_price([CAPACITY_ON_DEMAND])
    zones = {o.zone for o in instance_type.offerings if o.capacity_type != CAPACITY_RESERVED}
    return Offering(
        zone=reservation.zone,
        capacity_type=CAPACITY_RESERVED,
        price=reserved_price(on_demand) if on_demand is not None else 0.0,
        available=reservation.available > 0 and reservation.zone in zones and reservation.state != "expiring",
        reservation=Reservation(
            id=reservation.id,
            reservation_type=reservation.reservation_type,
            interruptible=reservation.interruptible,
            remaining=reservation.available,
            nodeclasses=nodeclasses,
        ),
    )


def with_reservations(catalog: Catalog, by_nodeclass: Mapping[str, Sequence[CapacityReservation]]) -> Catalog:
    """The catalog with a reserved offering for each reservation the EC2NodeClasses select (one per
    reservation, usable by the classes that select it); the catalog itself when none do. Earlier
    reserved offerings of the catalog are replaced: the reservations are this moment's."""
    classes_of: dict[str, set[str]] = {}
    by_id: dict[str, CapacityReservation] = {}
    for nodeclass, reservations in by_nodeclass.items():
        for reservation in reservations:
            classes_of.setdefault(reservation.id, set()).add(nodeclass)
            known = by_id.get(reservation.id)
            # Two readings of one reservation: the smaller count, as Karpenter's ReservationManager.
            if known is None or reservation.available < known.available:
                by_id[reservation.id] = reservation
    if not by_id:
        return catalog
    per_type: dict[str, list[CapacityReservation]] = {}
    for reservation in by_id.values():
        per_type.setdefault(reservation.instance_type, []).append(reservation)
    types = dict(catalog.types)
    for name, reservations in per_type.items():
        kind = types.get(name)
        if kind is None:
            continue  # a type the catalog cannot price or size: the planner cannot reason about it
        kept = tuple(o for o in kind.offerings if o.capacity_type != CAPACITY_RESERVED)
        added = tuple(
            reserved_offering(kind, r, frozenset(classes_of[r.id]))
            for r in sorted(reservations, key=lambda r: r.id)
        )
        types[name] = replace(kind, offerings=kept + added)
    return Catalog(region=catalog.region, types=types, source=f"{catalog.source} + capacity reservations")


def reservation_labels(reservation: Reservation) -> dict[str, str]:
    """The labels of a node launched into the reservation (Karpenter's offering requirements, written
    onto the NodeClaim and its Node)."""
    return {
        CAPACITY_RESERVATION_ID_LABEL: reservation.id,
        CAPACITY_RESERVATION_TYPE_LABEL: reservation.reservation_type,
        CAPACITY_RESERVATION_INTERRUPTIBLE_LABEL: str(reservation.interruptible).lower(),
    }


def node_reserved_price(instance_type: InstanceType, zone: str, reservation_id: str | None) -> float | None:
    """A reserved node's price: its reservation's offering (by the node's reservation id label, else
    the first in its zone, as Karpenter's OfferingPrice); with none in the catalog (a reservation no
    class selects now), the reserved price of the type's on-demand price: the node is paid for, so it
    is not moved out to on-demand."""
    first: Offering | None = None
    for offering in instance_type.offerings:
        if offering.capacity_type != CAPACITY_RESERVED or offering.zone != zone:
            continue
        if reservation_id and offering.reservation is not None and offering.reservation.id == reservation_id:
            return offering.price
        first = first or offering
    if first is not None:
        return first.price
    on_demand = instance_type.price(zone, CAPACITY_ON_DEMAND)
    return reserved_price(on_demand) if on_demand is not None else None


# --- the count a pass consumes ---------------------------------------------------------------------


@dataclass
class ReservationLedger:
    """The instances of each reservation the pass's earlier replacements took (Karpenter's
    ReservationManager: a new node reserves one instance of every reservation it could launch into,
    pessimistically, so no two new nodes are planned into the last one)."""

    taken: dict[str, int] = field(default_factory=dict)

    def left(self, reservation: Reservation) -> int:
        return reservation.remaining - self.taken.get(reservation.id, 0)

    def compatible(
        self, instance_types: Sequence[InstanceType], zones: Sequence[str], nodeclass: str | None
    ) -> list[tuple[str, Offering]]:
        """The reserved offerings a replacement could launch into that still have an instance left:
        (instance type, offering), in the replacement's type order."""
        out = []
        for kind in instance_types:
            for offering in kind.offerings:
                reservation = offering.reservation
                if (
                    offering.capacity_type == CAPACITY_RESERVED
                    and offering.available
                    and reservation is not None
                    and (not zones or offering.zone in zones)
                    and reservation.serves(nodeclass)
                    and self.left(reservation) > 0
                ):
                    out.append((kind.name, offering))
        return out

    def take(self, offerings: Iterable[Offering]) -> None:
        for offering in offerings:
            if offering.reservation is not None:
                rid = offering.reservation.id
                self.taken[rid] = self.taken.get(rid, 0) + 1


# --- the pass's hook (planner/plan.py, after each method, beside the limits check) -------------------

_LEDGER = "reservations.ledger"


def pass_ledger(ctx: PlanContext) -> ReservationLedger:
    ledger: ReservationLedger = ctx.memo.setdefault(_LEDGER, ReservationLedger())
    return ledger


def _nodeclass(ctx: PlanContext, replacement: Replacement) -> str | None:
    pool = ctx.snapshot.nodepools.get(replacement.nodepool)
    ref = pool.spec.template.spec.node_class_ref if pool is not None else None
    return ref.name if ref is not None else None


def reservation_block(ctx: PlanContext, command: Command) -> str | None:
    """Why the command's reserved replacements cannot all get an instance of a reservation this pass
    (None: they can); the reservations are not taken here."""
    ledger = pass_ledger(ctx)
    trial = ReservationLedger(dict(ledger.taken))
    for replacement in command.replacements:
        if replacement.capacity_type != CAPACITY_RESERVED:
            continue
        found = trial.compatible(replacement.instance_types, replacement.zones, _nodeclass(ctx, replacement))
        if not found:
            names = ", ".join(replacement.instance_type_names[:3]) or "no instance type"
            return (
                f"reserved capacity: no capacity reservation for {names} has an instance left in this "
                "pass (earlier replacements took them)"
            )
        trial.take(o for _, o in found)
    return None


def take_reservations(ctx: PlanContext, command: Command) -> None:
    """Reserve, for each reserved replacement, one instance of every reservation it could launch
    into (Karpenter's pessimistic reservation), and record them on it: its launch goes there only. A
    forceful command's replacement that finds none left launches on-demand instead: it goes anyway."""
    ledger = pass_ledger(ctx)
    for replacement in command.replacements:
        if replacement.capacity_type != CAPACITY_RESERVED:
            continue
        found = ledger.compatible(replacement.instance_types, replacement.zones, _nodeclass(ctx, replacement))
        if not found:
            replacement.capacity_type = CAPACITY_ON_DEMAND
            replacement.reserved = []
            continue
        ledger.take(o for _, o in found)
        replacement.reserved = found
        # Its options narrowed to the types it may launch reserved (Karpenter's NodeClaim gets the
        # reserved capacity type and these reservation ids as requirements).
        names = {name for name, _ in found}
        replacement.instance_types = [t for t in replacement.instance_types if t.name in names]
        replacement.zones = sorted({o.zone for _, o in found})


def within_reservations(ctx: PlanContext, method: str, commands: list[Command]) -> list[Command]:
    """The commands whose reserved replacements each get an instance of a reservation, taking them;
    the others are explained on their nodes and dropped (the next pass plans on the counts EC2 has
    then)."""
    kept = []
    for command in commands:
        why = reservation_block(ctx, command)
        if why is not None:
            for node in command.nodes:
                ctx.explain(node, method, why)
            continue
        take_reservations(ctx, command)
        kept.append(command)
    return kept


def restore_reserved(catalog: Catalog, replacement: Replacement, reservation_ids: Iterable[str]) -> None:
    """A replacement read back from its planned form (planner/plan.py `command_from_out`): its
    reserved offerings found again in the catalog by id."""
    wanted = set(reservation_ids)
    if not wanted:
        return
    replacement.reserved = [
        (kind.name, o)
        for chosen in replacement.instance_types
        if (kind := catalog.get(chosen.name)) is not None
        for o in kind.offerings
        if o.reservation is not None and o.reservation.id in wanted
    ]
