"""Karpenter's drain rules, pure: which pods a node's drain waits for, in which tier they go, when
the deadline forces their deletion, and which PodDisruptionBudgets group their evictions.

Rules (karpenter-behavior.md §5.4-5.6):
- Waited for: pods that are not terminal, do not tolerate the disruption taint on the node
  (`karpenter.sh/disrupted:NoSchedule`, or karpflow's `karpflow.dev/disrupted:NoSchedule` beside
  Karpenter: a pod that tolerates the taint it is drained for would only land there again), are not
  mirror/static pods and are not stuck terminating (deletionTimestamp more than a minute past).
- Tiers: non-critical non-DaemonSet, non-critical DaemonSet, critical non-DaemonSet, critical
  DaemonSet. Only the first tier that still has pods is evicted; a tier starts when every pod of
  the earlier tiers is gone (terminating pods still count).
- `karpenter.sh/do-not-disrupt` pods are waited for, never evicted.
- With a deadline (deletion time + terminationGracePeriod), a pod whose own grace period would
  outlast it is deleted with grace = time left (at least 1 s), whatever its tier, bypassing PDBs.
- Evictions are serial per PDB and parallel across PDBs.

The loop that acts on them is activities/drain.py.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from api.constants import DISRUPTED_TAINT_KEY
from kube.eviction_cost import eviction_cost
from kube.pods import controller_owner, do_not_disrupt_reason, is_critical, is_mirror
from kube.selectors import LabelSelector, Taint, Toleration
from kube.times import parse_time

Json = dict[str, Any]

STUCK_TERMINATING = timedelta(minutes=1)
DEFAULT_POD_GRACE_SECONDS = 30
TIER_NAMES = ("non-critical", "non-critical DaemonSet", "critical", "critical DaemonSet")
DISRUPTED_TAINT = Taint(DISRUPTED_TAINT_KEY, None, "NoSchedule")


def disruption_taint(key: str = DISRUPTED_TAINT_KEY) -> Taint:
    """The NoSchedule disruption taint (without a value) under `key`."""
    return DISRUPTED_TAINT if key == DISRUPTED_TAINT_KEY else Taint(key, None, "NoSchedule")


def tolerates_disrupted(tolerations: Iterable[Json], taint: Taint = DISRUPTED_TAINT) -> bool:
    """Does any toleration tolerate the disruption taint (`karpenter.sh/disrupted:NoSchedule`, a taint
    without a value, unless another is given)? A malformed toleration tolerates nothing."""
    for raw in tolerations or ():
        try:
            if Toleration.from_dict(raw).tolerates(taint):
                return True
        except ValueError:
            continue
    return False


@dataclass(frozen=True)
class Pod:
    """A read-only view of a pod's JSON with the properties the drain rules need."""

    raw: Json

    @property
    def meta(self) -> Json:
        return self.raw.get("metadata") or {}

    @property
    def namespace(self) -> str:
        namespace: str = self.meta.get("namespace", "")
        return namespace

    @property
    def name(self) -> str:
        name: str = self.meta.get("name", "")
        return name

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def uid(self) -> str:
        uid: str = self.meta.get("uid", "")
        return uid

    @property
    def labels(self) -> dict[str, str]:
        return self.meta.get("labels") or {}

    @property
    def annotations(self) -> dict[str, str]:
        return self.meta.get("annotations") or {}

    @property
    def spec(self) -> Json:
        return self.raw.get("spec") or {}

    @property
    def terminal(self) -> bool:
        return (self.raw.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    @property
    def deletion_timestamp(self) -> datetime | None:
        return parse_time(self.meta.get("deletionTimestamp"))

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None

    def stuck_terminating(self, now: datetime) -> bool:
        deleted = self.deletion_timestamp
        return deleted is not None and now - deleted > STUCK_TERMINATING

    @property
    def owner_kind(self) -> str | None:
        return controller_owner(self.meta.get("ownerReferences"))[0]

    @property
    def mirror(self) -> bool:
        return is_mirror(self.annotations, self.owner_kind)

    @property
    def daemonset(self) -> bool:
        return self.owner_kind == "DaemonSet"

    @property
    def reschedulable(self) -> bool:
        """Must find a place if its node goes (Karpenter's IsReschedulable, as planner/snapshot.py):
        active, or terminating but owned by a StatefulSet; never a DaemonSet or mirror pod."""
        if self.terminal or self.daemonset or self.mirror:
            return False
        return not self.terminating or self.owner_kind == "StatefulSet"

    @property
    def eviction_cost(self) -> float:
        """Karpenter's eviction cost of the pod (kube/eviction_cost.py)."""
        return eviction_cost(self.annotations, int(self.spec.get("priority") or 0))

    @property
    def critical(self) -> bool:
        return is_critical(self.spec.get("priorityClassName"))

    @property
    def tier(self) -> int:
        return (2 if self.critical else 0) + (1 if self.daemonset else 0)

    @property
    def grace_seconds(self) -> int:
        value = self.spec.get("terminationGracePeriodSeconds")
        return DEFAULT_POD_GRACE_SECONDS if value is None else int(value)

    def do_not_disrupt(self, now: datetime) -> bool:
        """Protected by do-not-disrupt (kube.pods): waited for, never evicted."""
        started = parse_time((self.raw.get("status") or {}).get("startTime")) or parse_time(
            self.meta.get("creationTimestamp")
        )
        return do_not_disrupt_reason(self.annotations, started, now) is not None

    def waited_for(self, now: datetime, taint: Taint = DISRUPTED_TAINT) -> bool:
        """Must this pod be gone before the node (tainted `taint`) is drained?"""
        return not (
            self.terminal
            or tolerates_disrupted(self.spec.get("tolerations") or (), taint)
            or self.mirror
            or self.stuck_terminating(now)
        )

    def force_delete_grace(self, deadline: datetime | None, now: datetime) -> int | None:
        """Seconds of grace to delete this pod with, bypassing PDBs, because the node deadline is near;
        None while eviction may still be used. Never 0: that would remove the pod from etcd at once."""
        if deadline is None:
            return None
        left = (deadline - now).total_seconds()
        deleted = self.deletion_timestamp
        if deleted is not None:
            # Already terminating: only shorten a grace period that ends after the node deadline.
            return max(math.ceil(left), 1) if deleted > deadline else None
        if left <= self.grace_seconds:
            return max(math.ceil(left), 1)
        return None

    def claims(self) -> list[str]:
        return [
            volume["persistentVolumeClaim"]["claimName"]
            for volume in self.spec.get("volumes") or ()
            if (volume.get("persistentVolumeClaim") or {}).get("claimName")
        ]


@dataclass
class DrainPlan:
    """One look at the node: what is left, what to delete now, what to evict now."""

    waiting: list[Pod]
    force_delete: list[tuple[Pod, int]]
    evict: list[Pod]
    tier: int | None

    @property
    def done(self) -> bool:
        return not self.waiting


def plan(
    pods: Iterable[Pod], deadline: datetime | None, now: datetime, taint: Taint = DISRUPTED_TAINT
) -> DrainPlan:
    waiting = [pod for pod in pods if pod.waited_for(now, taint)]
    force = [(pod, grace) for pod in waiting if (grace := pod.force_delete_grace(deadline, now)) is not None]
    forced = {pod.uid for pod, _ in force}
    tier = min((pod.tier for pod in waiting), default=None)
    evict = [
        pod
        for pod in waiting
        if pod.tier == tier and not pod.terminating and pod.uid not in forced and not pod.do_not_disrupt(now)
    ]
    return DrainPlan(waiting=waiting, force_delete=force, evict=evict, tier=tier)


# -- PodDisruptionBudgets --------------------------------------------------------------------------


def pdb_selects(pdb: Json, pod: Pod) -> bool:
    """policy/v1: a PDB selects pods of its namespace by label; a null selector selects none (an
    empty one, all). A malformed selector selects none."""
    if (pdb.get("metadata") or {}).get("namespace") != pod.namespace:
        return False
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    try:
        return LabelSelector.from_dict(selector).matches(pod.labels)
    except ValueError:
        return False


def pdb_group(pod: Pod, pdbs: list[Json]) -> tuple[str, ...]:
    """The PDBs guarding this pod (sorted), or the pod itself when none does.

    Evictions are serial within a group and parallel across groups."""
    names = sorted(
        f"{pdb['metadata']['namespace']}/{pdb['metadata']['name']}" for pdb in pdbs if pdb_selects(pdb, pod)
    )
    return tuple(names) if names else (f"pod:{pod.uid}",)
