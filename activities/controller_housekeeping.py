"""The controller's housekeeping: what a pass finds to keep up beside its commands, and the
activities that do it, each idempotent and re-checking what it changes just before it acts:

- `untaint_orphans`: crash cleanup of karpflow's disruption taint on nodes no running workflow holds;
- `sync_operator_controls`: the Valid condition of MaintenanceWindows and NodeDisruptionBudgets, and
  stale NodeDisruptionBudget claims dropped (`controls_upkeep` says which, in the pass);
- `sync_nodepool_finalizers`: karpflow's NodePool finalizer (`nodepool_finalizer_changes`);
- `apply_annotations`, `apply_taints`: the node annotations and leaving taints a pass asked for.

PlanningActivities (activities/planning.py) is composed with these; what they use of its state
is declared on `ControllerHousekeeping`.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Literal

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities import budget_claims
from activities.errors import classify_kube
from activities.guards import OWNER_ANNOTATION
from activities.in_flight import InFlight
from activities.node_json import pinned
from api.constants import (
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    KARPFLOW_GROUP,
    KARPFLOW_VERSION,
    NODEPOOL_FINALIZER,
    NODEPOOL_LABEL,
)
from api.controller_io import ControlCondition, ControlsUpkeep
from cluster.informer import ClusterCache
from cluster.reads import ClusterReads
from kube import events
from kube.client import Json, KubeApi, KubeError
from kube.disruption import raw_disruption_taint
from kube.events import ObjectRef
from kube.times import parse_time, rfc3339
from planner.maintenance_windows import read_window
from planner.node_disruption_budgets import read_ndb
from planner.optimal.leaving import LEAVING_TAINT_KEY, TaintChange
from planner.plan import AnnotationChange
from planner.snapshot import Snapshot

log = logging.getLogger(__name__)

# A NodeDisruptionBudget claim is written a moment before its taint; one whose holder no longer runs
# and whose node is still untouched after this long was left by a command that stopped in between.
STALE_CLAIM_SECONDS = 120.0
CONDITION_VALID = "Valid"


def nodepool_finalizer_changes(snapshot: Snapshot) -> dict[str, bool]:
    """Live NodePools without karpflow's finalizer get it; deleting ones whose nodes are all gone
    lose it (then the API server removes them)."""
    used = {node.nodepool for node in snapshot.nodes.values()}
    changes = {}
    for name, pool in snapshot.nodepools.items():
        holds = NODEPOOL_FINALIZER in pool.metadata.finalizers
        if not pool.metadata.deletion_timestamp and not holds:
            changes[name] = True
        elif pool.metadata.deletion_timestamp and holds and name not in used:
            changes[name] = False
    return changes


def _has_disrupted_taint(obj: Json) -> bool:
    return raw_disruption_taint(obj) is not None


def _condition(
    obj: Json, kind: Literal["MaintenanceWindow", "NodeDisruptionBudget"]
) -> ControlCondition | None:
    """The Valid condition `obj` should carry, when it does not carry it already."""
    if kind == "MaintenanceWindow":
        problems = list(read_window(obj).problems)
    else:
        problems = list(read_ndb(obj).problems)
    valid = not problems
    message = "" if valid else "; ".join(problems)[:1000]
    current = next(
        (c for c in ((obj.get("status") or {}).get("conditions") or ()) if c.get("type") == CONDITION_VALID),
        None,
    )
    if (
        current is not None
        and current.get("status") == ("True" if valid else "False")
        and (valid or current.get("message") == message)
    ):
        return None
    return ControlCondition(
        kind=kind, name=(obj.get("metadata") or {}).get("name") or "", valid=valid, message=message
    )


def _stale_claims(objects: list[Json], nodes: dict[str, Json], running: set[str], now: datetime) -> int:
    """Claims the sweep would drop (activities/budget_claims.py `sweep` decides again when it acts)."""
    stale = 0
    for obj in objects:
        for claim in (obj.get("status") or {}).get("claims") or ():
            node = nodes.get(claim.get("node") or "")
            uid = claim.get("uid")
            if node is None or (uid and (node.get("metadata") or {}).get("uid") != uid):
                stale += 1
                continue
            if str(claim.get("holder") or "").partition("@")[0] in running:
                continue
            if _has_disrupted_taint(node) or (node.get("metadata") or {}).get("deletionTimestamp"):
                continue
            since = parse_time(claim.get("since"))
            if since is None or (now - since).total_seconds() > STALE_CLAIM_SECONDS:
                stale += 1
    return stale


def controls_upkeep(objects: list[Json], running: list[str], now: datetime) -> ControlsUpkeep | None:
    """Valid conditions to write on the operator's controls, and whether any claim is stale."""
    windows = [o for o in objects if o.get("kind") == "MaintenanceWindow"]
    budgets = [o for o in objects if o.get("kind") == "NodeDisruptionBudget"]
    conditions = [c for o in windows if (c := _condition(o, "MaintenanceWindow")) is not None]
    conditions += [c for o in budgets if (c := _condition(o, "NodeDisruptionBudget")) is not None]
    nodes = {(o.get("metadata") or {}).get("name") or "": o for o in objects if o.get("kind") == "Node"}
    stale = _stale_claims(budgets, nodes, set(running), now) if budgets else 0
    upkeep = ControlsUpkeep(
        conditions=conditions, stale_claims=stale, running=sorted(running) if stale else []
    )
    return None if upkeep.empty else upkeep


