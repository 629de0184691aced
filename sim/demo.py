"""`karpflow demo` (what `make demo` runs): karpflow disrupting a simulated cluster, step by step.

The story (`story()`, a list of `Step`s, each a title and a small function of a `Demo`):

1. the cluster through the real kubectl, and its EC2 instances in moto;
2. the operator's controls (docs/operator-controls.md), applied with kubectl before the worker
   starts: a MaintenanceWindow that holds back Expiration and Consolidation of NodePool default's
   nodes in us-west-2a for the first ~25 s of the controller's work (soft expiration: the expired
   node waits, and goes once the window closes) and a
   NodeDisruptionBudget that lets at most one node of us-west-2a be unavailable at a time; then
   `karpflow windows` says what they hold back;
3. what the controller's first pass will decide (`karpflow plan` on the live cluster), then the
   worker starts and its controller is at work: the ControllerWorkflow plans, validates and starts
   DisruptionWorkflows on its own; the demo only watches (visibility and the `status` query) until
   the controller has nothing left to start and nothing is in flight, and says when a control holds
   a node back and when it lets go;
4. the cluster afterwards (nodes gone, replacements added, instances terminated), the Events the
   controls left on the nodes, and the invariant checker's report (which judges every disruption
   against the window and the budget) with the open workflows as the disruptions "in flight": it
   must be clean.

A step that fails raises `DemoFailure`: the steps after it are skipped except those that show the
end state (`after_failure`), and the demo exits 1.

The demo runs its own stack in `demo/` inside the dev stack's state directory (`.state/demo/`), or
in `--state-dir DIR` itself, never a dev stack started by `karpflow dev up`: it disrupts the
cluster, which must not happen to a developer's. Ports that are
busy (a dev stack, anything else) are replaced by free ones unless given as flags, and the demo says
so. A demo stack left by `--keep` is stopped and its state removed when the next demo starts; the
stack is stopped (and, after a clean run, its state removed) at the end unless `--keep`.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from rich.console import Console
from rich.rule import Rule

from api.constants import ZONE_LABEL as ZONE
from sim.cli import SimClient, dump_as_list, instances_table, print_report
from sim.devstack import DEFAULT_SCENARIO, DevSettings, DevStack, DevStackError, purged_message
from sim.devstack_cli import bring_up, endpoints_table, settings_from_flags, stack_options
from sim.ports import free_port, port_is_free

# Tables as wide as kubectl's lines when the output is not a terminal (a log, CI).
console = Console() if sys.stdout.isatty() else Console(width=160)
# The operator's controls the demo applies, written beside its stack (removed with it).
CONTROLS_FILE = "demo-controls.yaml"

T = TypeVar("T")
NODE_COLUMNS = "karpenter.sh/nodepool,karpenter.sh/capacity-type,node.kubernetes.io/instance-type"


class DemoFailure(Exception):
    """Something the demo showed went wrong (a workflow failed, an invariant was violated)."""


@dataclass
class Demo:
    """The running stack and what the story has seen so far."""

    stack: DevStack
    sim: SimClient
    timeout: float = 240.0  # wall seconds the controller may take to settle
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    nodes_before: set[str] = field(default_factory=set)
    started: list[Any] = field(default_factory=list)  # every DisruptionWorkflow id the controller started
    outcomes: list[Any] = field(default_factory=list)  # every final DisruptionProgress
    keep: bool = False  # the stack stays up after the demo
    window_closes: datetime | None = None  # when the demo's MaintenanceWindow lets go
    held: dict[str, str] = field(default_factory=dict)  # node -> why a control held it (until taken)
    holding: dict[str, str] = field(default_factory=dict)  # what the last pass held back by a control
    last_blocked: dict[str, str] = field(default_factory=dict)  # the last pass's reasons, every node
    let_go: dict[str, str] = field(default_factory=dict)  # node -> the control that held it, then let go
    _client: Any = None

    @property
    def settings(self) -> DevSettings:
        return self.stack.settings

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Async client code (Temporal) on the demo's one event loop."""
        return self.loop.run_until_complete(coroutine)

    def temporal(self) -> Any:
        if self._client is None:
            from temporalio.client import Client
            from temporalio.contrib.pydantic import pydantic_data_converter

            self._client = self.run(
                Client.connect(
                    self.settings.temporal_address,
                    namespace=self.settings.temporal_namespace,
                    data_converter=pydantic_data_converter,
                )
            )
        return self._client

    def close(self) -> None:
        self.loop.close()

    def kubectl(self, *args: str, show: bool = True) -> str:
        """Run the real kubectl against the emulator and show exactly what it prints (or, with
        `show=False`, only the command: the caller shows what matters of the output)."""
        command = ["kubectl", "--kubeconfig", str(self.settings.kubeconfig_path), *args]
        console.print(f"[bold cyan]$ kubectl {' '.join(args)}[/bold cyan]", highlight=False)
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if show:
            sys.stdout.write(result.stdout)
        if result.returncode != 0:
            console.print(f"[red]{result.stderr.strip()}[/red]", highlight=False)
        sys.stdout.flush()
        return result.stdout

    def karpflow(self, *args: str) -> str:
        console.print(f"[bold cyan]$ karpflow {' '.join(args)}[/bold cyan]", highlight=False)
        result = subprocess.run(
            [sys.executable, "-m", "cli", *args], capture_output=True, text=True, timeout=120, check=False
        )
        sys.stdout.write(result.stdout)
        if result.returncode not in (0, 1):
            console.print(f"[red]{result.stderr.strip()}[/red]", highlight=False)
        sys.stdout.flush()
        return result.stdout

    def cluster(self) -> dict[str, Any]:
        """Every object of the simulated cluster, as a kubectl List."""
        return dump_as_list(self.sim.request("GET", "/sim/state"))

    def node_names(self) -> set[str]:
        return {o["metadata"]["name"] for o in self.cluster()["items"] if o.get("kind") == "Node"}


