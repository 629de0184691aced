"""`karpflow uninstall`: take karpflow's marks off the cluster once its workers are gone.

While it runs, karpflow keeps marks on the cluster that only it removes: its finalizer on every
NodePool (`karpflow.io/nodepool-nodes`, so a deleting pool waits for its nodes to be terminated), the
`karpenter.sh/termination` finalizer on the nodes it launched, its disruption taints and annotations
on nodes, and the claims in NodeDisruptionBudgets' status. Once karpflow is gone, a NodePool or a node
deleted with one of those finalizers waits for ever. This command removes them, in this order:

1. It refuses while karpflow could still act or put the marks back: the controller running, a worker
   polling the task queue, or a disruption, termination or rollout running (each named, with what to
   do). `--skip-temporal-checks` goes on without asking Temporal (when Temporal is gone too).
2. It shows every change it would make (`--dry-run` stops there) and asks, unless `--yes`.
3. It makes them, each a read-modify-write pinned to the object's UID and resourceVersion (a 409 is
   read again), and says what it did; exit 1 when one failed (run it again: every step is idempotent).

What it leaves: a `karpenter.sh/disrupted` taint without karpflow's holder annotation and the
termination finalizer of a node Karpenter has a NodeClaim for (they are Karpenter's), the
MaintenanceWindow and NodeDisruptionBudget objects and CRDs (`kubectl delete -k deploy/...` removes
what was applied), and the nodes themselves. A node released from its finalizer is no longer drained
on deletion, and its instance is not terminated with it: terminate it in EC2 if you delete the node.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from api.constants import (
    DISRUPTED_TAINT_KEY,
    HOLDER_ANNOTATION,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    KARPFLOW_DISRUPTED_TAINT_KEY,
    KARPFLOW_GROUP,
    KARPFLOW_VERSION,
    NODEPOOL_FINALIZER,
    TERMINATION_FINALIZER,
)
from kube.client import Json, KubeApi, KubeError
from planner.optimal.leaving import LEAVING_TAINT_KEY
from runtime.settings import WorkerSettings

# What karpflow alone writes on nodes: the annotation prefixes and the taint keys.
ANNOTATION_PREFIXES = ("karpflow.io/", "karpflow.dev/")
KARPFLOW_TAINT_KEYS = (KARPFLOW_DISRUPTED_TAINT_KEY, LEAVING_TAINT_KEY)
RUNNING_TYPES = ("DisruptionWorkflow", "TerminationWorkflow", "RolloutWorkflow")
ATTEMPTS = 5
# A worker long-polls again within a minute (the server answers an idle poll after about 60 s).
POLLER_FRESH = timedelta(seconds=90)
EXIT_REFUSED = 2


@dataclass(frozen=True)
class Change:
    """One object's edit: what it is, what will change, and the edit itself (True when it changed)."""

    kind: str  # Node, NodePool, NodeDisruptionBudget
    name: str
    uid: str
    what: list[str]
    edit: Callable[[Json], bool] = field(compare=False, repr=False)


def _node_edit(strip_taints: set[str], strip_annotations: set[str], release: bool) -> Callable[[Json], bool]:
    def edit(node: Json) -> bool:
        changed = False
        spec = node.setdefault("spec", {})
        taints = spec.get("taints") or []
        kept = [t for t in taints if t.get("key") not in strip_taints]
        if len(kept) != len(taints):
            spec["taints"], changed = kept, True
        annotations = node["metadata"].get("annotations") or {}
        for key in strip_annotations & set(annotations):
            del annotations[key]
            changed = True
        finalizers = node["metadata"].get("finalizers") or []
        if release and TERMINATION_FINALIZER in finalizers:
            node["metadata"]["finalizers"] = [f for f in finalizers if f != TERMINATION_FINALIZER]
            changed = True
        return changed

    return edit


