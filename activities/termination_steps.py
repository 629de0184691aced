"""A node's termination, step by step: `begin_termination` (finalizer, delete, the drain deadline;
beside Karpenter, the hand-over to its termination), `termination_gate` (MaintenanceWindows,
pauses, rate budgets and NodeDisruptionBudgets before the drain; its clock starts there),
`taint_for_termination`, `drain_node`, `await_volumes_detached` and `remove_finalizer`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

from temporalio import activity

from activities import budget_claims, errors, guards
from activities.disruption_metrics import disruption_labels, reschedulable_pods
from activities.drain import Drainer, DrainProgress, resumed_progress, wait_until
from activities.errors import classify_kube, not_found
from activities.kubernetes_base import KubernetesBase, heartbeat
from activities.node_json import (
    add_taint,
    annotated_deadline,
    another_node,
    bring_deadline_forward,
    drop_finalizer,
    ensure_finalizer,
    has_taint,
    instance_id_of,
    is_ready,
    pinned,
    set_labels,
    uid_of,
)
from api.activity_io import (
    BeginTerminationRequest,
    DrainRequest,
    DrainResult,
    NodeInfo,
    NodeRef,
    TerminationGate,
    TerminationGateRequest,
    VolumeRequest,
)
from api.constants import (
    CAPACITY_TYPE_LABEL,
    EC2NODECLASS_LABEL,
    EXCLUDE_LB_LABEL,
    HOLDER_REASON_ANNOTATION,
    NODEPOOL_LABEL,
    REASON_MANUAL,
)
from api.nodepool import NodePool
from api.nodepool_reader import pool_termination_grace_period, read_nodepool
from kube import events
from kube.client import NODES, Json
from kube.drain_rules import Pod, disruption_taint
from kube.times import parse_time
from planner.maintenance_windows import blocked
from runtime import metrics

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 2.0  # seconds between a drain's heartbeats, whatever it is doing


def _quiet_pool(raw: Json | None) -> NodePool | None:
    """The NodePool as karpflow reads it, for metric labels only: its problems are logged where the
    drain deadline reads it (`_pool_grace`), and one that does not validate gives no labels."""
    if raw is None:
        return None
    try:
        return read_nodepool(raw)[0]
    except ValueError:
        return None


class TerminationSteps(KubernetesBase):
    """The steps of a node's termination, each pinned to the node's UID."""

    @activity.defn(name="begin_termination")
    async def begin_termination(self, request: BeginTerminationRequest) -> NodeInfo:
        """Make sure the node is deleting (with the finalizer first, so the instance cannot leak), and stamp
        the drain deadline = deletion time + terminationGracePeriod as an annotation everyone can see.
        An annotation already present is never moved (interruption may have set it to now). With
        `defer_deadline` (a termination with a gate) nothing is stamped here: `termination_gate` stamps
        it when the drain may begin, and only an annotation already there is returned.

        Pinning: with `uid` (or `provider_id`) given, a node of the name that is another node (the
        name was reused after the pinned one went) is not touched: the pinned node is gone, and its
        instance is all that may be left to terminate. Without, the node found first is pinned: the
        returned `uid` is what every later step of the termination acts on."""
        name = request.node
        try:
            node = await self.kube.find_node(name)
            if (why := another_node(node, request.uid, request.provider_id)) is not None:
                log.warning("termination of node %s: %s; not touching it", name, why)
                return self._gone(request, why)
            if node is None and activity.info().attempt == 1 and not request.uid:
                # Only a retry may find the node gone (an earlier attempt deleted it): a first look
                # that finds nothing means a wrong name, or a node someone else already removed.
                # (A pinned node existed once: someone removed it, and only its instance may be left.)
                raise guards.Refused(f"node {name} does not exist")
            if node is None:
                return self._gone(request)
            # The NodePool the guard read (None: deleted) gives the grace period too: read once.
            pool = await guards.check_managed(
                self.kube, node, request.reason, self.ownership, self.cluster, self.reads
            )
            uid = uid_of(node)
            nodeclaim = await self._hand_over(node, request, pool) if self._karpenter_drains(node) else None
            if nodeclaim is None and not node["metadata"].get("deletionTimestamp"):
                await self.kube.update_node(name, pinned(uid, ensure_finalizer), current=node)
                # Listed before the delete, as Karpenter counts a disruption's pods: before any drain.
                counted = await self.kube.pods_on_node(name) if request.reason != REASON_MANUAL else []
                await self._delete_node(name, uid)
                # This call deleted it: once per node.
                await self._disrupting(node, request, pool, counted)
                node = await self.kube.find_node(name)
                if node is None or another_node(node, uid) is not None:
                    return self._gone(request)  # gone at once: someone removed the finalizer meanwhile
            if request.defer_deadline and nodeclaim is None:
                deadline = annotated_deadline(node)  # the gate starts the drain's clock
            else:
                deadline = await self._deadline(node, request, pool)
            pods = await self.reads.pods_on_node(name)  # a count for the workflow: the cache's
        except guards.Refused as err:
            raise guards.refusal(err) from None
        except errors.ApplicationError:
            raise
        except Exception as err:
            raise classify_kube(err, f"beginning termination of node {name}") from None
        now = datetime.now(UTC)
        provider_id = (node.get("spec") or {}).get("providerID") or request.provider_id
        return NodeInfo(
            node=name,
            found=True,
            uid=uid_of(node),
            ready=is_ready(node),
            provider_id=provider_id,
            instance_id=instance_id_of(provider_id),
            nodepool=(node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL),
            deletion_timestamp=parse_time(node["metadata"].get("deletionTimestamp")),
            deadline=deadline,
            pods=sum(1 for pod in pods if Pod(pod).waited_for(now)),
            handed_over=self._karpenter_drains(node),
            nodeclaim=nodeclaim,
        )

    async def _disrupting(
        self, node: Json, request: BeginTerminationRequest, raw_pool: Json | None, pods: list[Json]
    ) -> None:
        """A disruption deleted the node: Karpenter's DisruptionTerminating Event, nodeclaims_disrupted
        and pods_disruption_initiated (its reschedulable `pods`), with Karpenter's five labels
        (activities/disruption_metrics.py). A person's `kubectl delete node`, reason Manual, is no
        disruption: no Event, not counted."""
        reason = request.reason
        if reason == REASON_MANUAL:
            return
        node_labels = node["metadata"].get("labels") or {}
        pool = _quiet_pool(raw_pool)
        grace = request.termination_grace_period
        if grace is None and pool is not None:
            grace = pool_termination_grace_period(pool)
        labels = disruption_labels(
            reason=reason,
            nodepool=node_labels.get(NODEPOOL_LABEL, ""),
            capacity_type=node_labels.get(CAPACITY_TYPE_LABEL, ""),
            policy=pool.spec.disruption.consolidation_policy if pool is not None else None,
            grace=grace,
        )
        metrics.NODECLAIMS_DISRUPTED.labels(**labels).inc()
        metrics.PODS_DISRUPTION_INITIATED.labels(**labels).inc(reschedulable_pods(pods))
        await self._record([events.disruption_terminating(node, reason)])

    def _karpenter_drains(self, node: Json) -> bool:
        """Beside Karpenter, whether its node termination controller acts on this node once it is
        deleting (it does on every node with the termination finalizer and Karpenter's NodeClass
        label): then Karpenter drains it, and karpflow must not drain it too."""
        return self.handover is not None and EC2NODECLASS_LABEL in (node["metadata"].get("labels") or {})

    async def _hand_over(self, node: Json, request: BeginTerminationRequest, pool: Json | None) -> str | None:
        """Hand the node to Karpenter through its NodeClaim: karpflow's deadline stamped on it (the
        node's too), then the NodeClaim deleted; Karpenter deletes the node, drains it and terminates
        its instance. Returns the NodeClaim's name; None when the node has none (the caller deletes
        the node itself, and Karpenter's termination drains it all the same)."""
        assert self.handover is not None
        claim = await self.handover.nodeclaim_for(node)
        if claim is None:
            return None
        deadline = await self._deadline(node, request, pool)
        await self.handover.hand_over(claim, deadline)
        log.info(
            "node %s: NodeClaim %s deleted; Karpenter drains the node and terminates its instance",
            node["metadata"]["name"],
            claim["metadata"]["name"],
        )
        return str(claim["metadata"]["name"])

    @staticmethod
    def _gone(request: BeginTerminationRequest, why: str = "") -> NodeInfo:
        """The pinned node no longer exists: its instance (from the pinned providerID) is all that may
        be left."""
        return NodeInfo(
            node=request.node,
            found=False,
            uid=request.uid,
            provider_id=request.provider_id,
            instance_id=instance_id_of(request.provider_id),
            message=why,
        )

    async def _delete_node(self, name: str, uid: str | None) -> None:
        """Delete with a UID precondition: the API server refuses (409) if the name is another node's."""
        body: Json = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        await self.kube.request("DELETE", f"{NODES}/{quote(name, safe='')}", body=body)

    async def _deadline(
        self,
        node: Json,
        request: BeginTerminationRequest,
        pool: Json | None,
        since: datetime | None = None,
    ) -> datetime | None:
        """The drain deadline: the node's annotation if it has one, else deletion time (or `since`, when
        later: the moment the drain may begin) + grace period; the request's deadline when earlier
        (never later: nobody's deadline is postponed)."""
        existing = annotated_deadline(node)
        deadline = existing if existing is not None else self._grace_deadline(node, request, pool, since)
        if request.deadline is not None:
            deadline = request.deadline if deadline is None else min(deadline, request.deadline)
        if deadline is None:
            return None
        if existing is not None and existing <= deadline:
            return existing
        written = await self.kube.update_node(
            node["metadata"]["name"], pinned(uid_of(node), lambda n: bring_deadline_forward(n, deadline))
        )
        stamped = annotated_deadline(written) or deadline
        # Every pod left by then is deleted, PDBs or not: worth a Warning on the node.
        await self._record([events.termination_grace_period_expiring(written or node, stamped)])
        return stamped

    def _grace_deadline(
        self, node: Json, request: BeginTerminationRequest, pool: Json | None, since: datetime | None = None
    ) -> datetime | None:
        """Deletion time (or `since`, when later) + terminationGracePeriod (the request's, else the
        NodePool's, as the planner and the guards read it: api.nodepool_reader); None without one."""
        grace = request.termination_grace_period
        pool_name = (node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL)
        if grace is None and pool_name:
            grace = self._pool_grace(node["metadata"]["name"], pool_name, pool)
        if grace is None:
            return None
        deleted = parse_time(node["metadata"].get("deletionTimestamp")) or datetime.now(UTC)
        return max(deleted, since) + grace if since is not None else deleted + grace

    def _pool_grace(self, node: str, pool_name: str, raw: Json | None) -> timedelta | None:
        """The NodePool's terminationGracePeriod for karpflow (karpflow.dev/termination-grace-period,
        else the template's), read as the planner reads it (api.nodepool_reader). An invalid
        value reads as none, never as a deadline in the past: the drain keeps waiting for PDBs and
        do-not-disrupt, and the reason is logged. A deleted NodePool (`raw` None) must not block the
        termination of its nodes either: no deadline then."""
        if raw is None:
            log.warning(
                "node %s: NodePool %s not found; draining without a terminationGracePeriod", node, pool_name
            )
            return None
        try:
            pool = self._read_nodepool(pool_name, raw)  # logs the pool's invalid settings
        except errors.ApplicationError as err:
            log.warning("node %s: %s; draining without a terminationGracePeriod", node, err)
            return None
        return pool_termination_grace_period(pool)

    @activity.defn(name="termination_gate")
    async def termination_gate(self, request: TerminationGateRequest) -> TerminationGate:
        """Whether a termination may take its node down now, before its taint and drain. A node its
        command already holds (tainted under that command) was checked when the command tainted it;
        interruption and NodePool deletion are never held back. Otherwise a MaintenanceWindow that
        blocks the termination's action holds it, so do the controller's pauses and rate budgets
        (activities/controls_gate.py `hold`: unreadable, they hold it too), and a `kubectl delete
        node` (and any reason that claims budgets: activities/guards.py `claims_budgets`) needs a
        NodeDisruptionBudget claim.
        When it must wait, the node gets an Event saying for what; the workflow asks again later.

        When it says go to a termination that asks (`stamp_deadline`), the drain may begin: its clock
        starts now. The deadline is stamped then, now + terminationGracePeriod, or an annotation
        already on the node, or the request's hard deadline, whichever is earliest: a wait here never
        spends the drain's grace period, and nobody's deadline is postponed (issue 30)."""
        gate, node = await self._gate(request)
        if not (gate.go and request.stamp_deadline and node is not None):
            return gate
        name = request.node
        timing = BeginTerminationRequest(
            node=name,
            uid=request.uid,
            reason=request.reason,
            termination_grace_period=request.termination_grace_period,
            deadline=request.deadline,
        )
        try:
            pool_name = (node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL)
            pool = await self._nodepool_or_none(pool_name) if pool_name else None
            deadline = await self._deadline(node, timing, pool, since=datetime.now(UTC))
        except Exception as err:
            raise classify_kube(err, f"stamping the drain deadline of node {name}") from None
        return gate.model_copy(update={"deadline": deadline})

    async def _nodepool_or_none(self, name: str) -> Json | None:
        return await self.reads.nodepool(name)  # the worker's cache, else the server

    async def _gate(self, request: TerminationGateRequest) -> tuple[TerminationGate, Json | None]:
        """termination_gate's answer, with the node it read (None when it is gone)."""
        name = request.node
        try:
            # Polled for as long as the controls hold the node: from the worker's cache, the server
            # saying "gone" (a cache that lags must not let a termination through its gate).
            node = await self.reads.node(name) or await self.kube.find_node(name)
            if node is None or another_node(node, request.uid) is not None:
                return TerminationGate(go=True, message="the node is gone"), None
            holder = (node["metadata"].get("annotations") or {}).get(guards.OWNER_ANNOTATION)
            if has_taint(node, self.taint_key) and holder:
                # Held by a command (ours, or the one that started this termination): it passed the
                # controls when it tainted; or by this termination itself before a continue-as-new.
                return TerminationGate(go=True, message=f"held by {holder}"), node
            found = await guards.windows(self.kube, self.reads)
            now = datetime.now(UTC)
            action = guards.window_action(request.reason, request.holder, node)
            block = blocked(found, action, node["metadata"].get("labels") or {}, now) if action else None
            if block is not None:
                await events.recorder_for(self.kube).record(
                    events.disruption_waiting_window(
                        node, ", ".join(block.windows), block.action, block.ends()
                    )
                )
                gate = TerminationGate(
                    go=False,
                    waiting_for=f"MaintenanceWindow {', '.join(block.windows)}",
                    message=block.message(),
                )
                return gate, node
            if self.controls is not None and (
                held := await self.controls.hold(self.kube, request.reason, request.holder, node, now)
            ):
                return TerminationGate(go=False, waiting_for=held[0], message=held[1]), node
            if not guards.claims_budgets(request.reason, node):
                return TerminationGate(go=True), node
            denied = await budget_claims.claim(
                self.kube, [node], request.holder, request.reason, now, reads=self.reads
            )
        except Exception as err:
            raise classify_kube(err, f"checking the controls for the termination of node {name}") from None
        if denied is None:
            return TerminationGate(go=True), node
        await events.recorder_for(self.kube).record(
            events.disruption_waiting_ndb(node, denied.budget, denied.unavailable, denied.allowed)
        )
        gate = TerminationGate(
            go=False, waiting_for=f"NodeDisruptionBudget {denied.budget}", message=denied.message
        )
        return gate, node

    @activity.defn(name="taint_for_termination")
    async def taint_for_termination(self, node: str | NodeRef) -> None:
        """The disrupted taint and the exclude-from-external-load-balancers label, so nothing new lands and
        load balancers deregister the node while it drains. Only on the pinned node (a plain name, as
        workflows started before pinning send it, pins nothing). A node no command holds gets the
        termination as its holder, with its reason, so everyone (the invariant checker too) can tell a
        `kubectl delete node` from an interruption."""
        ref = node if isinstance(node, NodeRef) else NodeRef(node=node)

        def mutate(n: Json) -> bool:
            changed = add_taint(n, dict(self.disrupted_taint))
            annotations = n.setdefault("metadata", {}).setdefault("annotations", {}) or {}
            n["metadata"]["annotations"] = annotations
            if ref.holder and not annotations.get(guards.OWNER_ANNOTATION):
                annotations[guards.OWNER_ANNOTATION] = ref.holder
                if ref.reason:
                    annotations[HOLDER_REASON_ANNOTATION] = ref.reason
                changed = True
            return set_labels(n, {EXCLUDE_LB_LABEL: "karpenter"}) or changed

        try:
            # On the cached version: a 409, or "nothing to change" on it, reads the server's.
            current = await self.reads.node(ref.node)
            await self.kube.update_node(ref.node, pinned(ref.uid, mutate), current=current)
        except Exception as err:
            if not_found(err):
                return  # the node is gone: nothing left to do
            raise classify_kube(err, f"tainting node {ref.node} for termination") from None

    @activity.defn(name="drain_node")
    async def drain_node(self, request: DrainRequest) -> DrainResult:
        """Evict the node's pods tier by tier until none is left to wait for. Heartbeats its progress
        every few seconds, even inside a long pass of evictions, and a retry after a crash resumes
        from the last heartbeat's counters (the pods themselves are looked at afresh)."""
        started = time.monotonic()
        previous = activity.info().heartbeat_details if activity.in_activity() else ()
        drainer = Drainer(
            self.kube,
            request.node,
            request.deadline,
            self._interval(request.poll_interval_seconds),
            on_progress=lambda progress: heartbeat(progress.details()),
            resumed=resumed_progress(previous[0]) if previous else None,
            check=lambda: self._drain_check(request.node, request.uid),
            reason=request.reason,
            taint=disruption_taint(self.taint_key),
            reads=self.reads,
        )

        async def keep_beating() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_EVERY)
                heartbeat(drainer.progress.details())

        beating = asyncio.create_task(keep_beating())
        try:
            progress: DrainProgress = await drainer.run()
        except errors.ApplicationError:
            raise
        except Exception as err:
            raise classify_kube(err, f"draining node {request.node}") from None
        finally:
            beating.cancel()
        return DrainResult(
            evicted=progress.evicted,
            deleted=progress.deleted,
            seconds=time.monotonic() - started,
            message=progress.stopped,
        )

    async def _replaced(self, name: str, uid: str | None) -> str | None:
        """Why the node of this name is not the pinned one any more (None while it is, or is gone),
        from the worker's cache (a name reused within a watch's delay is seen on the next poll)."""
        return another_node(await self.reads.node(name), uid)

    async def _drain_check(self, name: str, uid: str | None) -> tuple[str | None, datetime | None]:
        """For the drain, each pass: whether the name is another node's now, and the node's
        termination deadline as annotated (it may have been brought forward since the drain began),
        from the worker's cache."""
        node = await self.reads.node(name)
        if (why := another_node(node, uid)) is not None:
            return why, None
        return None, annotated_deadline(node)

    @activity.defn(name="await_volumes_detached")
    async def await_volumes_detached(self, request: VolumeRequest) -> bool:
        """Wait until no VolumeAttachment of a drained pod remains on the node; False if the deadline
        passed first (the instance is terminated anyway then). Attachments of pods that are not drained
        (tolerating the taint, mirror, stuck terminating) and inline volumes are not waited for.
        With `wait` False: one look, True when nothing is attached (the termination's local activity)."""
        interval = self._interval(request.poll_interval_seconds)
        volumes: dict[tuple[str, str], str | None] = {}  # a bound claim's volume does not change

        async def detached() -> bool:
            if request.uid and await self._replaced(request.node, request.uid) is not None:
                return True  # the pinned node is gone: the attachments on this name are another's
            remaining = await self._blocking_attachments(request.node, volumes)
            if not remaining:
                # The cache says detached: the server's word before the instance goes.
                remaining = await self._blocking_attachments(request.node, volumes, fresh=True)
            heartbeat({"node": request.node, "attached": remaining[:10]})
            return not remaining

        try:
            if not request.wait:
                return await detached()
            return await wait_until(detached, interval, request.deadline)
        except errors.ApplicationError:
            raise
        except Exception as err:
            raise classify_kube(err, f"waiting for volumes of node {request.node} to detach") from None

    async def _blocking_attachments(
        self, node: str, volumes: dict[tuple[str, str], str | None] | None = None, fresh: bool = False
    ) -> list[str]:
        """The volumes still attached to the node that a drained pod used (from the worker's cache;
        `fresh`: from the API server). A claim's volume is read once per wait (`volumes`): the
        binding of a claim never changes, and a GET per claim per poll is what the cache saves."""
        volumes = {} if volumes is None else volumes
        # No storage.k8s.io on this API server: nothing can be attached (cluster/reads.py).
        attachments = await self.reads.volume_attachments_on(node, fresh=fresh)
        if not attachments:
            return []
        now = datetime.now(UTC)
        ignored: set[str] = set()
        for pod in (Pod(raw) for raw in await self.reads.pods_on_node(node, fresh=fresh)):
            if pod.waited_for(now, disruption_taint(self.taint_key)):
                continue
            for claim in pod.claims():
                if (pod.namespace, claim) not in volumes:
                    pvc = await self.kube.pvc(pod.namespace, claim)
                    bound = ((pvc or {}).get("spec") or {}).get("volumeName")
                    if not bound:
                        continue  # not bound yet: asked again next time
                    volumes[(pod.namespace, claim)] = bound
                volume = volumes[(pod.namespace, claim)]
                if volume:
                    ignored.add(volume)
        blocking = []
        for va in attachments:
            volume = ((va.get("spec") or {}).get("source") or {}).get("persistentVolumeName")
            if volume and volume not in ignored:
                blocking.append(volume)
        return blocking

    @activity.defn(name="remove_finalizer")
    async def remove_finalizer(self, node: str | NodeRef) -> None:
        """The last step: once the finalizer is gone the API server removes the node. Only the pinned
        node's: another node that reuses the name keeps its finalizer."""
        ref = node if isinstance(node, NodeRef) else NodeRef(node=node)
        released: list[Json] = []

        def mutate(n: Json) -> bool:
            released.clear()
            if drop_finalizer(n):
                released.append(n)
                return True
            return False

        try:
            current = await self.reads.node(ref.node)  # a 409, or nothing to change, reads the server's
            await self.kube.update_node(ref.node, pinned(ref.uid, mutate), current=current)
        except Exception as err:
            if not not_found(err):  # gone already: nothing left to do but the claims
                raise classify_kube(err, f"removing the finalizer of node {ref.node}") from None
        else:
            if released:  # counted by the call that removed it: a retry finds it gone
                meta = released[0]["metadata"]
                pool = (meta.get("labels") or {}).get(NODEPOOL_LABEL, "")
                metrics.NODES_TERMINATED.labels(nodepool=pool).inc()
                deleted = parse_time(meta.get("deletionTimestamp"))
                if deleted is not None:
                    seconds = (datetime.now(UTC) - deleted).total_seconds()
                    metrics.NODES_TERMINATION_DURATION.labels(nodepool=pool).observe(max(seconds, 0.0))
        # The node is going: its NodeDisruptionBudget claims make room for the next one. The budgets
        # holding them are found in the cache: the claims were written before the drain began.
        await self._release_claims(nodes=[ref.node], uid=ref.uid, cached=True)