# -- the cluster ---------------------------------------------------------------------------------


def show_cluster(demo: Demo) -> None:
    demo.nodes_before = demo.node_names()
    demo.kubectl("get", "nodes", "-o", "wide", "-L", "karpenter.sh/nodepool,karpenter.sh/capacity-type")
    demo.kubectl("get", "pods", "-A", "-o", "wide")
    demo.kubectl("get", "pdb", "-A")
    demo.kubectl("get", "nodepools")
    demo.kubectl("get", "ec2nodeclasses")


def show_instances(demo: Demo) -> None:
    status = demo.sim.request("GET", "/sim/status")
    console.print(instances_table(status["ec2_endpoint"], status["region"], status["cluster_name"]))
    if demo.started:
        console.print("Instances of the disrupted nodes are terminated; karpflow terminates only owned ones.")
        launched = [n for row in demo.outcomes for n in row.replaced_by]
        if launched:
            console.print(
                f"The {len(launched)} replacement(s) karpflow launched run (Name tag karpflow/<nodepool>; "
                "the Private IP gives the node name).",
                highlight=False,
            )
    else:
        console.print("Every Node's spec.providerID names one of these instances; karpflow terminates them.")


# -- the operator's controls ---------------------------------------------------------------------

WINDOW = "demo-expire-later"
NDB = "demo-one-of-us-west-2a"
WINDOW_HOLD = 35.0  # seconds after it is applied; the worker starts ~10 s later
CONTROL_KINDS = ("MaintenanceWindow", "NodeDisruptionBudget")


