"""The managed nodes' instances as EC2 describes them, for the planner's EC2NodeClass drift.

A node's AMI, subnet and security groups are not on the Node: Karpenter reads them from EC2 (the
NodeClaim's `status.imageID`, DescribeInstances for the rest), and so does the controller's planning
activity, through this cache. An instance's image and subnet never change and its security groups
rarely do, so an instance is described once and again only after `ttl_seconds` (Karpenter re-checks
drift every few minutes too); a pass asks EC2 only about nodes it has not seen lately, 200 ids per
call. When EC2 cannot be asked, the last descriptions stand and the pass says so: drift by AMI,
subnet or security group then waits, it never fires on missing facts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from activities.errors import ec2_code

log = logging.getLogger(__name__)

BATCH = 200  # instance ids per DescribeInstances filter
KEPT = ("InstanceId", "ImageId", "SubnetId", "SecurityGroups", "InstanceType", "Placement")


@dataclass
class _Seen:
    at: float
    instance: dict[str, Any] | None  # None: EC2 does not know it (gone, or another account's)


class InstanceDescriptions:
    def __init__(self, ec2: Any, ttl_seconds: float = 300.0) -> None:
        self.ec2 = ec2
        self.ttl = ttl_seconds
        self._seen: dict[str, _Seen] = {}
        self._lock = asyncio.Lock()

    async def describe(self, instance_ids: Iterable[str]) -> tuple[list[dict[str, Any]], str | None]:
        """(the instances EC2 describes, as DescribeInstances prints them; a problem to report, or None)."""
        wanted = sorted(set(instance_ids))
        problem = None
        async with self._lock:
            now = time.monotonic()
            stale = [i for i in wanted if i not in self._seen or now - self._seen[i].at > self.ttl]
            try:
                await asyncio.to_thread(self._refresh, stale, now)
            except Exception as err:
                problem = (
                    f"EC2 DescribeInstances failed ({ec2_code(err) or type(err).__name__}: {err}); "
                    "drift by AMI, subnet or security group uses the descriptions read before"
                )
                log.warning("%s", problem)
            for gone in set(self._seen) - set(wanted):
                del self._seen[gone]  # nodes that left: keep the cache the cluster's size
            found = [self._seen[i].instance for i in wanted if i in self._seen]
        return [i for i in found if i is not None], problem

    def _refresh(self, ids: list[str], now: float) -> None:
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            try:
                described = self._describe(InstanceIds=chunk)
            except Exception as err:
                if ec2_code(err) != "InvalidInstanceID.NotFound":
                    raise
                # One id EC2 no longer knows fails the whole call: ask again by filter, which
                # leaves unknown ids out (slower: EC2 matches the filter instance by instance).
                described = self._describe(Filters=[{"Name": "instance-id", "Values": chunk}])
            for instance_id in chunk:
                self._seen[instance_id] = _Seen(now, described.get(instance_id))

    def _describe(self, **query: Any) -> dict[str, dict[str, Any]]:
        described: dict[str, dict[str, Any]] = {}
        for page in self.ec2.get_paginator("describe_instances").paginate(**query):
            for reservation in page.get("Reservations") or ():
                for instance in reservation.get("Instances") or ():
                    described[instance["InstanceId"]] = {k: instance[k] for k in KEPT if k in instance}
        return described
