"""Kubernetes activities: taints, registration and initialization of replacements, termination steps.

Every activity is idempotent (a retry after a crash finds the work done and returns), raises
`ApplicationError`s classified by `activities.errors`, and long waits heartbeat their progress so a
dead worker is noticed within the heartbeat timeout and the wait resumes elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from temporalio import activity

from activities import budget_claims, errors, guards
from activities.controls_gate import ControlsGate
from activities.drain import Drainer, DrainProgress, resumed_progress, wait_until
from activities.errors import classify_kube, not_found, permanent
from activities.nodeclaims import KarpenterHandover
from api.activity_io import (
    AmiChoice,
    BeginTerminationRequest,
    CandidateNode,
    DiscardRequest,
    DrainRequest,
    DrainResult,
    InitializationRequest,
    LaunchedInstance,
    LaunchTemplate,
    NodeInfo,
    NodeRef,
    RegisteredNode,
    RegistrationRequest,
    ResolveRequest,
    TaintRequest,
    TerminationGate,
    TerminationGateRequest,
    UntaintRequest,
    VolumeRequest,
)
from api.constants import (
    ARCH_LABEL,
    AWS_GROUP,
    AWS_VERSION,
    CAPACITY_TYPE_LABEL,
    DISRUPTION_TAINT_KEYS,
    DO_NOT_SYNC_TAINTS_LABEL,
    EC2NODECLASS_LABEL,
    EXCLUDE_LB_LABEL,
    HOLDER_ANNOTATION,
    HOLDER_REASON_ANNOTATION,
    INITIALIZED_LABEL,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    KNOWN_EPHEMERAL_TAINT_KEYS,
    NODEPOOL_LABEL,
    REASON_EMPTY,
    REASON_MANUAL,
    REGISTERED_LABEL,
    TERMINATION_FINALIZER,
    TERMINATION_TIMESTAMP_ANNOTATION,
    UNREGISTERED_TAINT_KEY,
    disrupted_taint_key,
)
from api.hashes import nodeclass_hash_annotations, nodepool_hash_annotations
from api.nodepool import EC2NodeClass, NodePool
from api.nodepool_reader import pool_termination_grace_period, read_nodepool
from api.workflow_ids import termination_workflow_id
from api.workflow_io import VOLUNTARY_REASONS, TaintSpec
from kube import events
from kube.client import NODES, Json, KubeApi, KubeError
from kube.drain_rules import Pod, disruption_taint
from kube.pods import node_do_not_disrupt_reason
from kube.times import parse_time, rfc3339
from planner.maintenance_windows import blocked
from runtime import metrics

log = logging.getLogger(__name__)

# -- small pure helpers on node JSON -----------------------------------------------------------------


def _taints(node: Json) -> list[Json]:
    return list((node.get("spec") or {}).get("taints") or [])


def has_taint(node: Json, key: str, effect: str | None = None) -> bool:
    return any(t.get("key") == key and (effect is None or t.get("effect") == effect) for t in _taints(node))


def add_taint(node: Json, taint: Json) -> bool:
    if has_taint(node, taint["key"], taint["effect"]):
        return False
    node.setdefault("spec", {})["taints"] = [*_taints(node), taint]
    return True


def remove_taint(node: Json, key: str, effect: str | None = None) -> bool:
    kept = [
        t
        for t in _taints(node)
        if not (t.get("key") == key and (effect is None or t.get("effect") == effect))
    ]
    if len(kept) == len(_taints(node)):
        return False
    node.setdefault("spec", {})["taints"] = kept
    return True


def set_labels(node: Json, labels: dict[str, str]) -> bool:
    current = node.setdefault("metadata", {}).setdefault("labels", {})
    changed = any(current.get(k) != v for k, v in labels.items())
    current.update(labels)
    return changed


def set_annotations(node: Json, annotations: dict[str, str]) -> bool:
    current = node.setdefault("metadata", {}).setdefault("annotations", {})
    changed = any(current.get(k) != v for k, v in annotations.items())
    current.update(annotations)
    return changed


def ensure_finalizer(node: Json) -> bool:
    finalizers = node.setdefault("metadata", {}).setdefault("finalizers", [])
    if TERMINATION_FINALIZER in finalizers:
        return False
    finalizers.append(TERMINATION_FINALIZER)
    return True


def drop_finalizer(node: Json) -> bool:
    finalizers = (node.get("metadata") or {}).get("finalizers") or []
    if TERMINATION_FINALIZER not in finalizers:
        return False
    node["metadata"]["finalizers"] = [f for f in finalizers if f != TERMINATION_FINALIZER]
    return True


def is_ready(node: Json) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or ()
    )


def uid_of(node: Json) -> str | None:
    return (node.get("metadata") or {}).get("uid")


def another_node(node: Json | None, uid: str | None, provider_id: str | None = None) -> str | None:
    """Why `node` is not the node a workflow was pinned to (by UID, and by providerID when both are
    known), or None when it is (or nothing is pinned, or no node has the name)."""
    if node is None:
        return None
    name = node["metadata"]["name"]
    if uid and uid_of(node) != uid:
        return f"node {name} is another node now (uid {uid_of(node)}, not {uid}): the name was reused"
    current = (node.get("spec") or {}).get("providerID")
    if provider_id and current and current != provider_id:
        return f"node {name} is another node now (providerID {current}, not {provider_id})"
    return None


def annotated_deadline(node: Json | None) -> datetime | None:
    """The node's `karpenter.sh/nodeclaim-termination-timestamp` (None when absent or unreadable)."""
    value = ((node or {}).get("metadata", {}).get("annotations") or {}).get(TERMINATION_TIMESTAMP_ANNOTATION)
    try:
        return parse_time(value)
    except ValueError:
        return None


