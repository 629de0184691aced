"""`karpflow demo` (what `make demo` runs): karpflow disrupting a simulated cluster, step by step.

The story (`story()`, a list of `Step`s, each a title and a small function of a `Demo`):

1. the cluster through the real kubectl, and its EC2 instances in moto;
2. a disruption pass: the planner on the live cluster, its commands started as DisruptionWorkflows
   (through the Temporal client, as `karpflow disrupt` or the controller will), followed until they
   finish; then more passes on the changed cluster while the planner finds work (`--passes`);
3. the cluster afterwards (nodes gone, replacements added, instances terminated), and the invariant
   checker's report with the open workflows as the disruptions "in flight": it must be clean.

A step that fails raises `DemoFailure`: the steps after it are skipped except those that show the
end state (`after_failure`), and the demo exits 1.

The demo runs its own stack in `<state dir>/demo` (`.state/demo/`), never a dev stack started by
`karpflow dev up`: it disrupts the cluster, which must not happen to a developer's. Ports that are
busy (a dev stack, anything else) are replaced by free ones unless given as flags, and the demo says
so. A demo stack left by `--keep` is stopped and its state removed when the next demo starts; the
stack is stopped (and, after a clean run, its state removed) at the end unless `--keep`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.live import Live
from rich.rule import Rule
from rich.table import Table

from sim.cli import SimClient, dump_as_list, instances_table, print_report
from sim.devstack import DEFAULT_SCENARIO, DevSettings, DevStack, DevStackError
from sim.devstack_cli import bring_up, endpoints_table, settings_from_flags, stack_options
from sim.ports import free_port, port_is_free

# Tables as wide as kubectl's lines when the output is not a terminal (a log, CI).
console = Console() if sys.stdout.isatty() else Console(width=160)

T = TypeVar("T")
NODE_COLUMNS = "karpenter.sh/nodepool,karpenter.sh/capacity-type,node.kubernetes.io/instance-type"


class DemoFailure(Exception):
    """Something the demo showed went wrong (a workflow failed, an invariant was violated)."""


@dataclass
class Demo:
    """The running stack and what the story has seen so far."""

    stack: DevStack
    sim: SimClient
    timeout: float = 120.0  # wall seconds one pass's workflows may take
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    nodes_before: set[str] = field(default_factory=set)
    pass_number: int = 0
    plan: Any = None  # the current pass's planner.plan.Plan
    settled: bool = False  # a pass found nothing to do
    started: list[Any] = field(default_factory=list)  # every StartedDisruption, all passes
    current: list[Any] = field(default_factory=list)  # those of the current pass
    outcomes: list[Any] = field(default_factory=list)  # every final DisruptionProgress
    savings: dict[str, float] = field(default_factory=dict)  # workflow id -> $/h its command saves
    keep: bool = False  # the stack stays up after the demo
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

    def kubectl(self, *args: str) -> None:
        """Run the real kubectl against the emulator and show exactly what it prints."""
        command = ["kubectl", "--kubeconfig", str(self.settings.kubeconfig_path), *args]
        console.print(f"[bold cyan]$ kubectl {' '.join(args)}[/bold cyan]", highlight=False)
        result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        sys.stdout.write(result.stdout)
        if result.returncode != 0:
            console.print(f"[red]{result.stderr.strip()}[/red]", highlight=False)
        sys.stdout.flush()

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


# -- one disruption pass: plan, start, follow ----------------------------------------------------


def plan_pass(demo: Demo) -> None:
    """The planner on the live cluster: what one disruption pass decides, and why every other node stays.

    The first pass shows `karpflow plan` (what a user would run) in full; later passes only the
    commands. The Command objects the next step starts come from the planner in process, on the same
    snapshot and time as the printed plan."""
    from planner.catalog import DEFAULT_REGION, bundled_catalog
    from planner.plan import plan
    from planner.snapshot import load_snapshot

    demo.pass_number += 1
    at = datetime.now(UTC).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="karpflow-demo-") as tmp:
        snapshot_file = Path(tmp) / "cluster.json"
        snapshot_file.write_text(json.dumps(demo.cluster()))
        if demo.pass_number == 1:
            demo.karpflow("plan", "--snapshot", str(snapshot_file), "--at", at.strftime("%Y-%m-%dT%H:%M:%SZ"))
        snapshot = load_snapshot(snapshot_file, now=at)
    demo.plan = plan(snapshot, bundled_catalog(snapshot.region() or DEFAULT_REGION))
    if demo.pass_number > 1:
        show_commands(demo.plan)
    if not demo.plan.commands_:
        demo.settled = True
        console.print("Nothing left to disrupt: the cluster is where its NodePools want it.")


def show_commands(plan: Any) -> None:
    """The commands of a plan in short (what `karpflow plan` lists first)."""
    from sim.plan_runner import short_node

    summary = plan.summary
    console.print(
        f"{summary.nodes} nodes, {summary.candidates} candidates; "
        + (f"the pass ends after {summary.ended_by}" if summary.ended_by else "no method found work"),
        highlight=False,
    )
    if not plan.commands:
        return
    table = Table(title="Commands", title_justify="left")
    for column in ("method", "reason", "decision", "nodes", "replacements", "savings/h"):
        table.add_column(column, justify="right" if column == "savings/h" else "left")
    for command in plan.commands:
        table.add_row(
            command.method,
            command.reason,
            command.decision,
            "\n".join(short_node(n) for n in command.nodes),
            "\n".join(f"{r.nodepool}: {', '.join(r.instance_types[:3])}" for r in command.replacements)
            or "-",
            f"${command.savings_per_hour:.4f}",
        )
    console.print(table)


def start_commands(demo: Demo) -> None:
    """Each command becomes one DisruptionWorkflow on the worker's task queue."""
    from sim.plan_runner import short_node, start_disruptions, ui_workflows_url, workflows_query

    commands = demo.plan.commands_
    demo.current = demo.run(start_disruptions(demo.temporal(), commands))
    demo.started += demo.current
    demo.savings.update(
        {s.workflow_id: c.savings_per_hour for s, c in zip(demo.current, commands, strict=True)}
    )
    table = Table(title=f"Started {len(demo.current)} DisruptionWorkflow(s)", title_justify="left")
    for column in ("Workflow id", "Method", "Decision", "Nodes", "Replacements"):
        table.add_column(column)
    for s in demo.current:
        table.add_row(
            s.workflow_id + (" (already running)" if s.already_running else ""),
            s.method,
            s.decision,
            "\n".join(short_node(n) for n in s.nodes),
            "\n".join(s.replacements) or "-",
        )
    console.print(table)
    query = workflows_query(n for s in demo.current for n in s.nodes)
    settings = demo.settings
    if settings.ui:
        url = ui_workflows_url(settings.ui_url, settings.temporal_namespace, query)
        # soft_wrap: a URL broken over lines cannot be clicked or copied.
        console.print(
            f"In the Temporal Web UI (disruptions and their terminations):\n  [link={url}]{url}[/link]",
            soft_wrap=True,
        )
    address, first = settings.temporal_address, demo.current[0].workflow_id
    console.print(
        "With the temporal CLI:\n"
        f'  temporal workflow list --address {address} --query "{query}"\n'
        f"  temporal workflow query --address {address} --workflow-id {first} --name status",
        highlight=False,
        soft_wrap=True,
    )


