"""The ControllerWorkflow's activities: plan on the informer's cache, re-validate a command on a
fresh view, list what is in flight (Temporal visibility), start a command, apply annotations.

A pass reads only the worker's informer cache (cluster/informer.py): it sends no list request.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from activities.errors import classify_kube, not_found
from api import search_attributes as sa
from api.constants import DISRUPTED_TAINT_KEY
from api.controller_io import (
    BlockedNode,
    InFlight,
    InFlightInput,
    InFlightOutput,
    OfferingUnavailable,
    PassInput,
    PassOutput,
    PlannedCommand,
    StartOutput,
    ValidateInput,
    ValidateOutput,
)
from api.workflow_ids import disruption_workflow_id
from api.workflow_io import VOLUNTARY_REASONS, DisruptionInput, disruption_input
from cluster.informer import Informer
from kube.client import Json, KubeApi
from planner.catalog import Catalog, bundled_catalog
from planner.model import PlanOptions
from planner.plan import CommandOut, plan, validate_command
from planner.snapshot import Snapshot

log = logging.getLogger("karpflow.planning")

# Consolidation methods wait for the validation timer; emptiness, drift and forceful ones do not.
_VALIDATED_METHODS = frozenset({"emptiness", "multi-node-consolidation", "single-node-consolidation"})
_WAITING_PREFIX = "not consolidatable until"


def _with_in_flight(objects: Iterable[Json], in_flight: set[str]) -> Iterable[Json]:
    """Nodes that a running workflow owns look tainted to the planner even before that workflow
    taints them, so they are no candidates and count against their pool's budget."""
    for obj in objects:
        if obj.get("kind") == "Node" and (obj.get("metadata") or {}).get("name") in in_flight:
            taints = (obj.get("spec") or {}).get("taints") or []
            if not any(t.get("key") == DISRUPTED_TAINT_KEY for t in taints):
                obj = copy.deepcopy(obj)
                obj.setdefault("spec", {}).setdefault("taints", []).append(
                    {"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}
                )
        yield obj


def _without_offerings(catalog: Catalog, unavailable: list[OfferingUnavailable], now: datetime) -> Catalog:
    live = {u.key for u in unavailable if u.until > now}
    if not live:
        return catalog
    types = {}
    for name, itype in catalog.types.items():
        offerings = tuple(
            dataclasses.replace(o, available=False) if f"{name}/{o.zone}/{o.capacity_type}" in live else o
            for o in itype.offerings
        )
        types[name] = dataclasses.replace(itype, offerings=offerings)
    return dataclasses.replace(catalog, types=types)


def planned_command(out: CommandOut, command: Any) -> PlannedCommand:
    forceful = out.reason not in VOLUNTARY_REASONS
    workflow_input: DisruptionInput = disruption_input(command)
    return PlannedCommand(
        workflow_id=disruption_workflow_id(out.nodepools, out.reason, out.id),
        method=out.method,
        reason=out.reason,
        nodepools=list(out.nodepools),
        nodes=list(out.nodes),
        forceful=forceful,
        needs_validation=not forceful and out.method in _VALIDATED_METHODS,
        command=out.model_dump(by_alias=True, mode="json"),
        input=workflow_input.model_dump(mode="json"),
    )


class PlanningActivities:
    def __init__(
        self,
        informer: Informer,
        kube: KubeApi,
        client: Client | None,
        *,
        catalog: Catalog | None = None,
        region: str | None = None,
        options: PlanOptions | None = None,
    ) -> None:
        self.informer = informer
        self.kube = kube
        self.client = client
        self._catalog = catalog
        self.region = region
        self.options = options or PlanOptions()

    def _snapshot(self, in_flight: Iterable[str]) -> Snapshot:
        objects = list(_with_in_flight(self.informer.objects(), set(in_flight)))
        return Snapshot.from_objects(objects, now=datetime.now(UTC), source="informer")

    def _catalog_for(self, snapshot: Snapshot, unavailable: list[OfferingUnavailable]) -> Catalog:
        if self._catalog is None:
            self._catalog = bundled_catalog(self.region or snapshot.region() or "us-west-2")
        return _without_offerings(self._catalog, unavailable, snapshot.now)

    @activity.defn(name="controller_plan")
    async def plan_pass(self, request: PassInput) -> PassOutput:
        """One planning pass on the cache; `synced=False` (and nothing else) before the cache synced."""
        if not self.informer.synced:
            return PassOutput(synced=False)
        started = time.monotonic()
        snapshot = self._snapshot(request.in_flight_nodes)
        result = plan(snapshot, self._catalog_for(snapshot, request.unavailable), self.options)
        commands = [
            planned_command(out, cmd) for out, cmd in zip(result.commands, result.commands_, strict=True)
        ]
        events = [
            e.model_dump(mode="json") if hasattr(e, "model_dump") else e
            for e in getattr(result, "events", [])
        ]
        return PassOutput(
            synced=True,
            at=snapshot.now,
            commands=commands,
            blocked=[BlockedNode(node=b.node, reason=b.reason) for b in result.blocked],
            budgets=result.budgets_at_start,
            annotations=[a.model_dump(mode="json") for a in result.annotations],
            events=events,
            tainted_nodes=sorted(n.name for n in snapshot.nodes.values() if n.has_disrupted_taint),
            waiting=sum(1 for b in result.blocked if b.reason.startswith(_WAITING_PREFIX)),
            problems=list(result.problems),
            duration_seconds=time.monotonic() - started,
        )

    @activity.defn(name="controller_validate")
    async def validate(self, request: ValidateInput) -> ValidateOutput:
        """Re-check a consolidation command on the cache as it is now (after the validation timer)."""
        if not self.informer.synced:
            return ValidateOutput(valid=False, reason="cache not synced")
        if set(request.command.nodes) & set(request.in_flight_nodes):
            return ValidateOutput(valid=False, reason="a candidate is now in flight")
        snapshot = self._snapshot(request.in_flight_nodes)
        out = CommandOut.model_validate(request.command.command)
        result = validate_command(snapshot, self._catalog_for(snapshot, []), out, self.options)
        if not result.valid:
            return ValidateOutput(valid=False, reason=result.reason)
        if result.command is None or result.command.id == out.id:
            return ValidateOutput(valid=True, command=request.command)
        # Validation may narrow a command (e.g. fewer replacements): start the narrowed one.
        return ValidateOutput(valid=False, reason="the command changed on validation; re-planning")

    @activity.defn(name="controller_in_flight")
    async def in_flight(self, request: InFlightInput) -> InFlightOutput:
        """Running Disruption/Termination workflows (visibility) and the fate of the tracked ids."""
        assert self.client is not None
        running: list[InFlight] = []
        query = (
            "(WorkflowType = 'DisruptionWorkflow' OR WorkflowType = 'TerminationWorkflow') "
            "AND ExecutionStatus = 'Running'"
        )
        seen: set[str] = set()
        async for wf in self.client.list_workflows(query):
            nodes = list(wf.typed_search_attributes.get(sa.NODES) or [])
            reason = wf.typed_search_attributes.get(sa.REASON) or ""
            running.append(
                InFlight(workflow_id=wf.id, workflow_type=wf.workflow_type, nodes=nodes, reason=reason)
            )
            seen.add(wf.id)
        failed, closed = [], []
        for workflow_id in request.track:
            if workflow_id in seen:
                continue
            try:
                description = await self.client.get_workflow_handle(workflow_id).describe()
            except Exception:
                continue
            if description.status == WorkflowExecutionStatus.RUNNING:
                # Visibility lags: describe is authoritative. Nodes come from its search attributes.
                nodes = list(description.typed_search_attributes.get(sa.NODES) or [])
                running.append(
                    InFlight(workflow_id=workflow_id, workflow_type=description.workflow_type, nodes=nodes)
                )
            elif description.status == WorkflowExecutionStatus.COMPLETED:
                closed.append(workflow_id)
            else:
                failed.append(workflow_id)
        return InFlightOutput(running=running, failed=failed, closed=closed)

    @activity.defn(name="controller_start")
    async def start(self, command: PlannedCommand) -> StartOutput:
        """Start the command's DisruptionWorkflow; an id already started is success (never twice)."""
        assert self.client is not None
        info = activity.info()
        try:
            await self.client.start_workflow(
                "DisruptionWorkflow",
                DisruptionInput.model_validate(command.input),
                id=command.workflow_id,
                task_queue=info.task_queue,
            )
            return StartOutput(workflow_id=command.workflow_id, already_started=False)
        except WorkflowAlreadyStartedError:
            return StartOutput(workflow_id=command.workflow_id, already_started=True)

    @activity.defn(name="controller_annotate")
    async def annotate(self, changes: list[dict[str, Any]]) -> int:
        """Set (value) or remove (None) node annotations; idempotent, a gone node is skipped."""
        done = 0
        for change in changes:
            name, key, value = change["node"], change["key"], change.get("value")

            def mutate(node: Json, key: str = key, value: str | None = value) -> bool:
                annotations = node.setdefault("metadata", {}).setdefault("annotations", {}) or {}
                node["metadata"]["annotations"] = annotations
                if annotations.get(key) == value or (value is None and key not in annotations):
                    return False
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
                return True

            try:
                await self.kube.update_node(name, mutate)
                done += 1
            except Exception as err:
                if not_found(err):
                    continue
                raise classify_kube(err, f"annotating node {name}") from None
        return done

    @activity.defn(name="controller_events")
    async def record_events(self, events: list[dict[str, Any]]) -> int:
        """Log the plan's events and create them as Kubernetes Events (best effort)."""
        created = 0
        for event in events:
            log.info("event: %s", event)
            name = str(event.get("object") or event.get("name") or event.get("node") or "karpflow")
            kind = str(event.get("kind") or "Node")
            namespace = str(event.get("namespace") or "default")
            body = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": {"kind": kind, "name": name},
                "reason": str(event.get("reason") or "Karpflow"),
                "message": str(event.get("message") or ""),
                "type": str(event.get("type") or "Normal"),
                "source": {"component": "karpflow"},
                "firstTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            try:
                await self.kube.request("POST", f"/api/v1/namespaces/{namespace}/events", body=body)
                created += 1
            except Exception as err:  # events are informative: never fail a pass for one
                log.warning("could not create event %s: %s", body["reason"], err)
        return created

    def activities(self) -> list[Any]:
        return [self.plan_pass, self.validate, self.in_flight, self.start, self.annotate, self.record_events]


__all__ = ["ApplicationError", "PlanningActivities", "planned_command"]