def node_change(node: Json, karpenter_provider_ids: set[str]) -> Change | None:
    """What to take off one node: karpflow's taints (Karpenter's disrupted taint only where karpflow's
    holder annotation says karpflow put it), karpflow's annotations, and the termination finalizer of
    a node Karpenter has no NodeClaim for (karpflow is what would have released it)."""
    meta = node["metadata"]
    annotations = meta.get("annotations") or {}
    ours_too = {DISRUPTED_TAINT_KEY} if HOLDER_ANNOTATION in annotations else set()
    strip_taints = set(KARPFLOW_TAINT_KEYS) | ours_too
    taints = sorted(
        {
            t.get("key", "")
            for t in (node.get("spec") or {}).get("taints") or []
            if t.get("key") in strip_taints
        }
    )
    marks = sorted(k for k in annotations if k.startswith(ANNOTATION_PREFIXES))
    provider_id = (node.get("spec") or {}).get("providerID") or ""
    release = (
        TERMINATION_FINALIZER in (meta.get("finalizers") or []) and provider_id not in karpenter_provider_ids
    )
    what = [f"taint {key}" for key in taints] + [f"annotation {key}" for key in marks]
    if release:
        what.append(
            f"finalizer {TERMINATION_FINALIZER}" + (" (deleting)" if meta.get("deletionTimestamp") else "")
        )
    if not what:
        return None
    return Change(
        "Node", meta["name"], meta.get("uid", ""), what, _node_edit(set(taints), set(marks), release)
    )


def _drop_nodepool_finalizer(pool: Json) -> bool:
    finalizers = pool["metadata"].get("finalizers") or []
    if NODEPOOL_FINALIZER not in finalizers:
        return False
    pool["metadata"]["finalizers"] = [f for f in finalizers if f != NODEPOOL_FINALIZER]
    return True


def _drop_claims(budget: Json) -> bool:
    status = budget.get("status") or {}
    if not status.get("claims"):
        return False
    status["claims"] = []
    return True


def uninstall_changes(
    nodes: Iterable[Json], nodepools: Iterable[Json], budgets: Iterable[Json], nodeclaims: Iterable[Json]
) -> list[Change]:
    """Every change `karpflow uninstall` makes, from the objects as listed (pure)."""
    karpenter = {(c.get("status") or {}).get("providerID") for c in nodeclaims} - {None, ""}
    changes: list[Change] = []
    for pool in sorted(nodepools, key=lambda p: p["metadata"]["name"]):
        if NODEPOOL_FINALIZER in (pool["metadata"].get("finalizers") or []):
            meta = pool["metadata"]
            what = [
                f"finalizer {NODEPOOL_FINALIZER}" + (" (deleting)" if meta.get("deletionTimestamp") else "")
            ]
            changes.append(
                Change("NodePool", meta["name"], meta.get("uid", ""), what, _drop_nodepool_finalizer)
            )
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        if (change := node_change(node, {str(p) for p in karpenter})) is not None:
            changes.append(change)
    for budget in sorted(budgets, key=lambda b: b["metadata"]["name"]):
        claims = (budget.get("status") or {}).get("claims") or []
        if claims:
            meta = budget["metadata"]
            what = [f"{len(claims)} claim(s): " + ", ".join(sorted(str(c.get("node")) for c in claims))]
            changes.append(
                Change("NodeDisruptionBudget", meta["name"], meta.get("uid", ""), what, _drop_claims)
            )
    return changes


# -- reading and writing the cluster -------------------------------------------------------------------

NODEPOOLS = f"/apis/{KARPENTER_GROUP}/{KARPENTER_VERSION}/nodepools"
NODECLAIMS = f"/apis/{KARPENTER_GROUP}/{KARPENTER_VERSION}/nodeclaims"
BUDGETS = f"/apis/{KARPFLOW_GROUP}/{KARPFLOW_VERSION}/nodedisruptionbudgets"


