"""`karpflow dev up | status | down`: the local stack (Temporal dev server, simulator, worker).

Every option also has an environment variable (`KARPFLOW_STATE_DIR`, `KARPFLOW_TEMPORAL_PORT`,
`KARPFLOW_UI_PORT`, `KARPFLOW_KUBE_PORT`, `KARPFLOW_MOTO_PORT`, `KARPFLOW_TIME_SCALE`, ...); a flag
wins over its variable. See `sim/devstack.py` for what runs where.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from sim.devstack import DevSettings, DevStack, DevStackError, purged_message

console = Console()

_OVERRIDES = (
    click.option(
        "--state-dir", type=click.Path(path_type=Path), help="Where pid files, logs and the database live."
    ),
    click.option("--temporal-port", type=int, help="Temporal frontend (gRPC) port [7233]."),
    click.option("--ui-port", type=int, help="Temporal Web UI port [8233]."),
    click.option("--kube-port", type=int, help="Kubernetes API emulator port [6443]."),
    click.option("--moto-port", type=int, help="EC2 (moto) port [4566]."),
)


def stack_options(command: Any) -> Any:
    """The state directory and port options, shared by `dev up` and `demo`."""
    for option in reversed(_OVERRIDES):
        command = option(command)
    return command


def settings_from_flags(**flags: Any) -> DevSettings:
    """Environment and defaults, then the flags that were given."""
    return DevSettings(**{name: value for name, value in flags.items() if value is not None})


def endpoints_table(stack: DevStack) -> Table:
    s = stack.settings
    table = Table(title="karpflow dev stack", show_header=True, header_style="bold")
    table.add_column("What")
    table.add_column("Where")
    table.add_row("Temporal (gRPC)", s.temporal_address + f"  namespace {s.temporal_namespace}")
    if s.ui:
        table.add_row("Temporal Web UI", s.ui_url)
    table.add_row("Kubernetes API (emulator)", s.kube_url)
    table.add_row("kubeconfig", str(s.kubeconfig_path) + ("  (admin token, CA)" if s.secure else ""))
    if s.secure:
        table.add_row(
            "Worker identity",
            f"ServiceAccount karpflow/karpflow-worker, token in {s.serviceaccount_dir}",
        )
    if s.worker and s.worker_health_port:
        table.add_row("Worker metrics (Prometheus)", s.metrics_url)
    table.add_row("EC2 (moto)", s.ec2_endpoint + f"  region {s.region}")
    table.add_row("Simulator controls", f"{s.kube_url}/sim/status, /sim/invariants, /sim/ec2/faults")
    table.add_row(
        "Cluster", f"{s.cluster_name}, scenario {s.scenario or '(empty)'}, time scale {s.time_scale}"
    )
    table.add_row("State", f"{s.state_dir} (logs in {s.logs_dir})")
    return table


def bring_up(stack: DevStack) -> list[str]:
    """`stack.up()` with one progress line per part; the names of the parts it started."""
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as progress:
        tasks: dict[str, Any] = {}

        def report(part: str, message: str) -> None:
            if part not in tasks:
                tasks[part] = progress.add_task(f"{part}: {message}", total=1)
            progress.update(tasks[part], description=f"{part}: {message}")
            if message in ("ready", "already running") or message.startswith("terminated"):
                progress.update(tasks[part], completed=1)

        return stack.up(report)


def print_exports(stack: DevStack) -> None:
    console.print("\nPoint your shell at it:")
    console.print(f"  export KUBECONFIG={stack.settings.kubeconfig_path}", highlight=False, soft_wrap=True)
    console.print(
        f"  source {stack.settings.state_dir / 'env'}   # KUBECONFIG, TEMPORAL_ADDRESS, AWS_*, "
        "KARPFLOW_STATE_DIR, KARPFLOW_METRICS_URL; karpflow and temporal on PATH",
        highlight=False,
        soft_wrap=True,
    )


@click.group()
def dev() -> None:
    """Run the local stack: Temporal dev server, simulated cluster (emulator + EC2 in moto), worker."""


@dev.command()
@stack_options
@click.option(
    "--scenario",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Cluster to seed (kubectl List YAML/JSON) [sim/scenarios/demo.yaml].",
)
@click.option("--empty", is_flag=True, help="Start with an empty cluster (no scenario).")
@click.option(
    "--time-scale", type=float, help="Factor on simulated delays: 1 is real time, 0.1 ten times faster."
)
@click.option("--cluster-name", help="Cluster name (EC2 ownership tag) [karpflow-dev].")
@click.option("--no-worker", is_flag=True, help="Do not start the karpflow worker.")
@click.option(
    "--timeout", "ready_timeout", type=float, help="Seconds each part may take to become ready [60]."
)
@click.option(
    "--secure",
    is_flag=True,
    default=None,
    help="HTTPS, bearer tokens and RBAC on the emulator; the worker runs as its ServiceAccount "
    "with the rights of deploy/overlays/local.",
)
@click.option(
    "--karpenter-neighbour",
    is_flag=True,
    default=None,
    help="A simulated Karpenter runs beside karpflow (it launches and terminates NodeClaims, "
    "garbage-collects instances without one); the worker runs with --karpenter-coexistence.",
)
def up(empty: bool, no_worker: bool, **flags: Any) -> None:
    """Start the stack in the background (idempotent: what already runs is left alone)."""
    if empty:
        flags["scenario"] = None
    settings = settings_from_flags(**flags)
    if empty:
        settings.scenario = None
    if no_worker:
        settings.worker = False
    stack = DevStack(settings)
    was_running = stack.running()
    try:
        started = bring_up(stack)
    except DevStackError as err:
        console.print(f"[red]dev up failed:[/red] {err}", highlight=False)
        sys.exit(1)
    if was_running and not started:
        console.print("[yellow]The dev stack is already running; nothing started.[/yellow]")
    console.print(endpoints_table(stack))
    print_exports(stack)


@dev.command()
@click.option("--state-dir", type=click.Path(path_type=Path), help="The stack's state directory.")
def status(state_dir: Path | None) -> None:
    """What runs, with pids and health. Exit status 1 when a part is down or not answering."""
    stack = DevStack.from_state_dir(state_dir)
    rows = stack.status()
    table = Table(title=f"karpflow dev stack ({stack.settings.state_dir})", header_style="bold")
    for column in ("Part", "PID", "State", "Detail"):
        table.add_column(column)
    for row in rows:
        state = (
            "[green]healthy[/green]"
            if row.healthy
            else ("[yellow]running[/yellow]" if row.running else "[red]stopped[/red]")
        )
        table.add_row(row.name, str(row.pid or "-"), state, row.detail)
    console.print(table)
    if any(r.running for r in rows):
        console.print(endpoints_table(stack))
    if not all(r.healthy for r in rows):
        sys.exit(1)


@dev.command()
@click.option("--state-dir", type=click.Path(path_type=Path), help="The stack's state directory.")
@click.option("--purge", is_flag=True, help="Also delete the Temporal database, logs and kubeconfig.")
def down(state_dir: Path | None, purge: bool) -> None:
    """Stop what `dev up` started (SIGTERM, then SIGKILL after 10 s). The database stays unless --purge."""
    stack = DevStack.from_state_dir(state_dir)
    stopped = stack.down()
    if stopped:
        console.print(f"Stopped {', '.join(stopped)}.")
    else:
        console.print("Nothing was running.")
    if purge:
        console.print(
            purged_message(stack.settings.state_dir, stack.purge()), highlight=False, soft_wrap=True
        )
    elif stack.settings.db_path.exists():
        console.print(f"Kept the Temporal database {stack.settings.db_path} (`--purge` removes it).")