def demo_controls(now: datetime, hold: float = WINDOW_HOLD) -> tuple[list[dict[str, Any]], datetime]:
    """The demo's MaintenanceWindow and NodeDisruptionBudget, as a user writes them, and when the
    window closes. The window is a real schedule (a daily cron at this minute, UTC) whose duration
    ends `hold` seconds from `now`, so it opens before the controller's first pass and closes on its
    own while the demo watches."""
    opened = now.replace(second=0, microsecond=0)
    seconds = math.ceil((now - opened).total_seconds() + hold)
    window = {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "MaintenanceWindow",
        "metadata": {"name": WINDOW},
        "spec": {
            "schedules": [{"cron": f"{opened.minute} {opened.hour} * * *", "duration": f"{seconds}s"}],
            "actions": ["Expiration", "Consolidation"],
            "selector": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]},
                {"key": ZONE, "operator": "In", "values": ["us-west-2a"]},
            ],
        },
    }
    budget = {
        "apiVersion": "karpflow.dev/v1alpha1",
        "kind": "NodeDisruptionBudget",
        "metadata": {"name": NDB},
        "spec": {"selector": {"matchLabels": {ZONE: "us-west-2a"}}, "maxUnavailable": 1},
    }
    return [window, budget], opened + timedelta(seconds=seconds)


def apply_controls(demo: Demo) -> None:
    """kubectl apply the window and the budget before the worker (and its controller) starts."""
    objects, demo.window_closes = demo_controls(datetime.now(UTC))
    path = demo.settings.state_dir / CONTROLS_FILE
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    console.print(
        f"MaintenanceWindow {WINDOW}: no expiration or consolidation of NodePool default's nodes in "
        f"us-west-2a until {demo.window_closes:%H:%M:%S}Z (soft expiration: the expired node waits, then "
        f"goes). NodeDisruptionBudget {NDB}: at most one node of us-west-2a unavailable at a time, "
        "whatever disrupts it.",
        highlight=False,
        soft_wrap=True,
    )
    sys.stdout.write(path.read_text())
    demo.kubectl("apply", "-f", str(path))
    demo.kubectl("get", "maintenancewindows,nodedisruptionbudgets")
    demo.karpflow("windows", "--kubeconfig", str(demo.settings.kubeconfig_path))


def start_worker(demo: Demo) -> None:
    """`karpflow dev up` again, with the worker: its ControllerWorkflow starts planning at once."""
    demo.stack.settings.worker = True
    try:
        bring_up(demo.stack)
    except DevStackError as err:
        raise DemoFailure(f"the worker did not start: {err}") from None


def held_by_controls(blocked: dict[str, str]) -> dict[str, str]:
    """The nodes the controller's last pass held back because of a window or a budget, and why."""
    return {node: why for node, why in blocked.items() if any(kind in why for kind in CONTROL_KINDS)}


def control_of(why: str) -> str:
    """`MaintenanceWindow demo-expire-later` out of a reason that names one."""
    found = re.search(rf"({'|'.join(CONTROL_KINDS)}) (\S+)", why)
    return f"{found[1]} {found[2]}" if found else why


def note_held(demo: Demo, blocked: dict[str, str], elapsed: float) -> None:
    """Say when a control first holds a node back (from the status query). A node stays "held" until
    a disruption takes it (`note_let_go`): one pass may give another reason for a while."""
    from sim.disruption_rows import short_node

    demo.last_blocked = blocked
    demo.holding = held_by_controls(blocked)
    for node, why in sorted(demo.holding.items()):
        if node not in demo.held and node not in demo.let_go:
            demo.held[node] = why
            line = f"{elapsed:5.1f}s  held back {short_node(node)}: {why}"
            console.print(line, highlight=False, soft_wrap=True)


def note_let_go(demo: Demo, nodes: list[str], reason: str, elapsed: float) -> None:
    """A disruption took nodes a control had held back: say which control let them go."""
    from sim.disruption_rows import short_node

    for node in nodes:
        if node in demo.held:
            why = demo.held.pop(node)
            demo.let_go[node] = f"held back by {control_of(why)}, then taken ({reason})"
            console.print(
                f"{elapsed:5.1f}s  let go {short_node(node)}: {control_of(why)} no longer holds it; "
                f"{reason} takes it",
                highlight=False,
                soft_wrap=True,
            )