class ControllerHousekeeping:
    """The housekeeping activities of the controller, a part of PlanningActivities, whose
    constructor sets what they use."""

    kube: KubeApi
    client: Client
    cache: ClusterCache
    # The disruption taint karpflow writes (the only one its crash cleanup removes).
    taint_key: str

    async def _in_flight(self) -> InFlight:
        """What is in flight (PlanningActivities reads it from Temporal visibility)."""
        raise NotImplementedError

    @activity.defn(name="untaint_orphans")
    async def untaint_orphans(self, nodes: list[str]) -> list[str]:
        """Crash cleanup: remove karpflow's disruption taint (`karpenter.sh/disrupted`, or
        `karpflow.dev/disrupted` beside Karpenter) from nodes no running workflow holds, checked
        again here just before acting, in two ways: visibility (what is in flight) and the node's own
        holder annotation, whose workflow is described directly (visibility lags a start by a second
        or more; a describe does not). The untaint is a read-modify-write that gives up when the
        holder changed since (the node was claimed again). Returns the nodes it untainted."""
        held = (await self._in_flight()).nodes
        cleaned = []
        for name in nodes:
            if name in held:
                continue
            try:
                node = await self.kube.find_node(name)
                owner = ((node or {}).get("metadata", {}).get("annotations") or {}).get(OWNER_ANNOTATION)
                if node is None or (owner and await self._holder_running(owner)):
                    continue

                def mutate(node: Json, owner: str | None = owner) -> bool:
                    meta = node.get("metadata") or {}
                    if meta.get("deletionTimestamp"):
                        return False  # a node being deleted keeps its taint (Karpenter does the same)
                    if (meta.get("annotations") or {}).get(OWNER_ANNOTATION) != owner:
                        return False  # claimed again since it was judged an orphan
                    taints = (node.get("spec") or {}).get("taints") or []
                    kept = [t for t in taints if t.get("key") != self.taint_key]
                    if len(kept) == len(taints):
                        return False
                    node["spec"]["taints"] = kept
                    (meta.get("annotations") or {}).pop(OWNER_ANNOTATION, None)
                    return True

                after = await self.kube.update_node(name, mutate)
                if not any(
                    t.get("key") == self.taint_key for t in (after.get("spec") or {}).get("taints") or ()
                ):
                    cleaned.append(name)
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    continue
                raise classify_kube(err, f"untainting orphan node {name}") from None
        if cleaned:
            log.info("crash cleanup: untainted %s (no running workflow holds them)", ", ".join(cleaned))
        return cleaned

    async def _holder_running(self, owner: str) -> bool:
        """Whether the command named by a holder annotation (`<workflow id>@<first run id>`) still runs."""
        workflow_id = owner.partition("@")[0]
        try:
            described = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return described.status == WorkflowExecutionStatus.RUNNING

    @activity.defn(name="sync_operator_controls")
    async def sync_operator_controls(self, upkeep: ControlsUpkeep) -> int:
        """The operator's controls as a pass found them: a Valid condition on each MaintenanceWindow
        and NodeDisruptionBudget whose validity changed (with a Warning Event when it turns invalid:
        it fails closed), and stale NodeDisruptionBudget claims dropped. Idempotent; returns how
        many objects or claims changed."""
        changed = 0
        for condition in upkeep.conditions:
            try:
                changed += await self._write_condition(condition)
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    continue  # deleted since the pass
                raise classify_kube(
                    err, f"writing the Valid condition of {condition.kind} {condition.name}"
                ) from None
        if upkeep.stale_claims:
            try:
                changed += await budget_claims.sweep(
                    self.kube,
                    set(upkeep.running),
                    STALE_CLAIM_SECONDS,
                    reads=ClusterReads(self.kube, self.cache),
                )
            except Exception as err:
                raise classify_kube(err, "sweeping NodeDisruptionBudget claims") from None
        return changed

    async def _write_condition(self, condition: ControlCondition) -> int:
        plural = "maintenancewindows" if condition.kind == "MaintenanceWindow" else "nodedisruptionbudgets"
        status = "True" if condition.valid else "False"
        for attempt in range(8):
            obj = await self.kube.get_cluster_custom(KARPFLOW_GROUP, KARPFLOW_VERSION, plural, condition.name)
            conditions = list((obj.get("status") or {}).get("conditions") or [])
            current = next((c for c in conditions if c.get("type") == CONDITION_VALID), None)
            if (
                current is not None
                and current.get("status") == status
                and current.get("message", "") == condition.message
            ):
                return 0
            stamp = rfc3339(datetime.now(UTC))
            written = {
                "type": CONDITION_VALID,
                "status": status,
                "reason": "Valid" if condition.valid else "Invalid",
                "message": condition.message,
                "lastTransitionTime": stamp
                if current is None or current.get("status") != status
                else current.get("lastTransitionTime", stamp),
                "observedGeneration": (obj.get("metadata") or {}).get("generation") or 1,
            }
            body = {
                **obj,
                "status": {
                    **(obj.get("status") or {}),
                    "conditions": [*(c for c in conditions if c.get("type") != CONDITION_VALID), written],
                },
            }
            try:
                await self.kube.replace_cluster_custom_status(
                    KARPFLOW_GROUP, KARPFLOW_VERSION, plural, condition.name, body
                )
            except KubeError as err:
                if err.status != 409 or attempt == 7:
                    raise
                continue
            if not condition.valid:
                await events.recorder_for(self.kube).record(
                    events.invalid_control(
                        ObjectRef.of(obj, condition.kind, f"{KARPFLOW_GROUP}/{KARPFLOW_VERSION}"),
                        condition.message,
                    )
                )
            return 1
        return 0

    @activity.defn(name="sync_nodepool_finalizers")
    async def sync_nodepool_finalizers(self, changes: dict[str, bool]) -> int:
        """Add karpflow's finalizer to NodePools (true) or remove it once a deleting pool has no node
        left (false). Idempotent; re-checks the pool before removing. Returns how many changed."""
        changed = 0
        for pool, add in sorted(changes.items()):
            path = f"/apis/{KARPENTER_GROUP}/{KARPENTER_VERSION}/nodepools/{pool}"
            try:
                obj = await self.kube.request("GET", path)
                finalizers = list(obj["metadata"].get("finalizers") or [])
                if add == (NODEPOOL_FINALIZER in finalizers):
                    continue
                if add and obj["metadata"].get("deletionTimestamp"):
                    continue  # too late to hold it
                if not add:
                    remaining = await self.kube.list_nodes(label_selector=f"{NODEPOOL_LABEL}={pool}")
                    if remaining.get("items"):
                        continue
                obj["metadata"]["finalizers"] = (
                    [*finalizers, NODEPOOL_FINALIZER]
                    if add
                    else [f for f in finalizers if f != NODEPOOL_FINALIZER]
                )
                await self.kube.request("PUT", path, body=obj)
                changed += 1
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    continue
                raise classify_kube(
                    err, f"{'adding' if add else 'removing'} the finalizer of NodePool {pool}"
                ) from None
        return changed

    @activity.defn(name="apply_annotations")
    async def apply_annotations(self, changes: list[dict[str, Any]]) -> int:
        """Set or remove the node annotations a pass asked for, each only on the node with the UID the
        pass saw (checked on the very version the write replaces, which carries its resourceVersion:
        a node that reused the name since is never annotated; a change without a UID, from an older
        worker's pass, is written by name). Idempotent. Returns how many nodes it changed."""
        changed = 0
        for raw in changes:
            change = AnnotationChange.model_validate(raw)
            wrote: list[str] = []  # the write's node, when this change wrote one (a conflict runs it again)

            def mutate(node: Json, change: AnnotationChange = change, wrote: list[str] = wrote) -> bool:
                wrote.clear()
                annotations = node.setdefault("metadata", {}).setdefault("annotations", {}) or {}
                node["metadata"]["annotations"] = annotations
                if change.value is None:
                    if annotations.pop(change.key, None) is None:
                        return False
                elif annotations.get(change.key) == change.value:
                    return False
                else:
                    annotations[change.key] = change.value
                wrote.append(change.node)
                return True

            try:
                await self.kube.update_node(change.node, pinned(change.uid or None, mutate))
                changed += len(wrote)
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    continue
                raise classify_kube(err, f"annotating node {change.node}") from None
        return changed

    @activity.defn(name="apply_taints")
    async def apply_taints(self, changes: list[dict[str, Any]]) -> int:
        """Add or remove the `karpflow.io/leaving:PreferNoSchedule` taints a pass asked for (planner/
        optimal/leaving.py); idempotent. Only that key, and added only to nodes of a NodePool: a hand-
        started run cannot taint a node karpflow does not manage. Returns how many nodes changed."""
        changed = 0
        for raw in changes:
            change = TaintChange.model_validate(raw)
            if change.key != LEAVING_TAINT_KEY:
                log.warning(
                    "apply_taints: refusing taint %s on %s: only %s",
                    change.key,
                    change.node,
                    LEAVING_TAINT_KEY,
                )
                continue

            def mutate(node: Json, change: TaintChange = change) -> bool:
                labels = (node.get("metadata") or {}).get("labels") or {}
                spec = node.setdefault("spec", {})
                taints = list(spec.get("taints") or [])
                present = any(t.get("key") == change.key and t.get("effect") == change.effect for t in taints)
                if change.add:
                    if (
                        present
                        or NODEPOOL_LABEL not in labels
                        or (node.get("metadata") or {}).get("deletionTimestamp")
                    ):
                        return False
                    spec["taints"] = [*taints, {"key": change.key, "effect": change.effect}]
                    return True
                if not present:
                    return False
                spec["taints"] = [
                    t for t in taints if not (t.get("key") == change.key and t.get("effect") == change.effect)
                ]
                return True

            try:
                await self.kube.update_node(change.node, mutate)
                changed += 1
            except Exception as err:
                if getattr(err, "status", None) == 404:
                    continue
                raise classify_kube(
                    err, f"{'tainting' if change.add else 'untainting'} node {change.node}"
                ) from None
        return changed
