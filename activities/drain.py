"""The drain activity's loop: evict a node's pods tier by tier through the Eviction API until none
is left to wait for (the rules are kube/drain_rules.py).

The node's pods, the node and the PDBs are read from the worker's informer cache (cluster/reads.py),
not listed every pass: a drain is seconds to hours of passes a second. A pod the cache shows that is
gone already costs an eviction answered 404; one it does not show yet is evicted on the next pass;
and before the drain says its node is empty, the pods are listed once from the API server, so a pod
bound within the watch's delay is not left behind.

Evictions go with a UID precondition; 429 and the multi-PDB 500 back off and retry; 404 and 409 mean
the pod is gone or replaced; pods past the deadline are deleted with the time left as their grace.
A 400 backs off and retries too: it is what an admission webhook that denies the eviction answers
(kube-apiserver's webhook errors raise a denial below 400 to 400), and such a policy lifts; Karpenter's
eviction queue retries every error but 404 and 409 the same way. 401, 403 and 422 fail the drain:
no retry can fix missing rights or a request the API cannot read.

What operators see, as Karpenter shows it: an `Evicted` Event on each evicted pod, `Disrupted` on
each pod deleted at the deadline, `FailedDraining` on the node while PDBs hold pods back (one
Event with a count), and the metrics `karpenter_pods_eviction_requests_total{code}`,
`karpenter_pods_drained_total{reason}` and `karpflow_drain_duration_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from activities.errors import FORBIDDEN, INVALID, permanent
from cluster.reads import ClusterReads
from kube import events
from kube.client import Json, KubeApi, KubeError
from kube.drain_rules import DISRUPTED_TAINT, TIER_NAMES, Pod, pdb_group, pdb_selects, plan
from kube.pdb_budget import eviction_may_pass, ignores_pdbs, version
from kube.selectors import Taint
from runtime import metrics

log = logging.getLogger(__name__)

BACKOFF_START = 0.1
BACKOFF_MAX = 10.0


def is_multi_pdb_error(err: KubeError) -> bool:
    return err.status == 500 and "more than one" in err.message.lower()


# -- The loop ---------------------------------------------------------------------------------------


@dataclass
class _Backoff:
    """One PDB group's wait. A refusal from the server doubles it (0.1 s to 10 s, as Karpenter's
    eviction queue and kube's drain helper retry); the cached PDB saying "no room" waits the longest
    without a request (`hold`). `versions`: the group's PDBs as they were at the refusal."""

    delay: float = 0.0
    until: float = 0.0
    versions: tuple[str, ...] = ()
    by_server: bool = False

    def fail(self, now: float, versions: tuple[str, ...] = ()) -> None:
        self.delay = BACKOFF_START if self.delay == 0 else min(self.delay * 2, BACKOFF_MAX)
        self.until = now + self.delay
        self.versions, self.by_server = versions, True

    def hold(self, now: float, versions: tuple[str, ...]) -> None:
        self.delay = BACKOFF_MAX
        self.until = now + BACKOFF_MAX
        self.versions, self.by_server = versions, False

    def reset(self) -> None:
        self.delay = 0.0
        self.until = 0.0
        self.versions, self.by_server = (), False


@dataclass
class DrainProgress:
    tier: int | None = None
    pods_left: int = 0
    waiting_on: list[str] = field(default_factory=list)
    evicted: int = 0
    deleted: int = 0
    blocked: dict[str, str] = field(default_factory=dict)
    stopped: str = ""  # why the drain ended before its pods were gone (the node is another now)

    def details(self) -> dict[str, Any]:
        return {
            "tier": None if self.tier is None else TIER_NAMES[self.tier],
            "pods_left": self.pods_left,
            "waiting_on": self.waiting_on[:10],
            "evicted": self.evicted,
            "deleted": self.deleted,
            "blocked": dict(list(self.blocked.items())[:10]),
        }