def bring_deadline_forward(node: Json, deadline: datetime) -> bool:
    """Stamp the termination deadline on the node, or move it earlier; never later. Whoever knows
    of an earlier one (a spot interruption's two minutes) shortens a drain already under way: the
    drain re-reads it."""
    existing = annotated_deadline(node)
    if existing is not None and existing <= deadline.astimezone(UTC).replace(microsecond=0):
        return False  # what the annotation holds already comes first (it has one-second resolution)
    return set_annotations(node, {TERMINATION_TIMESTAMP_ANNOTATION: rfc3339(deadline)})


def pinned(uid: str | None, mutate: Callable[[Json], bool]) -> Callable[[Json], bool]:
    """`mutate` for update_node, applied only to the node with `uid` (checked on the very version the
    write replaces); another node of the name is left as it is."""

    def guarded(node: Json) -> bool:
        if another_node(node, uid) is not None:
            return False
        return mutate(node)

    return guarded


def instance_id_of(provider_id: str | None) -> str | None:
    """`aws:///us-west-2a/i-0123` → `i-0123`."""
    if not provider_id or not provider_id.startswith("aws://"):
        return None
    tail = provider_id.rsplit("/", 1)[-1]
    return tail if tail.startswith("i-") else None


def initialization_blockers(node: Json, startup_taints: list[TaintSpec]) -> list[str]:
    """Why the node is not initialized yet (empty: it is). Karpenter §4: Ready, no startup taint and no
    known ephemeral taint left."""
    blockers = [] if is_ready(node) else ["not Ready"]
    for taint in startup_taints:
        if has_taint(node, taint.key, taint.effect):
            blockers.append(f"startup taint {taint.key}:{taint.effect}")
    for key in (*KNOWN_EPHEMERAL_TAINT_KEYS, UNREGISTERED_TAINT_KEY):
        if has_taint(node, key):
            blockers.append(f"taint {key}")
    return blockers


def replacement_leaving(node: Json) -> str | None:
    """Why a replacement's node will not be capacity although it may be Ready (None: it will be):
    it is being deleted, or a disruption holds it (a spot interruption of a node still booting, say).
    A command that counted it would drain its candidates onto a node that is going away."""
    if node["metadata"].get("deletionTimestamp"):
        return "is being deleted"
    for taint in _taints(node):
        if taint.get("key") in DISRUPTION_TAINT_KEYS:
            holder = (node["metadata"].get("annotations") or {}).get(HOLDER_ANNOTATION)
            return f"carries {taint.get('key')}" + (f" (held by {holder})" if holder else "")
    return None