def follow_commands(demo: Demo) -> None:
    """Poll the workflows (`status` and `phase` queries) until they finish; fail on any failure."""
    from sim.plan_runner import FollowTimeout, follow_disruptions

    began = time.monotonic()
    try:
        with ProgressView(f"Pass {demo.pass_number}", began) as view:
            rows = demo.run(
                follow_disruptions(
                    demo.temporal(), demo.current, within=demo.timeout, on_progress=view.update
                )
            )
    except FollowTimeout as err:
        demo.outcomes += err.rows
        raise DemoFailure(f"{err}. They keep running; see `temporal workflow describe`.") from None
    demo.outcomes += rows
    failed = [row for row in rows if not row.succeeded]
    for row in failed:
        console.print(f"[red]{row.workflow_id} {row.execution.lower()}:[/red] {row.failure}", highlight=False)
    if failed:
        raise DemoFailure(f"{len(failed)} of {len(rows)} disruption(s) did not succeed")
    gone = sum(len(row.nodes) for row in rows)
    added = [n for row in rows for n in row.replaced_by]
    console.print(
        f"[green]All {len(rows)} disruption(s) succeeded[/green] in {time.monotonic() - began:.1f}s: "
        f"{gone} node(s) drained and terminated"
        + (f", {len(added)} replacement(s) joined: {', '.join(added)}" if added else "")
        + "."
    )