def resumed_progress(details: Any) -> DrainProgress | None:
    """The counters an earlier attempt heartbeated (`DrainProgress.details()`), if any."""
    if not isinstance(details, dict):
        return None
    try:
        return DrainProgress(
            evicted=int(details.get("evicted") or 0), deleted=int(details.get("deleted") or 0)
        )
    except (TypeError, ValueError):
        return None


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
        resumed: DrainProgress | None = None,
        check: Callable[[], Awaitable[tuple[str | None, datetime | None]]] | None = None,
        reason: str = "",
        recorder: events.EventRecorder | None = None,
        taint: Taint = DISRUPTED_TAINT,
        reads: ClusterReads | None = None,
    ) -> None:
        self.kube = kube
        self.reads = reads if reads is not None else ClusterReads(kube)
        self.taint = taint  # the disruption taint on the node: pods that tolerate it stay
        self.reason = reason or "Unknown"  # the node's disruption reason, in Events and metrics
        self.recorder = recorder if recorder is not None else events.recorder_for(kube)
        self._node_ref: events.ObjectRef | None = None
        self.node = node
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.on_progress = on_progress
        self.clock = clock
        # A retried attempt (the worker died) carries on with the counters of the one before it.
        self.progress = resumed or DrainProgress()
        # Each pass: why the node of this name is no longer the one being drained (None while it is),
        # and its annotated deadline, which someone may have brought forward (a spot interruption).
        self.check = check
        self._backoff: dict[tuple[str, ...], _Backoff] = {}
        self._evicted: set[str] = set()  # UIDs this attempt evicted (answered 200)

    async def run(self) -> DrainProgress:
        started = time.monotonic()
        confirmed = False  # the last listing came from the API server (an "empty" checked there)
        while True:
            now = self.clock()
            pods = [Pod(raw) for raw in await self.reads.pods_on_node(self.node, fresh=confirmed)]
            # Checked after the listing: if the node is still the pinned one (or gone, and none has
            # the name), every pod listed was bound to it, and evictions carry each pod's UID.
            if self.check is not None:
                why, deadline = await self.check()
                if why is not None:
                    log.warning("drain of node %s stops: %s", self.node, why)
                    self.progress.stopped = why
                    return self.progress
                if deadline is not None and (self.deadline is None or deadline < self.deadline):
                    log.info("drain of node %s: deadline brought forward to %s", self.node, deadline)
                    self.deadline = deadline
            current = plan(pods, self.deadline, now, self.taint)
            self.progress.tier = current.tier
            self.progress.pods_left = len(current.waiting)
            self.progress.waiting_on = [pod.key for pod in current.waiting]
            self.on_progress(self.progress)
            if current.done and not confirmed:
                confirmed = True  # the cache says empty: the server's word before the node goes
                continue
            if current.done:
                metrics.DRAIN_DURATION.observe(time.monotonic() - started)
                return self.progress
            confirmed = False
            await asyncio.gather(*(self._force_delete(pod, grace) for pod, grace in current.force_delete))
            await self._evict_all(current.evict)
            if self.progress.blocked:
                await self._report_blocked()
            await asyncio.sleep(self._next_wait())

    async def _report_blocked(self) -> None:
        """`FailedDraining` on the node (the recorder keeps it to one Event with a count)."""
        if self._node_ref is None:
            try:
                node = await self.reads.node(self.node)
            except Exception as err:  # an Event is not worth failing the drain for
                log.info("node %s not read for its FailedDraining event: %r", self.node, err)
                return
            # The UID too: `kubectl describe node` shows only Events that name it.
            self._node_ref = events.ObjectRef.of(node or {"metadata": {"name": self.node}}, "Node")
        blocked_by = "; ".join(f"{pod}: {why}" for pod, why in list(self.progress.blocked.items())[:3])
        await self.recorder.record(
            events.failed_draining(self._node_ref, self.progress.pods_left, blocked_by)
        )

    def _next_wait(self) -> float:
        now = time.monotonic()
        pending = [b.until - now for b in self._backoff.values() if b.until > now]
        return max(0.01, min([self.poll_interval, *pending]))

    async def _force_delete(self, pod: Pod, grace: int) -> None:
        try:
            await self.kube.delete_pod(pod.raw, grace)
            self.progress.deleted += 1
            await self.recorder.record(events.disrupted(pod.raw, self.node, grace))
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
        # A pod this drain evicted is terminating, whatever a cache a watch delay behind still shows.
        pods = [pod for pod in pods if pod.uid not in self._evicted]
        if not pods:
            return
        pdbs_by_ns: dict[str, list[Json]] = {}
        for namespace in {pod.namespace for pod in pods}:
            pdbs_by_ns[namespace] = await self._pdbs(namespace)
        groups: dict[tuple[str, ...], list[Pod]] = {}
        guards: dict[tuple[str, ...], list[Json]] = {}
        for pod in pods:
            key = pdb_group(pod, pdbs_by_ns[pod.namespace])
            groups.setdefault(key, []).append(pod)
            guards.setdefault(key, [pdb for pdb in pdbs_by_ns[pod.namespace] if pdb_selects(pdb, pod)])
        await asyncio.gather(
            *(self._evict_serially(key, members, guards[key]) for key, members in groups.items())
        )

    async def _pdbs(self, namespace: str) -> list[Json]:
        # An API server without policy/v1 has none: nothing guards the pods (cluster/reads.py).
        return await self.reads.pdbs(namespace)

    def _may_send(self, pod: Pod, guards: list[Json], backoff: _Backoff) -> bool:
        """Send this eviction now? Only when the cached PDB says it can pass (kube/pdb_budget.py), or
        once the group's back-off is over: a cache that is wrong costs one request per back-off."""
        now = time.monotonic()
        spent = self.reads.pdb_spent.of(guards[0]) if len(guards) == 1 else 0
        room = eviction_may_pass(pod.raw, guards, spent)
        versions = tuple(version(pdb) for pdb in guards)
        if room is None:
            return backoff.until <= now
        if room:
            # After the server refused at these very versions, the cache's "room" is what it was
            # wrong about: wait for a newer version or the back-off's end.
            stale = backoff.by_server and backoff.versions == versions
            return backoff.until <= now or not stale
        if backoff.until > now:
            return False
        if backoff.delay == 0:
            backoff.hold(now, versions)  # no room: wait for the PDB to change, asking nothing
            self._blocked_by_budget(pod, guards[0])
            return False
        return True  # the back-off is over: one request, in case the cache is wrong

    def _blocked_by_budget(self, pod: Pod, pdb: Json) -> None:
        meta, status = pdb.get("metadata") or {}, pdb.get("status") or {}
        self.progress.blocked[pod.key] = (
            f"PodDisruptionBudget: {meta.get('namespace')}/{meta.get('name')} allows no disruption now "
            f"(needs {status.get('desiredHealthy', 0)} healthy pods, has {status.get('currentHealthy', 0)})"
        )[:200]

    async def _evict_serially(self, key: tuple[str, ...], pods: list[Pod], guards: list[Json]) -> None:
        backoff = self._backoff.setdefault(key, _Backoff())
        for pod in pods:
            if not self._may_send(pod, guards, backoff):
                return
            try:
                await self.kube.evict(pod.raw)
            except KubeError as err:
                metrics.EVICTION_REQUESTS.labels(code=str(err.status)).inc()
                if err.status in (404, 409):  # gone, or a different pod now has the name
                    continue
                self._raise_if_permanent(err, f"eviction of pod {pod.key}")
                reason = (
                    "PodDisruptionBudget"
                    if err.status == 429 or is_multi_pdb_error(err)
                    else f"HTTP {err.status}"
                )
                self.progress.blocked[pod.key] = f"{reason}: {err.message}"[:200]
                backoff.fail(time.monotonic(), tuple(version(pdb) for pdb in guards))
                return
            metrics.EVICTION_REQUESTS.labels(code="200").inc()
            metrics.PODS_DRAINED.labels(reason=self.reason).inc()
            self.progress.evicted += 1
            self.progress.blocked.pop(pod.key, None)
            self._evicted.add(pod.uid)
            if len(guards) == 1 and not ignores_pdbs(pod.raw):
                self.reads.pdb_spent.spend(guards[0])  # the server took one; the cache shows it later
            backoff.reset()
            await self.recorder.record(events.evicted(pod.raw, self.reason))

    @staticmethod
    def _raise_if_permanent(err: KubeError, what: str) -> None:
        if err.status in (401, 403):
            raise permanent(f"{what}: Kubernetes API {err.status}: {err.message}", FORBIDDEN)
        if err.status == 422:
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
