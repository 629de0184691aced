"""The capacity reservations the cluster's EC2NodeClasses select, read from EC2 for the controller's
planning activity (planner/reservations_live.py reads, planner/reservations.py makes the offerings).

Karpenter's AWS provider re-reads them every minute and, in between, counts its own launches and
terminations against the availability; karpflow reads them again every `ttl_seconds` (15 s: about a
pass) instead, and the pass itself never plans two replacements into one instance
(planner/reservations.py `within_reservations`). A launch into an instance another pass took in
between fails with ReservationCapacityExceeded, an unavailable offering like any other capacity
error. When EC2 cannot be asked, the last reading stands (an empty one at first: no reserved
offering, which moves nothing into reservations).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from activities.errors import ec2_code
from api.nodepool import EC2NodeClass
from planner.reservations import CapacityReservation
from planner.reservations_live import read_reservations

log = logging.getLogger(__name__)


class CapacityReservationReader:
    def __init__(
        self, ec2: Any, ttl_seconds: float = 15.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ec2 = ec2
        self.ttl = ttl_seconds
        self.clock = clock
        self._key: str | None = None
        self._at = float("-inf")
        self._reading: dict[str, list[CapacityReservation]] = {}
        self._lock = asyncio.Lock()

    async def by_nodeclass(
        self, nodeclasses: Mapping[str, EC2NodeClass]
    ) -> dict[str, list[CapacityReservation]]:
        """EC2NodeClass name -> the reservations it selects (only classes with selector terms)."""
        selecting = {n: c for n, c in nodeclasses.items() if c.spec.capacity_reservation_selector_terms}
        if not selecting:
            return {}
        key = repr(sorted((n, c.spec.model_dump_json()) for n, c in selecting.items()))
        async with self._lock:
            if key == self._key and self.clock() - self._at < self.ttl:
                return self._reading
            try:
                reading, _ = await asyncio.to_thread(
                    read_reservations, self.ec2, list(selecting.values()), datetime.now(UTC)
                )
            except Exception as err:
                log.warning(
                    "EC2 DescribeCapacityReservations failed (%s: %s); the reservations read before stand",
                    ec2_code(err) or type(err).__name__,
                    err,
                )
                return self._reading
            self._key, self._at, self._reading = key, self.clock(), reading
            return reading
