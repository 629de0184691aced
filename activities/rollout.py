"""The RolloutWorkflow's activities: mark the nodes a rollout replaces, read which are still there,
take the marks off when it is cancelled.

The mark (`karpflow.dev/rollout-requested: <rollout id>`) is karpflow's own annotation; the planner
treats a marked node as drifted (planner/drift.py), so the controller replaces it within budgets,
windows, NodeDisruptionBudgets, pauses and approval, as it does drift. Every step names nodes by UID:
a node that reuses a name is another node and is never marked, counted or unmarked for this rollout.
All three are idempotent: a retry finds the marks it made and changes nothing more.
"""

from __future__ import annotations

import logging

from temporalio import activity

from activities.errors import REFUSED, classify_kube, not_found, permanent
from api.constants import (
    AWS_GROUP,
    AWS_VERSION,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOL_LABEL,
    ROLLOUT_ANNOTATION,
    ZONE_LABEL,
)
from api.event_reasons import Reason
from api.hashes import rollout_target
from api.nodepool import EC2NodeClass
from api.nodepool_reader import read_nodepool
from api.rollout_io import (
    MarkRequest,
    MarkWaveRequest,
    RemainingRequest,
    RolloutNode,
    StateAnswer,
    StateRequest,
    UnmarkRequest,
)
from api.rollout_policy import ROLLOUT_STATE_ANNOTATION, RolloutState, parse_state
from kube import events
from kube.client import Json, KubeApi
from kube.times import parse_time

log = logging.getLogger(__name__)
# The Event recorded on the NodePool when a rollout's phase changes (sync_rollout_state `event`).
_PHASE_EVENTS: dict[str, Reason] = {
    "Rolling": Reason.ROLLOUT_WAVE_STARTED,
    "Halted": Reason.ROLLOUT_HALTED,
    "Succeeded": Reason.ROLLOUT_SUCCEEDED,
    "Aborted": Reason.ROLLOUT_ABORTED,
}


def _selector(nodepool: str, selector: dict[str, str]) -> str:
    return ",".join([f"{NODEPOOL_LABEL}={nodepool}", *(f"{k}={v}" for k, v in sorted(selector.items()))])


def _uid(node: Json) -> str:
    return str(node["metadata"].get("uid") or "")


def _node_of(node: Json) -> RolloutNode:
    metadata = node["metadata"]
    zone = str((metadata.get("labels") or {}).get(ZONE_LABEL) or "")
    return RolloutNode(name=metadata["name"], uid=_uid(node), zone=zone)


def _annotations(node: Json) -> dict[str, str]:
    metadata = node.setdefault("metadata", {})
    annotations: dict[str, str] = metadata.get("annotations") or {}
    metadata["annotations"] = annotations
    return annotations