def window_open(demo: Demo) -> bool:
    return demo.window_closes is not None and datetime.now(UTC) < demo.window_closes


def show_controls_afterwards(demo: Demo) -> None:
    """What the window and the budget held back, as the controller said and as Events on the nodes."""
    from sim.disruption_rows import short_node

    for node, why in sorted(demo.let_go.items()):
        console.print(f"{short_node(node)}: {why}", highlight=False, soft_wrap=True)
    for node, why in sorted(demo.held.items()):
        now = demo.last_blocked.get(node, "no longer a candidate")
        line = f"{short_node(node)}: held back by {control_of(why)}; now: {now}"
        console.print(line, highlight=False, soft_wrap=True)
    if not demo.let_go and not demo.held:
        console.print("The controls held nothing back this time.")
    for reason in ("DisruptionWaitingWindow", "DisruptionWaitingNodeDisruptionBudget"):
        demo.kubectl("get", "events", "-A", "--field-selector", f"reason={reason}")
    demo.karpflow("windows", "--kubeconfig", str(demo.settings.kubeconfig_path))


# -- what the controller will decide -------------------------------------------------------------


def plan_pass(demo: Demo) -> None:
    """`karpflow plan` (what a user would run) on a dump of the live cluster: what a pass decides, and
    why every other node stays (the window and the budget included). The controller, which starts
    with the worker next, plans on the same objects."""
    at = datetime.now(UTC).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="karpflow-demo-") as tmp:
        snapshot_file = Path(tmp) / "cluster.json"
        snapshot_file.write_text(json.dumps(demo.cluster()))
        demo.karpflow("plan", "--snapshot", str(snapshot_file), "--at", at.strftime("%Y-%m-%dT%H:%M:%SZ"))


# -- the controller at work ----------------------------------------------------------------------


async def _disruptions(client: Any, task_queue: str) -> dict[str, Any]:
    query = f"TaskQueue = '{task_queue}' AND WorkflowType = 'DisruptionWorkflow'"
    return {e.id: e async for e in client.list_workflows(query)}


async def _outcome(client: Any, execution: Any) -> Any:
    """A DisruptionProgress row from a closed DisruptionWorkflow (its result or its failure)."""
    from api import search_attributes as sa
    from api.workflow_io import DisruptionStatus
    from sim.disruption_rows import DisruptionProgress

    handle = client.get_workflow_handle(execution.id, run_id=execution.run_id, result_type=DisruptionStatus)
    row = DisruptionProgress(
        workflow_id=execution.id,
        reason=execution.typed_search_attributes.get(sa.REASON) or "",
        nodes=list(execution.typed_search_attributes.get(sa.NODES) or ()),
        execution=execution.status.name.title() if execution.status else "Running",
    )
    try:
        status = await handle.result()
        row.phase = status.phase
        row.replaced_by = [r.node for r in status.replacements if r.state == "Initialized" and r.node]
        # A delete goes on with the candidates it could take (an "empty" node a pod just moved to is
        # not empty any more): the others stay, and say why.
        row.kept = {c.node: c.message for c in status.candidates if not c.tainted}
    except Exception as err:
        row.failure = str(getattr(err, "cause", None) or err)
    return row


