"""Draining a node, Karpenter's way: which pods to wait for, in which order, and how to move them.

The pure part (what a pod is, which tier it drains in, whether the deadline forces its deletion) is
separate from the loop that acts, so the rules are unit-tested without an API server.

Rules (karpenter-behavior.md §5.4-5.6):
- Waited for: pods that are not terminal, do not tolerate `karpenter.sh/disrupted:NoSchedule`, are
  not mirror/static pods and are not stuck terminating (deletionTimestamp more than a minute past).
- Tiers: non-critical non-DaemonSet, non-critical DaemonSet, critical non-DaemonSet, critical
  DaemonSet. Only the first tier that still has pods is evicted; a tier starts when every pod of
  the earlier tiers is gone (terminating pods still count).
- `karpenter.sh/do-not-disrupt` pods are waited for, never evicted.
- With a deadline (deletion time + terminationGracePeriod), a pod whose own grace period would
  outlast it is deleted with grace = time left (at least 1 s), whatever its tier, bypassing PDBs.
- Evictions go through the Eviction API with a UID precondition; 429 and the multi-PDB 500 back off
  and retry; 404 and 409 mean the pod is gone or replaced. Evictions are serial per PDB and
  parallel across PDBs.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from activities.errors import FORBIDDEN, INVALID, KubeError, permanent
from activities.kube_api import Json, KubeApi
from api.constants import (
    CRITICAL_PRIORITY_CLASSES,
    DISRUPTED_TAINT_KEY,
    DO_NOT_DISRUPT_ANNOTATION,
    LEGACY_DO_NOT_EVICT_ANNOTATION,
    MIRROR_POD_ANNOTATION,
)
from api.duration import DurationError, parse_duration

log = logging.getLogger(__name__)

STUCK_TERMINATING = timedelta(minutes=1)
DEFAULT_POD_GRACE_SECONDS = 30
TIER_NAMES = ("non-critical", "non-critical DaemonSet", "critical", "critical DaemonSet")
BACKOFF_START = 0.1
BACKOFF_MAX = 10.0


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def tolerates_disrupted(tolerations: Iterable[Json]) -> bool:
    """Does any toleration tolerate `karpenter.sh/disrupted:NoSchedule` (a taint without a value)?"""
    for toleration in tolerations or ():
        effect = toleration.get("effect") or ""
        if effect and effect != "NoSchedule":
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists" and key in ("", DISRUPTED_TAINT_KEY):
            return True
        if operator == "Equal" and key == DISRUPTED_TAINT_KEY and not toleration.get("value"):
            return True
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
        return self.meta.get("namespace", "")

    @property
    def name(self) -> str:
        return self.meta.get("name", "")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def uid(self) -> str:
        return self.meta.get("uid", "")

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
    def mirror(self) -> bool:
        if MIRROR_POD_ANNOTATION in self.annotations:
            return True
        return any(ref.get("kind") == "Node" for ref in self.meta.get("ownerReferences") or ())

    @property
    def daemonset(self) -> bool:
        return any(
            ref.get("kind") == "DaemonSet" and ref.get("controller", True)
            for ref in self.meta.get("ownerReferences") or ()
        )

    @property
    def critical(self) -> bool:
        return self.spec.get("priorityClassName") in CRITICAL_PRIORITY_CLASSES

    @property
    def tier(self) -> int:
        return (2 if self.critical else 0) + (1 if self.daemonset else 0)

    @property
    def grace_seconds(self) -> int:
        value = self.spec.get("terminationGracePeriodSeconds")
        return DEFAULT_POD_GRACE_SECONDS if value is None else int(value)

    def do_not_disrupt(self, now: datetime) -> bool:
        """`karpenter.sh/do-not-disrupt: "true"`, or a duration counted from the pod's start (Karpenter HEAD),
        or the v1alpha5 `karpenter.sh/do-not-evict: "true"`."""
        if self.annotations.get(LEGACY_DO_NOT_EVICT_ANNOTATION) == "true":
            return True
        value = self.annotations.get(DO_NOT_DISRUPT_ANNOTATION)
        if value is None:
            return False
        if value == "true":
            return True
        try:
            protection = parse_duration(value)
        except DurationError:
            return False
        started = parse_time((self.raw.get("status") or {}).get("startTime")) or parse_time(
            self.meta.get("creationTimestamp")
        )
        # No known start: the window cannot have ended, so protect (as the planner does).
        return started is None or now < started + protection

    def waited_for(self, now: datetime) -> bool:
        """Must this pod be gone before the node is drained?"""
        return not (
            self.terminal
            or tolerates_disrupted(self.spec.get("tolerations") or ())
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


def plan(pods: Iterable[Pod], deadline: datetime | None, now: datetime) -> DrainPlan:
    waiting = [pod for pod in pods if pod.waited_for(now)]
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


def selector_matches(selector: Json | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: null matches nothing, {} matches everything (policy/v1 semantics)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = (
            expression.get("key"),
            expression.get("operator"),
            expression.get("values") or [],
        )
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def pdb_group(pod: Pod, pdbs: list[Json]) -> tuple[str, ...]:
    """The PDBs guarding this pod (sorted), or the pod itself when none does.

    Evictions are serial within a group and parallel across groups."""
    names = sorted(
        f"{pdb['metadata']['namespace']}/{pdb['metadata']['name']}"
        for pdb in pdbs
        if pdb["metadata"].get("namespace") == pod.namespace
        and selector_matches((pdb.get("spec") or {}).get("selector"), pod.labels)
    )
    return tuple(names) if names else (f"pod:{pod.uid}",)


def is_multi_pdb_error(err: KubeError) -> bool:
    return err.status == 500 and "more than one" in err.message.lower()


# -- The loop ---------------------------------------------------------------------------------------


@dataclass
class _Backoff:
    delay: float = 0.0
    until: float = 0.0

    def fail(self, now: float) -> None:
        self.delay = BACKOFF_START if self.delay == 0 else min(self.delay * 2, BACKOFF_MAX)
        self.until = now + self.delay

    def reset(self) -> None:
        self.delay = 0.0
        self.until = 0.0


@dataclass
class DrainProgress:
    tier: int | None = None
    pods_left: int = 0
    waiting_on: list[str] = field(default_factory=list)
    evicted: int = 0
    deleted: int = 0
    blocked: dict[str, str] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        return {
            "tier": None if self.tier is None else TIER_NAMES[self.tier],
            "pods_left": self.pods_left,
            "waiting_on": self.waiting_on[:10],
            "evicted": self.evicted,
            "deleted": self.deleted,
            "blocked": dict(list(self.blocked.items())[:10]),
        }


class Drainer:
    """Drains one node until no waited-for pod is left. Stateless across attempts: a retried activity
    looks at the node afresh, so a crash half way loses nothing."""

    def __init__(
        self,
        kube: KubeApi,
        node: str,
        deadline: datetime | None,
        poll_interval: float,
        on_progress: Callable[[DrainProgress], None] = lambda _: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.kube = kube
        self.node = node
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.on_progress = on_progress
        self.clock = clock
        self.progress = DrainProgress()
        self._backoff: dict[tuple[str, ...], _Backoff] = {}

    async def run(self) -> DrainProgress:
        while True:
            now = self.clock()
            pods = [Pod(raw) for raw in await self.kube.pods_on_node(self.node)]
            current = plan(pods, self.deadline, now)
            self.progress.tier = current.tier
            self.progress.pods_left = len(current.waiting)
            self.progress.waiting_on = [pod.key for pod in current.waiting]
            self.on_progress(self.progress)
            if current.done:
                return self.progress
            await asyncio.gather(*(self._force_delete(pod, grace) for pod, grace in current.force_delete))
            await self._evict_all(current.evict)
            await asyncio.sleep(self._next_wait())

    def _next_wait(self) -> float:
        now = time.monotonic()
        pending = [b.until - now for b in self._backoff.values() if b.until > now]
        return max(0.01, min([self.poll_interval, *pending]))

    async def _force_delete(self, pod: Pod, grace: int) -> None:
        try:
            await self.kube.delete_pod(pod.raw, grace)
            self.progress.deleted += 1
            log.info(
                "deleted pod %s with grace %ss: node %s deadline %s is near",
                pod.key,
                grace,
                self.node,
                self.deadline,
            )
        except KubeError as err:
            if err.status in (404, 409):
                return
            self._raise_if_permanent(err, f"deletion of pod {pod.key}")
            log.warning("deleting pod %s failed, will retry: %s", pod.key, err)

    async def _evict_all(self, pods: list[Pod]) -> None:
        if not pods:
            return
        pdbs_by_ns: dict[str, list[Json]] = {}
        for namespace in {pod.namespace for pod in pods}:
            pdbs_by_ns[namespace] = await self._pdbs(namespace)
        groups: dict[tuple[str, ...], list[Pod]] = {}
        for pod in pods:
            groups.setdefault(pdb_group(pod, pdbs_by_ns[pod.namespace]), []).append(pod)
        now = time.monotonic()
        ready = [
            (key, members)
            for key, members in groups.items()
            if self._backoff.get(key, _Backoff()).until <= now
        ]
        await asyncio.gather(*(self._evict_serially(key, members) for key, members in ready))

    async def _pdbs(self, namespace: str) -> list[Json]:
        try:
            return await self.kube.pdbs(namespace)
        except KubeError as err:
            if err.status == 404:  # an API server without policy/v1: nothing guards the pods
                return []
            raise

    async def _evict_serially(self, key: tuple[str, ...], pods: list[Pod]) -> None:
        backoff = self._backoff.setdefault(key, _Backoff())
        for pod in pods:
            try:
                await self.kube.evict(pod.raw)
            except KubeError as err:
                if err.status in (404, 409):  # gone, or a different pod now has the name
                    continue
                self._raise_if_permanent(err, f"eviction of pod {pod.key}")
                reason = (
                    "PodDisruptionBudget"
                    if err.status == 429 or is_multi_pdb_error(err)
                    else f"HTTP {err.status}"
                )
                self.progress.blocked[pod.key] = f"{reason}: {err.message}"[:200]
                backoff.fail(time.monotonic())
                return
            self.progress.evicted += 1
            self.progress.blocked.pop(pod.key, None)
            backoff.reset()

    @staticmethod
    def _raise_if_permanent(err: KubeError, what: str) -> None:
        if err.status in (401, 403):
            raise permanent(f"{what}: Kubernetes API {err.status}: {err.message}", FORBIDDEN)
        if err.status in (400, 422):
            raise permanent(f"{what}: Kubernetes API {err.status}: {err.message}", INVALID)


async def wait_until(
    check: Callable[[], Awaitable[bool]], poll_interval: float, deadline: datetime | None = None
) -> bool:
    """Poll `check` until it is true (True) or the deadline passes (False)."""
    while True:
        if await check():
            return True
        if deadline is not None and datetime.now(UTC) >= deadline:
            return False
        await asyncio.sleep(poll_interval)