def _merge_taints(*groups: list[Any]) -> list[TaintSpec]:
    merged: dict[tuple[str, str], TaintSpec] = {}
    for group in groups:
        for taint in group:
            spec = (
                taint
                if isinstance(taint, TaintSpec)
                else TaintSpec(key=taint.key, value=taint.value, effect=taint.effect)
            )
            merged[(spec.key, spec.effect)] = spec
    return list(merged.values())


class _Refused(Exception):
    """Raised inside a read-modify-write to stop without writing."""


HEARTBEAT_EVERY = 2.0  # seconds between a drain's heartbeats, whatever it is doing


INSTANCE_CHECK_SECONDS = 30.0
ENDED_INSTANCE_STATES = frozenset({"shutting-down", "terminated"})


def _heartbeat(details: Any) -> None:
    # A local activity has no heartbeat: it is short, and its workflow task is its liveness.
    if activity.in_activity() and not activity.info().is_local:
        activity.heartbeat(details)


# -- the activities ---------------------------------------------------------------------------------


class KubernetesActivities:
    """Activities that act on the Kubernetes API. `poll_interval` paces the waits (seconds)."""

    def __init__(
        self,
        kube: KubeApi,
        poll_interval: float = 1.0,
        *,
        ownership: guards.OwnershipCheck | None = None,
        cluster: str = "",
        karpenter_coexistence: bool = False,
        controls: ControlsGate | None = None,
    ) -> None:
        self.kube = kube
        self.poll_interval = poll_interval
        # The controls outside the cluster (the controller's pauses, the starts rate budgets count),
        # checked at the taint with the windows; None (tests of single steps) checks only the cluster's.
        self.controls = controls
        # How often a wait for a replacement's node asks EC2 whether its instance still runs.
        self.instance_check_seconds = INSTANCE_CHECK_SECONDS
        # Whether this cluster owns an instance (EC2Activities.ownership): the managed-node guard.
        self.ownership = ownership
        self.cluster = cluster
        # Beside Karpenter: karpflow's own taint key, replacements as NodeClaims, and the nodes
        # Karpenter's termination controller acts on handed to it (activities/nodeclaims.py).
        self.coexistence = karpenter_coexistence
        self.taint_key = disrupted_taint_key(karpenter_coexistence)
        self.disrupted_taint = {"key": self.taint_key, "effect": "NoSchedule"}
        self.handover = KarpenterHandover(kube) if karpenter_coexistence else None

    def _interval(self, requested: float | None) -> float:
        return requested if requested and requested > 0 else self.poll_interval

    async def _record(self, batch: list[events.Event]) -> None:
        """Events of this step (best effort: kube/events.py `record_all` never raises)."""
        await events.record_all(events.recorder_for(self.kube), batch)

    # -- candidates -------------------------------------------------------------------------------

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
                    self._taint_candidate(n, request)
                    if why is None
                    else asyncio.sleep(0, CandidateNode(node=n, ok=False, message=why))
                    for n, (why, _) in zip(request.nodes, guarded, strict=True)
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
            found = await guards.windows(self.kube)
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
            denied = await budget_claims.claim(self.kube, claiming, request.command_id, request.reason)
        except Exception as err:
            raise classify_kube(err, "claiming NodeDisruptionBudgets") from None
        if denied is not None:
            raise guards.Refused(f"{denied.message}: no {request.reason} disruption now")

    async def _release_claims(self, **which: Any) -> None:
        try:
            await budget_claims.release(self.kube, **which)
        except Exception as err:
            raise classify_kube(err, "releasing NodeDisruptionBudget claims") from None

    async def _guard_candidate(self, name: str, request: TaintRequest) -> tuple[str | None, Json | None]:
        """Raise Refused to refuse the command; return why this one candidate is left out (an
        emptiness candidate that is not empty any more), or None to taint it, with the node when the
        command will take it (not for one missing, deleting or another node of the name: the taint
        reports those)."""
        try:
            node = await self.kube.find_node(name)
            if node is None or node["metadata"].get("deletionTimestamp"):
                return None, None  # reported by the taint below
            if another_node(node, request.uids.get(name)) is not None:
                return (
                    None,
                    None,
                )  # not the node the command is for: reported by the taint below, never touched
            pool = await guards.check_managed(self.kube, node, request.reason, self.ownership, self.cluster)
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
            why = guards.no_longer_empty(node, pods)
            return why, (node if why is None else None)
        return None, node

    async def _taint_candidate(self, name: str, request: TaintRequest) -> CandidateNode:
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
            node = await self.kube.update_node(name, claim)
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

    # -- replacements -----------------------------------------------------------------------------

    async def _custom(self, group: str, version: str, plural: str, name: str, kind: str) -> Json:
        try:
            return await self.kube.get_cluster_custom(group, version, plural, name)
        except Exception as err:
            if not_found(err):
                raise permanent(f"{kind} {name} not found", errors.INVALID) from None
            raise classify_kube(err, f"reading {kind} {name}") from None

    async def _nodepool(self, name: str) -> NodePool:
        """The NodePool as the planner reads it: an invalid duration reads as the value that disrupts
        nothing (logged), so a forceful command's replacements still launch in such a pool."""
        raw = await self._custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", name, "NodePool")
        return self._read_nodepool(name, raw)

    @staticmethod
    def _read_nodepool(name: str, raw: Json) -> NodePool:
        try:
            pool, problems = read_nodepool(raw)
        except ValueError as err:
            raise permanent(f"NodePool {name} does not validate: {err}", errors.INVALID) from None
        for problem in problems:
            log.warning("NodePool %s: %s", name, problem)
        return pool

    @activity.defn(name="resolve_replacement")
    async def resolve_replacement(self, request: ResolveRequest) -> LaunchTemplate:
        """Read the NodePool and EC2NodeClass once and write down everything the launch needs."""
        spec = request.spec
        pool = await self._nodepool(spec.nodepool)
        template = pool.spec.template
        ref = template.spec.node_class_ref
        nodeclass_name = spec.nodeclass or (ref.name if ref else None)
        if not nodeclass_name:
            raise permanent(
                f"replacement {request.index}: NodePool {pool.name} has no nodeClassRef "
                "and no nodeclass was given",
                errors.INVALID,
            )
        raw = await self._custom(AWS_GROUP, AWS_VERSION, "ec2nodeclasses", nodeclass_name, "EC2NodeClass")
        try:
            nodeclass = EC2NodeClass.model_validate(raw)
        except ValueError as err:
            raise permanent(
                f"EC2NodeClass {nodeclass_name} does not validate: {err}", errors.INVALID
            ) from None
        status = nodeclass.status
        subnets: dict[str, str] = {}
        zone_ids: dict[str, str] = {}
        for subnet in status.subnets:
            subnets.setdefault(subnet.zone, subnet.id)
            if subnet.zone_id:
                zone_ids.setdefault(subnet.zone, subnet.zone_id)
        if not subnets:
            raise permanent(f"EC2NodeClass {nodeclass_name} has no subnets in status.subnets", errors.INVALID)
        amis = [
            AmiChoice(
                id=ami.id,
                architectures=[
                    v
                    for r in ami.requirements
                    if r.key == ARCH_LABEL and r.operator == "In"
                    for v in r.values
                ],
            )
            for ami in status.amis
        ]
        if not amis and not spec.image_id:
            raise permanent(f"EC2NodeClass {nodeclass_name} has no AMIs in status.amis", errors.INVALID)
        if spec.image_id:
            amis = [AmiChoice(id=spec.image_id)]
        labels = {
            **template.metadata.labels,
            **spec.labels,
            NODEPOOL_LABEL: pool.name,
            EC2NODECLASS_LABEL: nodeclass_name,
        }
        # The drift hashes of the templates the node is built from: drift detection sees it as current.
        annotations = {
            **template.metadata.annotations,
            **spec.annotations,
            **nodepool_hash_annotations(pool),
            **nodeclass_hash_annotations(nodeclass),
        }
        return LaunchTemplate(
            nodepool=pool.name,
            nodeclass=nodeclass_name,
            subnets=subnets,
            security_group_ids=[group.id for group in status.security_groups],
            amis=amis,
            instance_profile=status.instance_profile or nodeclass.spec.instance_profile,
            role=nodeclass.spec.role,
            ami_family=nodeclass.spec.family,
            user_data=nodeclass.spec.user_data,
            kubelet=nodeclass.spec.kubelet,
            associate_public_ip_address=nodeclass.spec.associate_public_ip_address,
            detailed_monitoring=nodeclass.spec.detailed_monitoring,
            # In the EC2NodeClass's own shape: the history shows what the user wrote, and the launch
            # activity translates it for EC2 (launch/ec2_params.py).
            block_device_mappings=[m.to_wire() for m in nodeclass.spec.block_device_mappings],
            metadata_options=nodeclass.spec.metadata_options.to_wire()
            if nodeclass.spec.metadata_options
            else None,
            instance_store_policy=nodeclass.spec.instance_store_policy,
            ip_prefix_count=nodeclass.spec.ip_prefix_count,
            enclave_options=nodeclass.spec.enclave_options.to_wire()
            if nodeclass.spec.enclave_options
            else None,
            zone_ids=zone_ids,
            instance_tags=dict(nodeclass.spec.tags),
            labels=labels,
            annotations=annotations,
            taints=_merge_taints(template.spec.taints, spec.taints),
            startup_taints=_merge_taints(template.spec.startup_taints, spec.startup_taints),
            via_nodeclaim=self.coexistence,
        )

    async def _node_for(self, name_hint: str | None, provider_id: str, list_too: bool) -> Json | None:
        """The node with this providerID: by name first (the private DNS name), then by listing."""
        if name_hint:
            node = await self.kube.find_node(name_hint)
            if node is not None and (node.get("spec") or {}).get("providerID") == provider_id:
                return node
        if list_too:
            listed: list[Json] = (await self.kube.list_nodes()).get("items") or []
            for node in listed:
                if (node.get("spec") or {}).get("providerID") == provider_id:
                    return node
        return None

    @activity.defn(name="await_node_registered")
    async def await_node_registered(self, request: RegistrationRequest) -> RegisteredNode:
        """Wait for the replacement's Node, then make it karpflow's: NodePool labels, annotations and
        taints, the termination finalizer, `karpenter.sh/registered=true`, and no
        `karpenter.sh/unregistered` taint."""
        instance = request.instance
        interval = self._interval(request.poll_interval_seconds)
        polls = 0
        what = f"replacement instance {instance.instance_id} ({instance.provider_id})"
        said = False
        # A first attempt gives EC2 time to list the new instance; a retry (a passing error, a dead
        # worker) looks at once: else every attempt cut short before the first look starts the clock
        # again, and an instance that ended is not noticed for minutes (chaos seed 1: three).
        retried = activity.in_activity() and activity.info().attempt > 1
        look_at_ec2 = time.monotonic() + (0.0 if retried else self.instance_check_seconds)
        while True:
            try:
                node = await self._node_for(
                    instance.private_dns_name, instance.provider_id, list_too=polls % 3 == 2
                )
            except Exception as err:
                raise classify_kube(err, f"looking for the node of {what}") from None
            if node is not None:
                name = node["metadata"]["name"]
                try:
                    await self.kube.update_node(
                        name, lambda n: self._sync_registration(n, request.template, instance.labels)
                    )
                except Exception as err:
                    raise classify_kube(err, f"registering node {name}") from None
                log.info("node %s registered for %s", name, what)
                return RegisteredNode(node=name)
            _heartbeat({"waiting_for": f"a Node with providerID {instance.provider_id}"})
            if not said:  # the candidates wait for it: say so once (the recorder dedupes a retry)
                said = True
                replacement = f"{instance.instance_id} ({instance.offering.instance_type})"
                await self._record(
                    [
                        events.disruption_waiting_readiness(r, replacement)
                        for r in events.refs(request.candidates)
                    ]
                )
            if time.monotonic() >= look_at_ec2:
                look_at_ec2 = time.monotonic() + self.instance_check_seconds
                await self._refuse_if_instance_ended(instance)
            polls += 1
            await asyncio.sleep(interval)

    async def _refuse_if_instance_ended(self, instance: LaunchedInstance) -> None:
        """An instance that is terminating or terminated will never register a node: fail the wait
        now, not at the replacement's deadline. (Not found is not enough: EC2 is eventually
        consistent just after a launch.) A look that failed for a passing reason (throttled, 5xx,
        unreachable) is only logged and the wait goes on; a permanent one (access denied, a bug)
        fails the wait at once, rather than hide a misconfiguration until the deadline."""
        if self.ownership is None:
            return
        try:
            state = await self.ownership(instance.instance_id)
        except Exception as err:
            failure = errors.classify_ec2_lookup(
                err, f"looking up replacement instance {instance.instance_id}"
            )
            if failure.non_retryable and failure.type != errors.NOT_FOUND:
                raise failure from None
            log.warning("could not look up replacement instance %s: %s", instance.instance_id, failure)
            return
        if state.state in ENDED_INSTANCE_STATES:
            raise permanent(
                f"replacement instance {instance.instance_id} is {state.state}: its node will never register",
                errors.NOT_FOUND,
            )

    @staticmethod
    def _sync_registration(node: Json, template: LaunchTemplate, instance_labels: dict[str, str]) -> bool:
        """What Karpenter's registration copies from the NodeClaim: the instance type's and offering's
        labels (karpenter.k8s.aws/instance-*, zone id, capacity type: as no kubelet writes them), the
        NodePool's labels, annotations and taints. All the NodePool's labels: the user data carried
        only those the kubelet accepts (launch/kubelet_labels.py), and these are written in the same
        update that removes `karpenter.sh/unregistered`, so they are on the Node before anything
        can schedule there or initialization can label it."""
        changed = set_labels(node, {**instance_labels, **template.labels, REGISTERED_LABEL: "true"})
        changed |= set_annotations(node, template.annotations)
        if (node["metadata"].get("labels") or {}).get(DO_NOT_SYNC_TAINTS_LABEL) != "true":
            for taint in template.taints:
                changed |= add_taint(node, taint.model_dump(exclude_none=True))
        changed |= remove_taint(node, UNREGISTERED_TAINT_KEY)
        changed |= ensure_finalizer(node)
        return changed

    @activity.defn(name="await_node_initialized")
    async def await_node_initialized(self, request: InitializationRequest) -> None:
        """Wait until the node is Ready with no startup or ephemeral taint left, then label it initialized.
        The heartbeat says what it still waits for; a timeout reports it."""
        interval = self._interval(request.poll_interval_seconds)
        said = False
        while True:
            try:
                node = await self.kube.find_node(request.node)
            except Exception as err:
                raise classify_kube(err, f"reading node {request.node}") from None
            if node is None:
                raise permanent(f"node {request.node} disappeared before it initialized", errors.NOT_FOUND)
            if leaving := replacement_leaving(node):
                raise permanent(f"node {request.node} {leaving}: it will not be capacity", errors.NOT_FOUND)
            blockers = initialization_blockers(node, request.startup_taints)
            if not blockers:
                try:
                    await self.kube.update_node(
                        request.node, lambda n: set_labels(n, {INITIALIZED_LABEL: "true"})
                    )
                except Exception as err:
                    raise classify_kube(err, f"labelling node {request.node} initialized") from None
                return
            _heartbeat({"node": request.node, "waiting_for": blockers})
            if not said:
                said = True
                await self._record(
                    [
                        events.disruption_waiting_readiness(r, request.node)
                        for r in events.refs(request.candidates)
                    ]
                )
            await asyncio.sleep(interval)

    @activity.defn(name="await_node_ready")
    async def await_node_ready(self, request: RegistrationRequest) -> RegisteredNode:
        """`await_node_registered`, then `await_node_initialized`: the two always follow each other,
        and as one wait they cost a disruption's history one activity, not two. Once registered, the
        heartbeat names the node, and so does a failure (`details[0]["node"]`): the workflow knows
        how far the replacement got. A retry registers again (idempotent) and goes on waiting; but if
        an earlier attempt registered a node and no Node has the instance's providerID now, that node
        is gone (its instance vanished, someone deleted it): the retry fails at once, naming it, so
        the workflow rolls back instead of waiting out the replacement's deadline."""
        await self._refuse_if_registered_node_gone(request.instance, request.registered_node)
        registered = await self.await_node_registered(request)
        # Before the first wait: a worker that dies now leaves the node's name to the retry.
        _heartbeat({"node": registered.node, "waiting_for": "initialization"})
        initialization = InitializationRequest(
            node=registered.node,
            startup_taints=request.template.startup_taints,
            poll_interval_seconds=request.poll_interval_seconds,
            candidates=request.candidates,
        )
        try:
            await self.await_node_initialized(initialization)
        except errors.ApplicationError as err:
            raise errors.ApplicationError(
                err.message,
                {"node": registered.node},
                type=err.type,
                non_retryable=err.non_retryable,
                next_retry_delay=err.next_retry_delay,
            ) from None
        return registered

    async def _refuse_if_registered_node_gone(
        self, instance: LaunchedInstance, known: str | None = None
    ) -> None:
        """The node an earlier attempt registered (its heartbeat), or the caller knows (`known`), must
        still have the instance's providerID."""
        node: Any = known
        if not node and activity.in_activity() and not activity.info().is_local:
            beats = activity.info().heartbeat_details
            last = beats[0] if beats else None
            node = last.get("node") if isinstance(last, dict) else None
        if not isinstance(node, str) or not node:
            return
        try:
            found = await self._node_for(node, instance.provider_id, list_too=True)
        except Exception as err:
            raise classify_kube(err, f"looking for node {node} again") from None
        if found is None:
            raise permanent(
                f"node {node} of replacement instance {instance.instance_id} disappeared after it "
                f"registered: no Node has providerID {instance.provider_id} now",
                errors.NOT_FOUND,
                {"node": node},
            )

    @activity.defn(name="release_node")
    async def release_node(self, request: DiscardRequest) -> None:
        """Compensation for a replacement that never initialized, once its instance is terminated: drop
        karpflow's finalizer and delete its Node (nothing to drain on a node that never initialized).
        Missing node: nothing to do."""
        try:
            node = await self.kube.find_node(request.node) if request.node else None
            if (
                node is None
                or instance_id_of((node.get("spec") or {}).get("providerID")) != request.instance_id
            ):
                node = next(
                    (
                        item
                        for item in (await self.kube.list_nodes()).get("items") or ()
                        if instance_id_of((item.get("spec") or {}).get("providerID")) == request.instance_id
                    ),
                    None,
                )
            if node is None:
                return
            name = node["metadata"]["name"]
            await self.kube.update_node(name, drop_finalizer)
            await self.kube.delete_node(name)
        except Exception as err:
            if not_found(err):
                return
            raise classify_kube(err, f"releasing the node of instance {request.instance_id}") from None

    # -- termination ------------------------------------------------------------------------------

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
            pool = await guards.check_managed(self.kube, node, request.reason, self.ownership, self.cluster)
            uid = uid_of(node)
            nodeclaim = await self._hand_over(node, request, pool) if self._karpenter_drains(node) else None
            if nodeclaim is None and not node["metadata"].get("deletionTimestamp"):
                await self.kube.update_node(name, pinned(uid, ensure_finalizer))
                await self._delete_node(name, uid)
                await self._disrupting(node, request.reason)  # this call deleted it: once per node
                node = await self.kube.find_node(name)
                if node is None or another_node(node, uid) is not None:
                    return self._gone(request)  # gone at once: someone removed the finalizer meanwhile
            if request.defer_deadline and nodeclaim is None:
                deadline = annotated_deadline(node)  # the gate starts the drain's clock
            else:
                deadline = await self._deadline(node, request, pool)
            pods = await self.kube.pods_on_node(name)
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

    async def _disrupting(self, node: Json, reason: str) -> None:
        """A disruption deleted the node: Karpenter's DisruptionTerminating Event and nodeclaims_disrupted
        (a person's `kubectl delete node`, reason Manual, is no disruption: no Event, not counted)."""
        if reason == REASON_MANUAL:
            return
        labels = node["metadata"].get("labels") or {}
        metrics.NODECLAIMS_DISRUPTED.labels(
            reason=reason,
            nodepool=labels.get(NODEPOOL_LABEL, ""),
            capacity_type=labels.get(CAPACITY_TYPE_LABEL, ""),
        ).inc()
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
        try:
            return await self.kube.get_cluster_custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", name)
        except Exception as err:
            if not_found(err):
                return None
            raise

    async def _gate(self, request: TerminationGateRequest) -> tuple[TerminationGate, Json | None]:
        """termination_gate's answer, with the node it read (None when it is gone)."""
        name = request.node
        try:
            node = await self.kube.find_node(name)
            if node is None or another_node(node, request.uid) is not None:
                return TerminationGate(go=True, message="the node is gone"), None
            holder = (node["metadata"].get("annotations") or {}).get(guards.OWNER_ANNOTATION)
            if has_taint(node, self.taint_key) and holder:
                # Held by a command (ours, or the one that started this termination): it passed the
                # controls when it tainted; or by this termination itself before a continue-as-new.
                return TerminationGate(go=True, message=f"held by {holder}"), node
            found = await guards.windows(self.kube)
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
            denied = await budget_claims.claim(self.kube, [node], request.holder, request.reason, now)
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
            await self.kube.update_node(ref.node, pinned(ref.uid, mutate))
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
            on_progress=lambda progress: _heartbeat(progress.details()),
            resumed=resumed_progress(previous[0]) if previous else None,
            check=lambda: self._drain_check(request.node, request.uid),
            reason=request.reason,
            taint=disruption_taint(self.taint_key),
        )

        async def keep_beating() -> None:
            while True:
                await asyncio.sleep(HEARTBEAT_EVERY)
                _heartbeat(drainer.progress.details())

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
        """Why the node of this name is not the pinned one any more (None while it is, or is gone)."""
        return another_node(await self.kube.find_node(name), uid)

    async def _drain_check(self, name: str, uid: str | None) -> tuple[str | None, datetime | None]:
        """For the drain, each pass: whether the name is another node's now, and the node's
        termination deadline as annotated (it may have been brought forward since the drain began)."""
        node = await self.kube.find_node(name)
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

        async def detached() -> bool:
            if request.uid and await self._replaced(request.node, request.uid) is not None:
                return True  # the pinned node is gone: the attachments on this name are another's
            remaining = await self._blocking_attachments(request.node)
            _heartbeat({"node": request.node, "attached": remaining[:10]})
            return not remaining

        try:
            if not request.wait:
                return await detached()
            return await wait_until(detached, interval, request.deadline)
        except errors.ApplicationError:
            raise
        except Exception as err:
            raise classify_kube(err, f"waiting for volumes of node {request.node} to detach") from None

    async def _blocking_attachments(self, node: str) -> list[str]:
        try:
            attachments = [
                va
                for va in await self.kube.volume_attachments()
                if (va.get("spec") or {}).get("nodeName") == node
            ]
        except KubeError as err:
            if err.status == 404:  # no storage.k8s.io on this API server: nothing can be attached
                return []
            raise
        if not attachments:
            return []
        now = datetime.now(UTC)
        ignored: set[str] = set()
        for pod in (Pod(raw) for raw in await self.kube.pods_on_node(node)):
            if pod.waited_for(now, disruption_taint(self.taint_key)):
                continue
            for claim in pod.claims():
                pvc = await self.kube.pvc(pod.namespace, claim)
                volume = ((pvc or {}).get("spec") or {}).get("volumeName")
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
            await self.kube.update_node(ref.node, pinned(ref.uid, mutate))
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
        # The node is going: its NodeDisruptionBudget claims make room for the next one.
        await self._release_claims(nodes=[ref.node], uid=ref.uid)