def watch_controller(demo: Demo) -> None:
    """Follow what the controller starts until it has nothing left to start and nothing is in flight."""
    from api.controller_io import ControllerStatus
    from api.workflow_ids import controller_workflow_id
    from sim.disruption_rows import short_node, ui_workflows_url

    s, client = demo.settings, demo.temporal()
    handle = client.get_workflow_handle(controller_workflow_id(s.cluster_name))
    console.print(
        f"The worker started {handle.id}. Watch it with:\n"
        f"  temporal workflow query --address {s.temporal_address} --workflow-id {handle.id} --name status\n"
        f"  karpflow status   (after `source {s.state_dir}/env`)\n"
        f"  temporal workflow list --address {s.temporal_address} "
        "--query \"WorkflowType = 'DisruptionWorkflow'\"",
        highlight=False,
        soft_wrap=True,
    )
    if s.ui:
        query = "WorkflowType IN ('DisruptionWorkflow', 'TerminationWorkflow')"
        url = ui_workflows_url(s.ui_url, s.temporal_namespace, query)
        console.print(f"In the Temporal Web UI: [link={url}]{url}[/link]", soft_wrap=True)
    began, seen, closed, calm = time.monotonic(), {}, {}, 0
    window_said = False
    status = ControllerStatus()
    while True:
        elapsed = time.monotonic() - began
        if elapsed > demo.timeout:
            raise DemoFailure(
                f"the controller was still busy after {demo.timeout:.0f}s: {status.model_dump_json()}"
            )
        executions = demo.run(_disruptions(client, "karpflow"))
        for workflow_id, execution in sorted(executions.items()):
            if workflow_id not in seen:
                seen[workflow_id] = execution
                nodes = ", ".join(
                    short_node(n) for n in execution.typed_search_attributes.get(_nodes_key()) or ()
                )
                console.print(
                    f"{elapsed:5.1f}s  started {workflow_id}  ({nodes})", highlight=False, soft_wrap=True
                )
                note_let_go(
                    demo,
                    list(execution.typed_search_attributes.get(_nodes_key()) or ()),
                    execution.typed_search_attributes.get(_reason_key()) or "a disruption",
                    elapsed,
                )
            if (
                execution.status is not None
                and execution.status.name != "RUNNING"
                and workflow_id not in closed
            ):
                closed[workflow_id] = demo.run(_outcome(client, execution))
                row = closed[workflow_id]
                console.print(
                    f"{elapsed:5.1f}s  {workflow_id}: {row.execution.lower()}"
                    + (f", replaced by {', '.join(row.replaced_by)}" if row.replaced_by else "")
                    + "".join(f"; kept {short_node(n)}: {why}" for n, why in sorted(row.kept.items()))
                    + (f": {row.failure}" if row.failure else ""),
                    highlight=False,
                    soft_wrap=True,
                )
        try:
            status = demo.run(handle.query("status", result_type=ControllerStatus))
        except Exception:
            status = ControllerStatus()
        if status.passes > 0:
            note_held(demo, status.blocked, elapsed)
        if demo.window_closes is not None and not window_open(demo) and not window_said:
            window_said = True
            console.print(f"{elapsed:5.1f}s  MaintenanceWindow {WINDOW} closed", highlight=False)
        settled = (
            status.passes > 0
            and not status.started
            and not status.in_flight
            and not status.validating
            and len(closed) == len(seen)
            # The demo shows the controls letting go: a window still open holds the expired node.
            and not window_open(demo)
            and not demo.holding
        )
        calm = calm + 1 if settled else 0
        if calm >= 3:
            break
        time.sleep(max(0.3, 0.5 * s.time_scale * 20))
    demo.outcomes = list(closed.values())
    demo.started = list(seen)
    failed = [row for row in demo.outcomes if not row.succeeded]
    if failed:
        raise DemoFailure(f"{len(failed)} of {len(demo.outcomes)} disruption(s) did not succeed")
    waiting = f"; {len(status.waiting)} node(s) wait for consolidateAfter" if status.waiting else ""
    console.print(
        f"[green]The controller settled[/green] after {time.monotonic() - began:.1f}s "
        f"and {status.passes} passes: "
        f"{len(demo.outcomes)} disruption(s) succeeded, nothing in flight{waiting}"
        + (" (quiet: converged under the current rules)." if status.quiet else "."),
    )


def _nodes_key() -> Any:
    from api import search_attributes as sa

    return sa.NODES


def _reason_key() -> Any:
    from api import search_attributes as sa

    return sa.REASON


# -- afterwards ----------------------------------------------------------------------------------


