"""`karpflow demo` (what `make demo` runs): the local stack and the simulated cluster, step by step.

The demo is a list of steps (`STEPS`), each a title and a function of a `Demo` (the running stack,
kubectl and the simulator client). Later work appends steps — start a disruption, watch it in the
Temporal UI, check the invariants afterwards — without touching the ones before.

It brings the dev stack up in the project's state directory (or reuses one that already runs, and
then leaves it running), at a time scale where nodes register in seconds, and brings it down at the
end unless `--keep`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.rule import Rule

from sim.cli import SimClient, dump_as_list, instances_table, print_report
from sim.devstack import DEFAULT_SCENARIO, DevSettings, DevStack, DevStackError
from sim.devstack_cli import endpoints_table, settings_from_flags, stack_options

# Tables as wide as kubectl's lines when the output is not a terminal (a log, CI).
console = Console() if sys.stdout.isatty() else Console(width=160)


@dataclass
class Demo:
    stack: DevStack
    sim: SimClient
    notes: list[str] = field(default_factory=list)

    @property
    def settings(self) -> DevSettings:
        return self.stack.settings

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


def show_cluster(demo: Demo) -> None:
    demo.kubectl("get", "nodes", "-o", "wide", "-L", "karpenter.sh/nodepool,karpenter.sh/capacity-type")
    demo.kubectl("get", "pods", "-A", "-o", "wide")
    demo.kubectl("get", "pdb", "-A")
    demo.kubectl("get", "nodepools")
    demo.kubectl("get", "ec2nodeclasses")


def show_instances(demo: Demo) -> None:
    status = demo.sim.request("GET", "/sim/status")
    console.print(instances_table(status["ec2_endpoint"], status["region"], status["cluster_name"]))
    console.print("Every Node's spec.providerID names one of these instances; karpflow terminates them.")


def show_plan(demo: Demo) -> None:
    """The planner on the live cluster (read-only): what one disruption pass would do, and why."""
    document = dump_as_list(demo.sim.request("GET", "/sim/state"))
    with tempfile.TemporaryDirectory(prefix="karpflow-demo-") as tmp:
        snapshot = Path(tmp) / "cluster.json"
        snapshot.write_text(json.dumps(document))
        demo.karpflow("plan", "--snapshot", str(snapshot))


def show_invariants(demo: Demo) -> None:
    print_report(demo.sim.request("GET", "/sim/invariants"), console)


def show_temporal(demo: Demo) -> None:
    s = demo.settings
    if s.ui:
        console.print(
            f"Temporal Web UI: [link={s.ui_url}]{s.ui_url}[/link] (namespace {s.temporal_namespace})"
        )
    console.print(
        f"Workflows from the CLI:  temporal workflow list --address {s.temporal_address} "
        "--query \"KarpflowNodePool = 'default'\"",
        highlight=False,
    )


Step = tuple[str, Callable[[Demo], Any]]

STEPS: list[Step] = [
    ("The simulated cluster, through the real kubectl", show_cluster),
    ("Its EC2 instances, in moto", show_instances),
    ("What karpflow's planner would do on it now", show_plan),
    ("The invariant checker's report", show_invariants),
    ("Temporal", show_temporal),
]


def bring_up(stack: DevStack) -> list[str]:
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as bar:
        tasks: dict[str, Any] = {}

        def report(part: str, message: str) -> None:
            if part not in tasks:
                tasks[part] = bar.add_task(f"{part}: {message}", total=1)
            bar.update(tasks[part], description=f"{part}: {message}")
            if message in ("ready", "already running"):
                bar.update(tasks[part], completed=1)

        return stack.up(report)


@click.command()
@stack_options
@click.option(
    "--scenario",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_SCENARIO,
    show_default=True,
    help="Cluster to seed.",
)
@click.option("--time-scale", type=float, default=0.1, show_default=True, help="Factor on simulated delays.")
@click.option(
    "--keep", is_flag=True, help="Leave the stack running afterwards (stop it with `karpflow dev down`)."
)
def demo(keep: bool, **flags: Any) -> None:
    """Bring up the local stack, show the simulated cluster and what karpflow sees, bring it down."""
    started_at = time.monotonic()
    stack = DevStack(settings_from_flags(**flags))
    reused = stack.running()
    if reused:
        stack = DevStack.from_state_dir(stack.settings.state_dir)
        console.print(f"Using the dev stack already running in {stack.settings.state_dir}; it stays up.")
    console.print(Rule("Starting the local stack"))
    try:
        bring_up(stack)
    except DevStackError as err:
        console.print(f"[red]The stack did not start:[/red] {err}", highlight=False)
        sys.exit(1)
    console.print(endpoints_table(stack))
    context = Demo(stack=stack, sim=SimClient(stack.settings.kube_url))
    try:
        for title, step in STEPS:
            console.print(Rule(title))
            step(context)
    finally:
        if keep or reused:
            console.print(Rule())
            console.print(
                f"The stack keeps running. export KUBECONFIG={stack.settings.kubeconfig_path}; "
                "`karpflow dev status`; `karpflow dev down` (or `make down`) to stop it.",
                highlight=False,
            )
        else:
            console.print(Rule("Stopping the local stack"))
            stopped = stack.down()
            console.print(f"Stopped {', '.join(stopped)}.")
    console.print(f"Demo finished in {time.monotonic() - started_at:.0f}s.")