class ProgressView:
    """A live table in a terminal; one line per change elsewhere (logs, CI)."""

    def __init__(self, title: str, began: float) -> None:
        self.title, self.began = title, began
        self.live: Live | None = None
        self.last: dict[str, str] = {}

    def __enter__(self) -> ProgressView:
        if console.is_terminal:
            self.live = Live(console=console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)  # type: ignore[arg-type]

    def update(self, rows: list[Any]) -> None:
        from sim.plan_runner import progress_line, progress_table

        elapsed = time.monotonic() - self.began
        if self.live is not None:
            self.live.update(progress_table(rows, title=f"{self.title}, {elapsed:.0f}s"))
            return
        for row in rows:
            line = progress_line(row)
            if self.last.get(row.workflow_id) != line:
                self.last[row.workflow_id] = line
                console.print(f"{elapsed:5.1f}s  {line}", highlight=False, soft_wrap=True)


def has_commands(demo: Demo) -> bool:
    return bool(demo.plan is not None and demo.plan.commands_)


def another_pass(demo: Demo) -> bool:
    return not demo.settled


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
    succeeded = [row.workflow_id for row in demo.outcomes if row.succeeded]
    if succeeded:
        saved = sum(demo.savings.get(workflow_id, 0.0) for workflow_id in succeeded)
        console.print(
            f"karpflow carried out {len(succeeded)} disruption(s); by the planner's prices the cluster "
            f"now costs ${saved:.4f}/h less.",
            highlight=False,
        )
    left = sorted({n for row in demo.outcomes if row.succeeded for n in row.nodes} & now)
    if left:
        raise DemoFailure(f"node(s) of completed disruptions still in the cluster: {', '.join(left)}")


def new_node_line(node: dict[str, Any], outcomes: list[Any]) -> str:
    """`<name>: r5.large spot in us-west-2b, launched by <workflow> to replace <nodes> (Drifted)`:
    what a node that joined during the demo is, and which disruption launched it."""
    from api.constants import CAPACITY_TYPE_LABEL, INSTANCE_TYPE_LABEL, ZONE_LABEL
    from sim.plan_runner import short_node

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
    from sim.plan_runner import ui_workflows_url

    s = demo.settings
    console.print(
        f"Every workflow of this demo ({len(demo.started)} disruption(s) and their terminations):\n"
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


def disruption_pass(number: int) -> list[Step]:
    """Plan on the live cluster, start the commands, follow them; later passes only while there is work."""
    if number == 1:
        first = Step("Pass 1: what karpflow's planner decides on the live cluster", plan_pass)
    else:
        first = Step(f"Pass {number}: the planner on the changed cluster", plan_pass, only_if=another_pass)
    return [
        first,
        Step(
            f"Pass {number}: karpflow starts its commands as workflows", start_commands, only_if=has_commands
        ),
        Step(f"Pass {number}: following the workflows", follow_commands, only_if=has_commands),
    ]


def story(passes: int) -> list[Step]:
    return [
        Step("The simulated cluster, through the real kubectl", show_cluster),
        Step("Its EC2 instances, in moto", show_instances),
        *[step for number in range(1, passes + 1) for step in disruption_pass(number)],
        Step("The nodes afterwards", show_changes, after_failure=True),
        Step("The EC2 instances afterwards", show_instances, after_failure=True),
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
        stack.purge()
        console.print(f"Stopped {', '.join(stopped)} and removed {s.state_dir}.", highlight=False)
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
    "--passes",
    type=click.IntRange(1, 20),
    default=6,
    show_default=True,
    help="At most this many disruption passes (plan, start, follow); one that finds nothing ends them.",
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds one pass's workflows may take before the demo fails.",
)
@click.option(
    "--keep", is_flag=True, help="Leave the stack running afterwards (stop it with `karpflow dev down`)."
)
def demo(keep: bool, passes: int, timeout: float, **flags: Any) -> None:
    """Start a local stack, let karpflow disrupt its simulated cluster through Temporal, check the result.

    The demo runs its own stack in <state dir>/demo (default .state/demo), never a running dev stack;
    busy ports are replaced by free ones unless given as flags. Exit status 1 when a disruption fails
    or the invariant checker reports a violation."""
    started_at = time.monotonic()
    try:
        settings, own = demo_settings(flags)
    except DevStackError as err:
        console.print(f"[red]The demo cannot start:[/red] {err}", highlight=False)
        sys.exit(1)
    fast_worker_polling(settings.time_scale)
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
        failures = tell(context, story(passes))
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