def show_changes(demo: Demo) -> None:
    """The nodes again: which went, which came, and that every completed disruption's nodes are gone."""
    demo.kubectl("get", "nodes", "-L", NODE_COLUMNS)
    nodes = {o["metadata"]["name"]: o for o in demo.cluster()["items"] if o.get("kind") == "Node"}
    now = set(nodes)
    gone, added = sorted(demo.nodes_before - now), sorted(now - demo.nodes_before)
    console.print(f"{len(demo.nodes_before)} nodes before, {len(now)} now.", highlight=False)
    console.print(f"Gone ({len(gone)}): {', '.join(gone) or '-'}", highlight=False, soft_wrap=True)
    console.print(f"New ({len(added)}):{'' if added else ' -'}", highlight=False)
    for name in added:
        console.print(f"  {new_node_line(nodes[name], demo.outcomes)}", highlight=False, soft_wrap=True)
    left = sorted({n for row in demo.outcomes if row.succeeded for n in row.taken} & now)
    if left:
        raise DemoFailure(f"node(s) of completed disruptions still in the cluster: {', '.join(left)}")


def new_node_line(node: dict[str, Any], outcomes: list[Any]) -> str:
    """`<name>: r5.large spot in us-west-2b, launched by <workflow> to replace <nodes> (Drifted)`:
    what a node that joined during the demo is, and which disruption launched it."""
    from api.constants import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL
    from sim.disruption_rows import short_node

    name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
    what = " ".join(labels.get(key, "?") for key in (INSTANCE_TYPE_LABEL, CAPACITY_TYPE_LABEL))
    line = f"{name}: {what} in {labels.get(ZONE_LABEL, '?')}"
    for row in outcomes:
        if name in row.replaced_by:
            replaced = ", ".join(short_node(n) for n in row.nodes)
            return f"{line}, launched by {row.workflow_id} to replace {replaced} ({row.reason})"
    return f"{line}, not launched by a disruption of this demo"


def check_invariants(demo: Demo) -> None:
    """The checker's report, with the nodes of open karpflow workflows as the disruptions in flight."""
    from sim.invariants import nodes_in_flight

    in_flight = sorted(demo.run(nodes_in_flight(demo.temporal())))
    console.print(
        f"In flight (nodes of open karpflow workflows): {', '.join(in_flight) or 'none'}", highlight=False
    )
    query = urllib.parse.quote(",".join(in_flight))
    report = demo.sim.request("GET", f"/sim/invariants?in_flight={query}")
    print_report(report, console)
    if not report["ok"]:
        raise DemoFailure(f"the invariant checker found {len(report['violations'])} violation(s)")


def show_temporal(demo: Demo) -> None:
    """Where this demo's workflows can be looked at (while the stack runs: `--keep`)."""
    from sim.disruption_rows import ui_workflows_url

    s = demo.settings
    console.print(
        f"Every workflow of this demo (the controller, {len(demo.started)} disruption(s) "
        "and their terminations):\n"
        f"  temporal workflow list --address {s.temporal_address} --namespace {s.temporal_namespace}",
        highlight=False,
        soft_wrap=True,
    )
    if s.ui:
        url = ui_workflows_url(s.ui_url, s.temporal_namespace, "WorkflowType = 'DisruptionWorkflow'")
        console.print(
            f"  Temporal Web UI: [link={s.ui_url}]{s.ui_url}[/link]; the disruptions only: {url}",
            soft_wrap=True,
        )
    if not demo.keep:
        console.print("The stack stops now; `karpflow demo --keep` leaves it running to look around.")


# -- the story -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    title: str
    run: Callable[[Demo], Any]
    after_failure: bool = False  # shows the end state: runs even when an earlier step failed
    only_if: Callable[[Demo], bool] = lambda demo: True