async def _items(kube: KubeApi, path: str) -> list[Json]:
    """A cluster-scoped list; a kind the cluster does not serve (its CRD not installed) is empty."""
    try:
        return list((await kube.request("GET", path)).get("items") or [])
    except KubeError as err:
        if err.status == 404:
            return []
        raise


async def read_changes(kube: KubeApi) -> list[Change]:
    nodes, pools, budgets, claims = await asyncio.gather(
        _items(kube, "/api/v1/nodes"),
        _items(kube, NODEPOOLS),
        _items(kube, BUDGETS),
        _items(kube, NODECLAIMS),
    )
    return uninstall_changes(nodes, pools, budgets, claims)


def _path(change: Change) -> str:
    if change.kind == "Node":
        return f"/api/v1/nodes/{change.name}"
    if change.kind == "NodePool":
        return f"{NODEPOOLS}/{change.name}"
    return f"{BUDGETS}/{change.name}/status"


async def apply_change(kube: KubeApi, change: Change) -> str:
    """Make one change: read, edit, write with the read's resourceVersion (409: again), only on the
    object with the UID listed. Returns what happened, for the report."""
    path = _path(change)
    for _ in range(ATTEMPTS):
        try:
            obj = await kube.request("GET", path)
        except KubeError as err:
            if err.status == 404:
                return "gone already"
            raise
        if change.uid and obj["metadata"].get("uid") != change.uid:
            return "another object now has this name: left alone"
        if not change.edit(obj):
            return "nothing left to change"
        try:
            await kube.request("PUT", path, body=obj)
            return "done"
        except KubeError as err:
            if err.status == 409:
                continue  # changed meanwhile: read it again
            if err.status == 404:
                return "gone already"
            raise
    raise KubeError(409, "Conflict", f"{change.kind} {change.name} kept changing ({ATTEMPTS} attempts)")


# -- what would put the marks back ---------------------------------------------------------------------


async def still_running(settings: WorkerSettings) -> list[str]:
    """What in Temporal could still act on the cluster or put the marks back, each with what to do."""
    from runtime.connections import connect_temporal
    from runtime.controller_start import RUNNING, latest_status

    client = await connect_temporal(settings)
    problems = []
    status = await latest_status(client, settings.cluster_name)
    if status in RUNNING:
        problems.append(
            f"the controller of cluster {settings.cluster_name} is running: "
            "stop it (`karpflow controller stop --reason uninstall`)"
        )
    pollers = await recent_pollers(client, settings.task_queue)
    if pollers:
        problems.append(
            f"{len(pollers)} worker(s) polled task queue {settings.task_queue} in the last "
            f"{POLLER_FRESH.seconds} s ({', '.join(pollers)}): they would put the finalizers back; scale the "
            "worker to 0 (`kubectl -n karpflow scale deployment karpflow-worker --replicas 0`) and try again "
            f"{POLLER_FRESH.seconds} s later"
        )
    types = ", ".join(f"'{t}'" for t in RUNNING_TYPES)
    query = (
        f"WorkflowType IN ({types}) AND ExecutionStatus = 'Running' AND TaskQueue = '{settings.task_queue}'"
    )
    running = [f"{w.workflow_type} {w.id}" async for w in client.list_workflows(query)]
    if running:
        shown = "; ".join(running[:10]) + (f"; and {len(running) - 10} more" if len(running) > 10 else "")
        problems.append(
            f"{len(running)} workflow(s) still run: {shown} (let them finish, or cancel them: "
            "`temporal workflow cancel --workflow-id ID`)"
        )
    return problems


