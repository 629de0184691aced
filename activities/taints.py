"""A command's taint on its candidates: `taint_disrupted` (the guards at the moment of acting, the
operator's controls, NodeDisruptionBudget claims, then the taint as a read-modify-write that
re-checks the holder) and `untaint_disrupted` (a rollback undoes only its own taints).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from temporalio import activity

from activities import budget_claims, guards
from activities.buffer_guard import capacity_buffers_grown
from activities.errors import classify_kube, not_found
from activities.kubernetes_base import KubernetesBase
from activities.node_json import (
    add_taint,
    another_node,
    bring_deadline_forward,
    has_taint,
    remove_taint,
    uid_of,
)
from api.activity_io import CandidateNode, TaintRequest, UntaintRequest
from api.capacity_buffer import CAPACITY_BUFFER_GROUP, CAPACITY_BUFFER_PLURAL, CAPACITY_BUFFER_VERSION
from api.constants import HOLDER_REASON_ANNOTATION, NODEPOOL_LABEL, REASON_EMPTY
from api.workflow_ids import termination_workflow_id
from api.workflow_io import VOLUNTARY_REASONS
from kube import events
from kube.client import Json
from kube.pods import node_do_not_disrupt_reason

log = logging.getLogger(__name__)


class _Refused(Exception):
    """Raised inside a read-modify-write to stop without writing."""


class TaintActivities(KubernetesBase):
    """The command's claim on its candidates: the guards and controls, the disrupted taint, and
    its rollback."""

    @activity.defn(name="taint_disrupted")
    async def taint_disrupted(self, request: TaintRequest) -> list[CandidateNode]:
        """Taint each candidate `karpenter.sh/disrupted:NoSchedule` and record the command that holds it.
        First every candidate passes the guards (activities/guards.py: managed; for voluntary reasons
        do-not-disrupt and no other holder; do-not-repair for repair), then the operator's controls:
        no MaintenanceWindow may block the command's action on a candidate now, and the candidates'
        NodeDisruptionBudgets must have room, which is claimed in their status for this command
        (activities/budget_claims.py). One refusal refuses the command, before any change to a node. A
        candidate that is missing or already being deleted is reported (ok=False), not raised: the
        workflow decides whether that aborts. So is one that another command claimed between the
        guards and the taint: the claim is a read-modify-write with a resourceVersion precondition
        that re-checks the holder on the version it replaces (`_taint_candidate`)."""
        try:
            guarded = await asyncio.gather(*(self._guard_candidate(name, request) for name in request.nodes))
            taking = [node for why, node in guarded if why is None and node is not None]
            await self._check_controls(request, taking)
        except guards.Refused as err:
            raise guards.refusal(err) from None
        results = list(
            await asyncio.gather(
                *(
                    self._taint_candidate(n, request, node)
                    if why is None
                    else asyncio.sleep(0, CandidateNode(node=n, ok=False, message=why))
                    for n, (why, node) in zip(request.nodes, guarded, strict=True)
                )
            )
        )
        left_out = [r.node for r in results if not r.ok]
        if left_out and request.command_id:
            await self._release_claims(holder=request.command_id, nodes=left_out)
        return results

    async def _check_controls(self, request: TaintRequest, taking: list[Json]) -> None:
        """MaintenanceWindows, the controller's pauses, rate budgets and NodeDisruptionBudgets at the
        moment of acting (activities/controls_gate.py): the planner checked them on its cache, but a
        command may be started by hand or by the interruption poller, approved hours later, or a
        window may have opened since. Pauses or starts that cannot be read fail closed (retryable)."""
        if not taking:
            return
        now = datetime.now(UTC)
        try:
            # From the worker's cache (DESIGN.md "Reads from the cache"): a window created within one
            # watch delay of this taint is seen by the next command's.
            found = await guards.windows(self.kube, self.reads)
        except Exception as err:
            raise classify_kube(err, "reading MaintenanceWindows") from None
        why = guards.window_refusal(found, taking, request.reason, request.command_id, now)
        if why is None and self.controls is not None:
            why = await self.controls.refusal(self.kube, request.reason, request.command_id, taking, now)
        if why is not None:
            raise guards.Refused(f"{why}: no {request.reason} disruption now")
        claiming = [node for node in taking if guards.claims_budgets(request.reason, node)]
        if not claiming:
            return
        try:
            denied = await budget_claims.claim(
                self.kube, claiming, request.command_id, request.reason, reads=self.reads
            )
        except Exception as err:
            raise classify_kube(err, "claiming NodeDisruptionBudgets") from None
        if denied is not None:
            raise guards.Refused(f"{denied.message}: no {request.reason} disruption now")

    async def _guard_candidate(self, name: str, request: TaintRequest) -> tuple[str | None, Json | None]:
        """Raise Refused to refuse the command; return why this one candidate is left out (an
        emptiness candidate that is not empty any more), or None to taint it, with the node when the
        command will take it (not for one missing, deleting or another node of the name: the taint
        reports those)."""
        try:
            # From the worker's cache (one the cache lacks, from the server): the taint is written on
            # this version, and `claim` checks the holder again on whatever version it replaces.
            node = await self.reads.node(name) or await self.kube.find_node(name)
            if node is None or node["metadata"].get("deletionTimestamp"):
                return None, None  # reported by the taint below
            if another_node(node, request.uids.get(name)) is not None:
                return (
                    None,
                    None,
                )  # not the node the command is for: reported by the taint below, never touched
            pool = await guards.check_managed(
                self.kube, node, request.reason, self.ownership, self.cluster, self.reads
            )
            pods = await self.kube.pods_on_node(name) if request.reason in VOLUNTARY_REASONS else []
        except guards.Refused:
            raise
        except Exception as err:
            raise classify_kube(err, f"checking node {name}") from None
        grace = guards.raw_termination_grace_period(pool)
        guards.check_voluntary(
            node, pods, request.reason, request.command_id, datetime.now(UTC), grace, self.taint_key
        )
        guards.check_repair(node, request.reason)
        # (A retry finds its own taint: nothing could land since.)
        if request.reason == REASON_EMPTY and not has_taint(node, self.taint_key):
            why = guards.no_longer_empty(node, pods) or await self._buffers_grown(request)
            return why, (node if why is None else None)
        return None, node

    async def _taint_candidate(self, name: str, request: TaintRequest, current: Json | None) -> CandidateNode:
        """`current`: the node as the guards read it, written on its resourceVersion (a 409 reads
        the server's copy and claims again)."""
        voluntary = request.reason in VOLUNTARY_REASONS
        took_over: list[str] = []

        def claim(node: Json) -> bool:
            # Runs on the version the write replaces (update_node sends its resourceVersion, and a
            # conflict re-reads and runs this again): whatever claimed the node since the guards ran
            # is seen here, so two commands can never both hold it.
            meta = node["metadata"]
            if (why := another_node(node, request.uids.get(name))) is not None:
                raise _Refused(why)
            if meta.get("deletionTimestamp") and voluntary:
                raise _Refused("node is already being deleted")
            # A forceful command takes a deleting node too: its termination goes on (the same id is
            # started, or found running), and the command's deadline shortens it.
            annotations = meta.setdefault("annotations", {})
            holder = guards.other_holder(node, request.command_id, self.taint_key)
            took_over.clear()
            if holder is not None:
                if voluntary:  # one command at a time; a retried step never takes a node back
                    raise _Refused(f"node {name} is already held by {holder}: one command at a time")
                took_over.append(holder)  # forceful: the node goes whatever; this command drives it now
            if voluntary and (why := node_do_not_disrupt_reason(annotations)) is not None:
                raise _Refused(f"node {name} is annotated {why}: no voluntary disruption ({request.reason})")
            changed = add_taint(node, dict(self.disrupted_taint))
            if request.command_id and annotations.get(guards.OWNER_ANNOTATION) != request.command_id:
                annotations[guards.OWNER_ANNOTATION] = request.command_id
                changed = True
            if request.reason and annotations.get(HOLDER_REASON_ANNOTATION) != request.reason:
                annotations[HOLDER_REASON_ANNOTATION] = request.reason  # the invariant checker reads it
                changed = True
            if not voluntary and request.deadline is not None:
                changed |= bring_deadline_forward(node, request.deadline)
            return changed

        try:
            node = await self.kube.update_node(name, claim, current=current)
        except _Refused as err:
            return CandidateNode(node=name, ok=False, message=str(err))
        except Exception as err:
            if not_found(err):
                return CandidateNode(node=name, ok=False, message="node not found")
            raise classify_kube(err, f"tainting node {name}") from None
        if request.reason == REASON_EMPTY and (why := await self._landed_since(name, node)) is not None:
            # A pod bound between the guard's look and the taint: leave this node out, as the guard
            # would have (the taint stops any later one).
            await self.untaint_disrupted(
                UntaintRequest(nodes=[name], command_id=request.command_id, uids=request.uids)
            )
            return CandidateNode(node=name, ok=False, message=why)
        message = ""
        if took_over:
            message = f"took over from {took_over[0]}"
            log.warning("node %s: %s %s", name, request.command_id, message)
        uid = uid_of(node) or ""
        return CandidateNode(
            node=name,
            ok=True,
            uid=uid or None,
            provider_id=(node.get("spec") or {}).get("providerID"),
            nodepool=(node["metadata"].get("labels") or {}).get(NODEPOOL_LABEL),
            termination_id=termination_workflow_id(self.cluster, name, uid) if uid else None,
            message=message,
        )

    async def _buffers_grown(self, request: TaintRequest) -> str | None:
        """An emptiness command's CapacityBuffers re-checked (activities/buffer_guard.py): None when
        the request carries none to check."""
        if request.capacity_buffers is None:
            return None
        try:
            buffers = await self.kube.list_cluster_custom(
                CAPACITY_BUFFER_GROUP, CAPACITY_BUFFER_VERSION, CAPACITY_BUFFER_PLURAL
            )
        except Exception as err:
            raise classify_kube(err, "listing CapacityBuffers") from None
        return capacity_buffers_grown(request.capacity_buffers, buffers)

    async def _landed_since(self, name: str, node: Json) -> str | None:
        try:
            pods = await self.kube.pods_on_node(name)
        except Exception as err:
            raise classify_kube(err, f"listing the pods of node {name}") from None
        return guards.no_longer_empty(node, pods)

    @activity.defn(name="untaint_disrupted")
    async def untaint_disrupted(self, request: UntaintRequest) -> list[str]:
        """Remove the disrupted taint; nodes already being deleted keep it (their termination owns them),
        and so do nodes another command holds (a rollback undoes only its own taints; the holder is
        read on the version the write replaces). Returns the nodes released."""

        refs: dict[str, events.ObjectRef] = {}

        async def untaint(name: str) -> str | None:
            released = False  # untainted now, or was not tainted: no claim of this command left on it

            def mutate(node: Json) -> bool:
                nonlocal released
                released = False
                refs[name] = events.ObjectRef.of(node, "Node", "v1")
                if another_node(node, request.uids.get(name)) is not None:
                    return False  # the pinned node is gone: nothing of this command's is on this one
                if (node.get("metadata") or {}).get("deletionTimestamp"):
                    return False
                if (
                    request.command_id
                    and guards.other_holder(node, request.command_id, self.taint_key) is not None
                ):
                    return False
                released = True
                annotations = node["metadata"].get("annotations") or {}
                dropped = annotations.pop(guards.OWNER_ANNOTATION, None) is not None
                dropped |= annotations.pop(HOLDER_REASON_ANNOTATION, None) is not None
                return remove_taint(node, self.taint_key, "NoSchedule") or dropped

            try:
                await self.kube.update_node(name, mutate)
            except Exception as err:
                if not_found(err):
                    return None
                raise classify_kube(err, f"untainting node {name}") from None
            return name if released else None

        released = [name for name in await asyncio.gather(*(untaint(n) for n in request.nodes)) if name]
        if request.rolled_back:
            command = request.command_id.partition("@")[0] or "command"
            await self._record(
                [
                    events.disruption_rolled_back(refs[n], command, request.rolled_back)
                    for n in released
                    if n in refs
                ]
            )
        if released and request.command_id:
            # The command gives its NodeDisruptionBudget claims back with its taints.
            await self._release_claims(holder=request.command_id, nodes=released)
        return released