class RolloutActivities:
    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube

    async def _pool_nodes(self, nodepool: str, selector: dict[str, str] | None = None) -> list[Json]:
        try:
            listed = await self.kube.list_nodes(_selector(nodepool, selector or {}))
        except Exception as err:
            raise classify_kube(err, f"nodes of NodePool {nodepool}") from None
        return list(listed.get("items") or [])

    async def _set_mark(self, node: RolloutNode, rollout_id: str, present: bool) -> bool | None:
        """Write (or, `present=False`, remove) this rollout's mark on that node incarnation only;
        whether it changed the node, None when that incarnation is gone (replaced, deleted by hand,
        or its name now another node's)."""
        changed: list[bool] = []
        gone = False

        def mutate(found: Json) -> bool:
            changed[:] = [_change(found)]
            return changed[0]

        def _change(found: Json) -> bool:
            nonlocal gone
            if _uid(found) != node.uid:
                gone = True  # the name is another node's now
                return False
            annotations = _annotations(found)
            current = annotations.get(ROLLOUT_ANNOTATION)
            if present:
                # Another rollout's mark already asks for the replacement: leave it to that one.
                if current:
                    return False
                annotations[ROLLOUT_ANNOTATION] = rollout_id
                return True
            if current != rollout_id:
                return False
            del annotations[ROLLOUT_ANNOTATION]
            return True

        try:
            await self.kube.update_node(node.name, mutate)
            return None if gone else bool(changed and changed[0])
        except Exception as err:
            if not_found(err):
                return None  # gone already: replaced, or deleted by hand
            raise classify_kube(err, f"node {node.name}") from None

    @activity.defn(name="mark_rollout_nodes")
    async def mark_rollout_nodes(self, request: MarkRequest) -> list[RolloutNode]:
        """The NodePool's nodes (matching the selector) created before the request, each marked for
        replacement. Refuses, before marking anything, a NodePool that does not exist."""
        try:
            await self.kube.get_cluster_custom(
                KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", request.nodepool
            )
        except Exception as err:
            if not_found(err):
                raise permanent(
                    f"rollout of NodePool {request.nodepool}: no such NodePool; nothing marked", REFUSED
                ) from None
            raise classify_kube(err, f"NodePool {request.nodepool}") from None
        chosen: list[RolloutNode] = []
        for node in await self._pool_nodes(request.nodepool, request.selector):
            metadata = node["metadata"]
            created = parse_time(metadata.get("creationTimestamp"))
            # Nodes already being deleted are leaving anyway; nodes created since the request are
            # what the rollout launches (or someone else did): neither is the rollout's to replace.
            if metadata.get("deletionTimestamp") or created is None or created >= request.requested_at:
                continue
            chosen.append(_node_of(node))
        chosen.sort(key=lambda n: n.name)
        if not request.mark:
            return chosen  # waves: the workflow marks them wave by wave (mark_rollout_wave)
        for marked in chosen:
            await self._set_mark(marked, request.rollout_id, present=True)
            activity.heartbeat(marked.name)
        return chosen

    @activity.defn(name="rollout_remaining")
    async def rollout_remaining(self, request: RemainingRequest) -> list[RolloutNode]:
        """Which of the rollout's nodes still exist (by UID). A remaining node whose mark was taken
        off by hand is marked again: the rollout ends only when its nodes are replaced (cancel it to
        stop)."""
        wanted = {n.uid: n for n in request.nodes}
        remaining: list[RolloutNode] = []
        for node in await self._pool_nodes(request.nodepool):
            uid = _uid(node)
            if uid not in wanted:
                continue
            remaining.append(wanted[uid])
            if request.remark is not None and uid not in request.remark:
                continue  # waves: only the wave in progress is meant to carry the mark
            if not node["metadata"].get("deletionTimestamp") and not _annotations(node).get(
                ROLLOUT_ANNOTATION
            ):
                await self._set_mark(wanted[uid], request.rollout_id, present=True)
        return sorted(remaining, key=lambda n: n.name)

    @activity.defn(name="unmark_rollout_nodes")
    async def unmark_rollout_nodes(self, request: UnmarkRequest) -> int:
        """Take this rollout's mark off the given nodes (a mark another rollout wrote stays).
        Returns how many nodes changed."""
        changed = 0
        nodes = request.nodes
        if nodes is None:
            nodes = [
                RolloutNode(name=n["metadata"]["name"], uid=_uid(n))
                for n in await self._pool_nodes(request.nodepool)
                if _annotations(n).get(ROLLOUT_ANNOTATION) == request.rollout_id
            ]
        for node in nodes:
            changed += bool(await self._set_mark(node, request.rollout_id, present=False))
            activity.heartbeat(node.name)
        return changed

    @activity.defn(name="mark_rollout_wave")
    async def mark_rollout_wave(self, request: MarkWaveRequest) -> list[RolloutNode]:
        """Mark one wave's nodes (by UID) for replacement; returns those of them still present. A node
        another rollout marked already is counted in: its replacement comes all the same."""
        present: list[RolloutNode] = []
        for node in request.nodes:
            if await self._set_mark(node, request.rollout_id, present=True) is None:
                continue  # gone (replaced or deleted by hand): nothing to mark
            present.append(node)
            activity.heartbeat(node.name)
        return present

    async def _target(self, nodepool: str) -> tuple[Json, str]:
        """The NodePool as stored and its rollout target now (api/hashes.py rollout_target)."""
        try:
            raw = await self.kube.get_cluster_custom(
                KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", nodepool
            )
        except Exception as err:
            if not_found(err):
                raise permanent(f"NodePool {nodepool} is gone", REFUSED) from None
            raise classify_kube(err, f"NodePool {nodepool}") from None
        pool, _ = read_nodepool(raw)
        nodeclass = None
        ref = pool.spec.template.spec.node_class_ref
        if ref is not None:
            try:
                found = await self.kube.get_cluster_custom(AWS_GROUP, AWS_VERSION, "ec2nodeclasses", ref.name)
                nodeclass = EC2NodeClass.model_validate(found)
            except Exception as err:
                if not not_found(err):
                    raise classify_kube(err, f"EC2NodeClass {ref.name}") from None
        return raw, rollout_target(pool, nodeclass)

    @activity.defn(name="sync_rollout_state")
    async def sync_rollout_state(self, request: StateRequest) -> StateAnswer:
        """Write the pool's `karpflow.dev/rollout-state` (what the planner holds drift by) and record an
        Event for a new phase. A rollout whose target the pool has left writes nothing: it is
        superseded (the newer target's rollout owns the state). Idempotent: the same state is not
        written twice, and the Event recorder drops a repeat."""
        raw, target = await self._target(request.nodepool)
        if request.target and target != request.target:
            return StateAnswer(target=target, superseded=True)
        written = False
        if request.target:
            metadata = raw.get("metadata") or {}
            current = parse_state((metadata.get("annotations") or {}).get(ROLLOUT_STATE_ANNOTATION))
            if current is not None and current.rollout_id != request.rollout_id and current.target == target:
                # Another rollout of the same target owns it (two controllers' starts): leave it.
                return StateAnswer(target=target)
            state = RolloutState.model_validate(
                {
                    "id": request.rollout_id,
                    "target": request.target,
                    "phase": request.phase,
                    "wave": request.wave,
                    "reason": request.reason[:500],
                }
            )
            if current is None or current.annotation() != state.annotation():
                # An update with the resourceVersion read (karpflow may update NodePools, for its
                # finalizer: deploy/base/rbac.yaml): a 409 means the pool moved on, and the retry reads
                # it again, target included.
                metadata.setdefault("annotations", {})[ROLLOUT_STATE_ANNOTATION] = state.annotation()
                try:
                    await self.kube.request(
                        "PUT",
                        f"/apis/{KARPENTER_GROUP}/{KARPENTER_VERSION}/nodepools/{request.nodepool}",
                        body=raw,
                    )
                except Exception as err:
                    raise classify_kube(err, f"NodePool {request.nodepool}") from None
                written = True
        reason = _PHASE_EVENTS.get(request.phase)
        if request.event and reason is not None:
            text = f"rollout {request.rollout_id}" + (f" wave {request.wave}" if request.wave else "")
            text += f": {request.phase}" + (f": {request.reason}" if request.reason else "")
            ref = events.ObjectRef.of(raw, "NodePool", f"{KARPENTER_GROUP}/{KARPENTER_VERSION}")
            outcome = await events.recorder_for(self.kube).record(events.Event(ref, reason, text[:1024]))
            log.info("rollout %s: %s Event %s", request.rollout_id, request.phase, outcome)
        return StateAnswer(target=target, written=written)