async def recent_pollers(client: Any, task_queue: str) -> list[str]:
    """The identities of the workers that polled the task queue lately. Temporal lists a poller for
    minutes after it stopped; one that polls long-polls again within a minute, so a poller not seen
    for POLLER_FRESH is gone."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    now = datetime.now(UTC)
    seen = set()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        request = DescribeTaskQueueRequest(
            namespace=client.namespace, task_queue=TaskQueue(name=task_queue), task_queue_type=kind
        )
        for poller in (await client.workflow_service.describe_task_queue(request)).pollers:
            last = poller.last_access_time.ToDatetime(tzinfo=UTC)
            if now - last < POLLER_FRESH:
                seen.add(poller.identity or "?")
    return sorted(seen)


def _table(changes: list[Change]) -> Table:
    table = Table(title="karpflow's marks on the cluster", show_lines=False)
    for column in ("kind", "name", "removes"):
        table.add_column(column)
    for change in changes:
        table.add_row(change.kind, change.name, "; ".join(change.what))
    return table


@click.command("uninstall")
@click.option("--dry-run", is_flag=True, help="Show what would be removed, change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before removing.")
@click.option(
    "--skip-temporal-checks",
    is_flag=True,
    help="Do not check in Temporal that the controller, the workers and the commands are gone.",
)
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="default: KUBECONFIG")
@click.option("--cluster-name", help="default: KARPFLOW_CLUSTER_NAME")
@click.option("--temporal-address", help="default: KARPFLOW_TEMPORAL_ADDRESS, else localhost:7233")
@click.option("--temporal-namespace", help="default: KARPFLOW_TEMPORAL_NAMESPACE, else default")
@click.option("--task-queue", help="default: KARPFLOW_TASK_QUEUE, else karpflow")
def uninstall(
    dry_run: bool, yes: bool, skip_temporal_checks: bool, kubeconfig: str | None, **given: Any
) -> None:
    """Remove karpflow's finalizers, taints, annotations and budget claims, once karpflow is stopped."""
    from pydantic import ValidationError

    from runtime.connections import connect_kubernetes
    from runtime.settings import explain

    flags = {k: v for k, v in given.items() if v is not None}
    if kubeconfig:
        flags["kubeconfig"] = kubeconfig
    try:
        settings = WorkerSettings(**flags)
    except ValidationError as err:
        click.echo(explain(err), err=True)
        sys.exit(EXIT_REFUSED)
    console = Console()

    async def go() -> int:
        if not skip_temporal_checks:
            try:
                problems = await still_running(settings)
            except Exception as err:
                click.echo(
                    f"karpflow uninstall: cannot ask Temporal at {settings.temporal_address} what still runs "
                    f"({err}); if Temporal is gone too, pass --skip-temporal-checks",
                    err=True,
                )
                return EXIT_REFUSED
            if problems:
                click.echo("karpflow uninstall: karpflow is still running, so nothing was changed:", err=True)
                for problem in problems:
                    click.echo(f"  - {problem}", err=True)
                return EXIT_REFUSED
        kube = await connect_kubernetes(settings)
        try:
            changes = await read_changes(kube)
            if not changes:
                console.print("karpflow left no mark on this cluster: nothing to remove")
                return 0
            console.print(_table(changes))
            if dry_run:
                console.print(f"{len(changes)} object(s) would change (--dry-run: nothing changed)")
                return 0
            if not yes:
                if not sys.stdin.isatty():
                    click.echo("karpflow uninstall: not a terminal, nothing changed: pass --yes", err=True)
                    return EXIT_REFUSED
                if not click.confirm(f"Remove them from {len(changes)} object(s)?"):
                    console.print("nothing changed")
                    return 0
            failed = 0
            for change in changes:
                try:
                    outcome = await apply_change(kube, change)
                except KubeError as err:
                    outcome, failed = f"FAILED: {err}", failed + 1
                console.print(f"{change.kind} {change.name}: {outcome}")
            console.print(
                f"{len(changes) - failed} of {len(changes)} object(s) cleaned"
                + (f"; {failed} failed: run `karpflow uninstall` again" if failed else "")
            )
            return 1 if failed else 0
        finally:
            await kube.close()

    code = asyncio.run(go())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # sdk-python #300: a process that used the Temporal client may abort at exit
