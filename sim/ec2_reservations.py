"""Capacity reservations on the local stack's EC2: what moto 5.2 does not have.

moto answers neither CreateCapacityReservation nor DescribeCapacityReservations, and RunInstances
ignores a reservation target. Installed once per process by the simulator's moto (sim/stack.py),
this adds them as EC2 documents them (API reference: CreateCapacityReservation,
DescribeCapacityReservations, CancelCapacityReservation, RunInstances
`CapacityReservationSpecification`), in moto's own process and response serializer:

- CreateCapacityReservation: instance type, platform, zone, count, match criteria, end date, tags;
  the account's reservation, `active`, its AvailableInstanceCount the count;
- DescribeCapacityReservations: by id (an unknown one: `InvalidCapacityReservationId.NotFound`)
  and by the filters EC2 documents for it that Karpenter sends (state, owner-id, tag:KEY, tag-key,
  instance-match-criteria, instance-type, availability-zone, reservation-type);
- CancelCapacityReservation: `cancelled` (no longer active: nothing launches into it);
- RunInstances with `CapacityReservationTarget`: the reservation must be active, of the instance type
  and in the zone launched (`InvalidParameterCombination` otherwise) and have an instance left
  (`ReservationCapacityExceeded` otherwise); the instance is then in it (DescribeInstances'
  `CapacityReservationId`) and takes one; TerminateInstances gives it back. A capacity block or an
  interruptible reservation must be launched with its market type (MarketType capacity-block /
  interruptible-capacity-reservation), as EC2 refuses otherwise.

Capacity blocks and interruptible reservations are bought or made otherwise in EC2 (PurchaseCapacityBlock,
an owner's interruptible allocation): `add_reservation(...)` stands in for that, the simulated
account's own state, as a test sets it up. On the dev stack a default reservation is made as on AWS:
`aws ec2 create-capacity-reservation --instance-type m5.large --instance-platform Linux/UNIX
--availability-zone us-west-2a --instance-count 2 --instance-match-criteria targeted
--tag-specifications 'ResourceType=capacity-reservation,Tags=[{Key=team,Value=ml}]'` (with
`source .state/env`, the CLI talks to the stack's moto).
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

ACCOUNT = "123456789012"  # moto's default account
_lock = threading.Lock()
_installed = False


@dataclass
class SimReservation:
    id: str
    region: str
    instance_type: str
    zone: str
    total: int
    available: int
    platform: str = "Linux/UNIX"
    match_criteria: str = "targeted"
    reservation_type: str = "default"
    interruptible: bool = False
    state: str = "active"
    end_date: datetime | None = None
    tags: dict[str, str] = field(default_factory=dict)
    owner: str = ACCOUNT
    created: datetime = field(default_factory=lambda: datetime.now(UTC))
    instances: set[str] = field(default_factory=set)

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "CapacityReservationId": self.id,
            "OwnerId": self.owner,
            "CapacityReservationArn": (
                f"arn:aws:ec2:{self.region}:{self.owner}:capacity-reservation/{self.id}"
            ),
            "InstanceType": self.instance_type,
            "InstancePlatform": self.platform,
            "AvailabilityZone": self.zone,
            "Tenancy": "default",
            "TotalInstanceCount": self.total,
            "AvailableInstanceCount": self.available,
            "EbsOptimized": False,
            "EphemeralStorage": False,
            "State": self.state,
            "StartDate": self.created,
            "EndDateType": "limited" if self.end_date else "unlimited",
            "InstanceMatchCriteria": self.match_criteria,
            "CreateDate": self.created,
            "Tags": [{"Key": k, "Value": v} for k, v in sorted(self.tags.items())],
            "ReservationType": self.reservation_type,
            "Interruptible": self.interruptible,
        }
        if self.end_date is not None:
            out["EndDate"] = self.end_date
        return out


# region -> id -> reservation (moto's state is per process, so is this)
_RESERVATIONS: dict[str, dict[str, SimReservation]] = {}


def add_reservation(
    region: str,
    instance_type: str,
    zone: str,
    count: int,
    *,
    reservation_type: str = "default",
    interruptible: bool = False,
    match_criteria: str = "targeted",
    end_date: datetime | None = None,
    tags: dict[str, str] | None = None,
) -> SimReservation:
    """A reservation of the simulated account (what EC2 would have after a purchase)."""
    reservation = SimReservation(
        id=f"cr-{uuid.uuid4().hex[:17]}",
        region=region,
        instance_type=instance_type,
        zone=zone,
        total=count,
        available=count,
        reservation_type=reservation_type,
        interruptible=interruptible,
        match_criteria=match_criteria,
        end_date=end_date,
        tags=dict(tags or {}),
    )
    with _lock:
        _RESERVATIONS.setdefault(region, {})[reservation.id] = reservation
    return reservation


def reservation(region: str, rid: str) -> SimReservation | None:
    with _lock:
        return _RESERVATIONS.get(region, {}).get(rid)


def _matches(r: SimReservation, name: str, values: list[str]) -> bool:
    if name.startswith("tag:"):
        return r.tags.get(name[4:]) in values
    field_of = {
        "state": r.state,
        "owner-id": r.owner,
        "instance-match-criteria": r.match_criteria,
        "instance-type": r.instance_type,
        "availability-zone": r.zone,
        "reservation-type": r.reservation_type,
    }
    if name == "tag-key":
        return any(v in r.tags for v in values)
    if name in field_of:
        return field_of[name] in values
    return True  # a filter EC2 has that no caller here sends: ignored, as moto ignores unknown ones


def _error(code: str, message: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(code, message)


def _describe(self: Any) -> Any:
    from moto.core.responses import ActionResult

    region = self.region
    ids = self._get_param("CapacityReservationIds", []) or []
    filters = self._get_param("Filters", []) or []
    with _lock:
        known = dict(_RESERVATIONS.get(region, {}))
    for rid in ids:
        if rid not in known:
            raise _error(
                "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist"
            )
    found = [r for r in known.values() if not ids or r.id in ids]
    for f in filters:
        found = [r for r in found if _matches(r, f.get("Name", ""), list(f.get("Values") or []))]
    return ActionResult({"CapacityReservations": [r.describe() for r in sorted(found, key=lambda r: r.id)]})


def _create(self: Any) -> Any:
    from moto.core.responses import ActionResult

    count = int(self._get_param("InstanceCount") or 0)
    if count < 1:
        raise _error("InvalidParameterValue", "InstanceCount must be at least 1")
    tags: dict[str, str] = {}
    for spec in self._get_param("TagSpecifications", []) or []:
        for tag in spec.get("Tags") or []:
            tags[str(tag.get("Key"))] = str(tag.get("Value", ""))
    created = add_reservation(
        self.region,
        str(self._get_param("InstanceType")),
        str(self._get_param("AvailabilityZone")),
        count,
        match_criteria=str(self._get_param("InstanceMatchCriteria") or "open"),
        end_date=self._get_param("EndDate"),
        tags=tags,
    )
    return ActionResult({"CapacityReservation": created.describe()})


def _cancel(self: Any) -> Any:
    from moto.core.responses import ActionResult

    rid = self._get_param("CapacityReservationId")
    found = reservation(self.region, rid)
    if found is None:
        raise _error(
            "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist"
        )
    found.state = "cancelled"
    return ActionResult({"Return": True})


def _launch_zone(self: Any) -> str | None:
    zone = self._get_param("Placement.AvailabilityZone")
    if zone:
        return str(zone)
    subnet_id = self._get_param("SubnetId")
    interfaces = self._get_param("NetworkInterfaces", []) or []
    if not subnet_id and interfaces:
        subnet_id = interfaces[0].get("SubnetId")
    if not subnet_id:
        return None
    return str(self.ec2_backend.get_subnet(subnet_id).availability_zone)


def _target(self: Any) -> SimReservation | None:
    spec = self._get_param("CapacityReservationSpecification") or {}
    rid = (spec.get("CapacityReservationTarget") or {}).get("CapacityReservationId")
    if not rid:
        return None
    found = reservation(self.region, rid)
    if found is None:
        raise _error(
            "InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{rid}' does not exist"
        )
    if found.state != "active":
        raise _error("InvalidCapacityReservationId.NotActive", f"Capacity reservation {rid} is {found.state}")
    instance_type, zone = self._get_param("InstanceType"), _launch_zone(self)
    if instance_type != found.instance_type or (zone is not None and zone != found.zone):
        raise _error(
            "InvalidParameterCombination",
            f"The instance type or zone ({instance_type} in {zone}) does not match capacity "
            f"reservation {rid}",
        )
    market = ((self._get_param("InstanceMarketOptions") or {}).get("MarketType")) or None
    wanted = (
        "capacity-block"
        if found.reservation_type == "capacity-block"
        else "interruptible-capacity-reservation"
        if found.interruptible
        else None
    )
    if market != wanted:
        raise _error("InvalidParameterCombination", f"Capacity reservation {rid} needs MarketType {wanted}")
    count = int(self._get_param("MaxCount") or 1)
    with _lock:
        if found.available < count:
            raise _error(
                "ReservationCapacityExceeded", f"Insufficient capacity in capacity reservation {rid}"
            )
        found.available -= count
    return found


def install() -> None:
    """Add the calls to moto's EC2 and wrap RunInstances/TerminateInstances (once per process)."""
    global _installed
    with _lock:
        if _installed:
            return
        from moto.ec2.responses import EC2Response
        from moto.ec2.responses.instances import InstanceResponse

        run, terminate = InstanceResponse.run_instances, InstanceResponse.terminate_instances

        def run_instances(self: Any) -> Any:
            target = _target(self)
            try:
                result = run(self)
            except Exception:
                if target is not None:
                    with _lock:
                        target.available += int(self._get_param("MaxCount") or 1)
                raise
            if target is not None:
                for instance in getattr(result.result, "instances", None) or ():  # moto's Reservation
                    instance.capacity_reservation_id = target.id  # DescribeInstances' CapacityReservationId
                    with _lock:
                        target.instances.add(instance.id)
            return result

        def terminate_instances(self: Any) -> Any:
            ids = set(self._get_param("InstanceIds", []) or [])
            result = terminate(self)
            with _lock:
                for reservations in _RESERVATIONS.values():
                    for r in reservations.values():
                        for gone in r.instances & ids:
                            r.instances.discard(gone)
                            r.available = min(r.available + 1, r.total)
            return result

        InstanceResponse.run_instances = run_instances
        InstanceResponse.terminate_instances = terminate_instances
        EC2Response.describe_capacity_reservations = _describe
        EC2Response.create_capacity_reservation = _create
        EC2Response.cancel_capacity_reservation = _cancel
        _installed = True