def story() -> list[Step]:
    return [
        Step("The simulated cluster, through the real kubectl", show_cluster),
        Step("Its EC2 instances, in moto", show_instances),
        Step("The operator's controls: a MaintenanceWindow and a NodeDisruptionBudget", apply_controls),
        Step(
            "What the controller's first pass will decide: karpflow's planner on the live cluster", plan_pass
        ),
        Step("The worker starts, and its controller with it", start_worker),
        Step(
            "The controller at work: it plans, validates and starts disruptions on its own", watch_controller
        ),
        Step("The nodes afterwards", show_changes, after_failure=True),
        Step("The EC2 instances afterwards", show_instances, after_failure=True),
        Step(
            "What the window and the budget held back",
            show_controls_afterwards,
            after_failure=True,
            only_if=lambda demo: demo.window_closes is not None,
        ),
        Step("The invariant checker's report", check_invariants, after_failure=True),
        Step("Temporal", show_temporal, after_failure=True),
    ]


def tell(demo: Demo, steps: list[Step]) -> list[str]:
    """Run the steps in order; return the failures (empty: the demo went as it should)."""
    failures: list[str] = []
    for step in steps:
        if (failures and not step.after_failure) or not step.only_if(demo):
            continue
        console.print(Rule(step.title))
        try:
            step.run(demo)
        except DemoFailure as err:
            console.print(f"[bold red]Failed:[/bold red] {err}", highlight=False)
            failures.append(str(err))
        except Exception as err:  # a bug or a part that stopped answering: show it, then the end state
            console.print_exception()
            failures.append(f"{step.title}: {err}")
    return failures


# -- the stack -----------------------------------------------------------------------------------

PORTS = {
    "temporal_port": "Temporal",
    "ui_port": "Temporal Web UI",
    "kube_port": "Kubernetes emulator",
    "moto_port": "EC2 (moto)",
}


def demo_settings(flags: dict[str, Any]) -> tuple[DevSettings, bool]:
    """The demo's stack: `<state dir>/demo` unless --state-dir, free ports where the defaults are busy.

    Returns the settings and whether the state directory is the demo's own (safe to wipe)."""
    settings = settings_from_flags(**flags)
    own = flags.get("state_dir") is None
    if own:
        dev_dir = settings.state_dir
        settings.state_dir = dev_dir / "demo"
        if DevStack.from_state_dir(dev_dir).running():
            console.print(
                f"A dev stack runs in {dev_dir}: the demo leaves it alone and runs its own stack in "
                f"{settings.state_dir}.",
                highlight=False,
            )
    previous = DevStack.from_state_dir(settings.state_dir)
    if previous.running():
        if not own:
            raise DevStackError(
                f"a stack already runs in {settings.state_dir}; the demo disrupts its cluster, so it starts "
                f"its own: stop that one (`karpflow dev down --state-dir {settings.state_dir}`) or choose "
                "another --state-dir"
            )
        console.print(
            f"Stopping the demo stack an earlier `karpflow demo --keep` left in {settings.state_dir}."
        )
        previous.down()
    if own:
        previous.purge()  # a fresh Temporal history and logs for this run
    for name, label in PORTS.items():
        port = getattr(settings, name)
        if flags.get(name) is None and not port_is_free(settings.host, port):
            setattr(settings, name, free_port(settings.host))
            console.print(
                f"Port {port} ({label}) is in use; the demo uses {getattr(settings, name)} instead.",
                highlight=False,
            )
    return settings, own


def fast_worker_polling(time_scale: float) -> None:
    """The worker's waits follow the demo's time scale: it looks at a booting node and a terminating
    instance as often as the sped-up simulator changes them (the worker reads KARPFLOW_* settings from
    the environment the stack starts it with; values already set win)."""
    os.environ.setdefault("KARPFLOW_POLL_INTERVAL", f"{max(0.1, 1.0 * time_scale):g}")
    os.environ.setdefault("KARPFLOW_EC2_POLL_INTERVAL", f"{max(0.2, 5.0 * time_scale):g}")
    # The controller's pass interval (10 s) and validation delay (15 s), scaled the same way.
    os.environ.setdefault("KARPFLOW_CONTROLLER_INTERVAL", f"{max(0.3, 10.0 * time_scale):g}")
    os.environ.setdefault("KARPFLOW_CONTROLLER_VALIDATION", f"{max(0.5, 15.0 * time_scale):g}")


def bring_down(stack: DevStack, keep: bool, own: bool, failed: bool) -> None:
    s = stack.settings
    if keep:
        console.print(Rule())
        console.print(
            f"The stack keeps running. source {s.state_dir / 'env'}; "
            f"`karpflow dev status --state-dir {s.state_dir}`; "
            f"`karpflow dev down --state-dir {s.state_dir}` to stop it.",
            highlight=False,
            soft_wrap=True,
        )
        return
    console.print(Rule("Stopping the local stack"))
    stopped = stack.down()
    if failed:
        console.print(f"Stopped {', '.join(stopped)}. Logs: {s.logs_dir}", highlight=False)
    elif own:
        (s.state_dir / CONTROLS_FILE).unlink(missing_ok=True)  # the demo wrote it: it goes too
        left = stack.purge()
        console.print(f"Stopped {', '.join(stopped)}. {purged_message(s.state_dir, left)}", highlight=False)
    else:
        console.print(f"Stopped {', '.join(stopped)}.")


def exit_now(code: int) -> None:
    """Flush and leave at once: a process that used the Temporal client can abort while the
    interpreter finalizes (sdk-python #300), which would turn a good demo into exit 134."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@click.command()
@stack_options
@click.option(
    "--scenario",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_SCENARIO,
    show_default=True,
    help="Cluster to seed.",
)
@click.option("--time-scale", type=float, default=0.05, show_default=True, help="Factor on simulated delays.")
@click.option(
    "--timeout",
    type=float,
    default=240.0,
    show_default=True,
    help="Seconds the controller may take to settle before the demo fails.",
)
@click.option(
    "--keep", is_flag=True, help="Leave the stack running afterwards (stop it with `karpflow dev down`)."
)
def demo(keep: bool, timeout: float, **flags: Any) -> None:
    """Start a local stack, let karpflow disrupt its simulated cluster through Temporal, check the result.

    \b
    Where its stack lives (never a running dev stack's):
      without --state-dir: demo/ inside the dev stack's state directory
        (KARPFLOW_STATE_DIR, else .state/ of the checkout or of the current directory:
      .state/demo/), wiped at the start and removed after a clean run;
      with --state-dir DIR: DIR itself, refused while a stack runs there, and left in place.
    Busy ports are replaced by free ones unless given as flags. Exit status 1 when a disruption fails
    or the invariant checker reports a violation."""
    started_at = time.monotonic()
    try:
        settings, own = demo_settings(flags)
    except DevStackError as err:
        console.print(f"[red]The demo cannot start:[/red] {err}", highlight=False)
        sys.exit(1)
    fast_worker_polling(settings.time_scale)
    # The worker (and its controller) starts after the demo applied the operator's controls: its
    # first pass must see them (`start_worker`).
    settings.worker = False
    stack = DevStack(settings)
    console.print(Rule("Starting the local stack"))
    try:
        bring_up(stack)
    except DevStackError as err:
        console.print(f"[red]The stack did not start:[/red] {err}", highlight=False)
        sys.exit(1)
    console.print(endpoints_table(stack))
    context = Demo(stack=stack, sim=SimClient(stack.settings.kube_url), timeout=timeout, keep=keep)
    failures = ["stopped early"]  # until the story has been told
    try:
        failures = tell(context, story())
    except KeyboardInterrupt:
        failures = ["interrupted"]
    finally:
        context.close()
        bring_down(stack, keep, own, failed=bool(failures))
    elapsed = time.monotonic() - started_at
    if failures:
        console.print(f"[bold red]Demo failed[/bold red] after {elapsed:.0f}s: {'; '.join(failures)}")
        exit_now(1)
    console.print(f"Demo finished in {elapsed:.0f}s.")
    exit_now(0)
