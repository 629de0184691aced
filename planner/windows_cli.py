"""`karpflow windows`: what the operator's controls block now, by what, and until when.

    karpflow windows              # the live cluster (KUBECONFIG; on the dev stack: source .state/env)
    karpflow windows -o json
    karpflow windows --snapshot cluster.json --at 2026-11-23T10:00:00Z

It reads the cluster the way `karpflow plan --live` does (every kind listed once) and reports
MaintenanceWindows, the nodes and actions they block, NodeDisruptionBudgets, and what NodePool
budgets allow now (planner/controls_report.py). Exit status: 0 with a report, 2 when the cluster or
the file cannot be read, or holds no node at all (a KUBECONFIG pointing at the wrong cluster must
not look like "nothing blocked").
"""

from __future__ import annotations

import sys
from datetime import datetime

import click
from rich.table import Table

from planner.catalog import DEFAULT_REGION, CatalogError, bundled_catalog
from planner.cli import _console, live_snapshot, parse_at
from planner.controls_report import ControlsReport, WindowOut, controls_report
from planner.snapshot import Snapshot, SnapshotError, load_snapshot


def _fail(message: str) -> None:
    click.echo(f"karpflow windows: {message}", err=True)
    sys.exit(2)


@click.command("windows")
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    metavar="FILE",
    help="Read kubectl -o yaml/json output instead of the live cluster (repeat to combine files).",
)
@click.option(
    "--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="The live cluster's kubeconfig."
)
@click.option("--at", "at", metavar="RFC3339", help="Report as of this time (default: now).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def windows(snapshots: tuple[str, ...], kubeconfig: str | None, at: str | None, output: str) -> None:
    """Show what MaintenanceWindows, NodeDisruptionBudgets and NodePool budgets hold back now.

    \b
    For every managed node the actions windows block on it and until when; for every budget the
    nodes it selects, those unavailable and how many more may go; for every NodePool and reason the
    disruptions that may start now (rate budgets count the starts karpflow knows of; a snapshot
    file knows none).
    """
    try:
        now = parse_at(at) if at else None
    except click.BadParameter as err:
        _fail(f"--at: {err.message}")
    snapshot = _read(snapshots, kubeconfig, now)
    if not snapshot.nodes:
        where = ", ".join(snapshots) if snapshots else "the cluster"
        _fail(f"{where} has no nodes: is KUBECONFIG (or the file) the cluster you mean?")
    try:
        catalog = bundled_catalog(snapshot.region() or DEFAULT_REGION)
    except CatalogError:
        catalog = bundled_catalog(DEFAULT_REGION)
    report = controls_report(snapshot, catalog)
    if output == "json":
        click.echo(report.to_json())
    else:
        print_report(report)


def _read(snapshots: tuple[str, ...], kubeconfig: str | None, now: datetime | None) -> Snapshot:
    if snapshots:
        try:
            return load_snapshot(list(snapshots), now=now)
        except SnapshotError as err:
            _fail(str(err))
    try:
        return live_snapshot(kubeconfig, now)
    except Exception as err:
        _fail(f"cannot read the cluster: {err}")
    raise AssertionError("unreachable")


def window_state(w: WindowOut) -> str:
    """Whether the window blocks now and until when, or when it next blocks; an Allow window's
    block ends at its next opening. Times in UTC and, beside them, on the window's clock."""

    def both(utc: str, local: str | None) -> str:
        return utc if w.time_zone == "UTC" or not local else f"{utc} ({local})"

    if w.problems:
        return "[red]invalid: blocks until fixed[/red]"
    if w.active:
        if not w.until:
            return "[yellow]blocks[/yellow]"
        opening = "next opening" if w.mode == "Allow" else "until"
        return f"[yellow]blocks[/yellow], {opening} {both(w.until, w.until_local)}"
    if w.next_start:
        state = "open until" if w.mode == "Allow" else "next blocks at"
        return f"{state} {both(w.next_start, w.next_start_local)}"
    return "open" if w.mode == "Allow" else "inactive"


def print_report(report: ControlsReport) -> None:
    console = _console()
    console.print(f"[bold]Operator controls at {report.at}[/bold]")
    if report.windows:
        table = Table(title="MaintenanceWindows", title_justify="left")
        for column in ("name", "mode", "actions", "nodes", "schedules", "state"):
            table.add_column(column, justify="right" if column == "nodes" else "left")
        for w in report.windows:
            schedules = "\n".join(w.schedules) or ("always" if not w.exclusions else "")
            if w.schedules and w.time_zone != "UTC":
                schedules += f"\n({w.time_zone})"
            schedules += "".join(f"\nexcept {e}" for e in w.exclusions)
            names = ", ".join(w.actions)
            table.add_row(w.name, w.mode, names, str(w.nodes), schedules.strip(), window_state(w))
        console.print(table)
    else:
        console.print("No MaintenanceWindows.")
    if report.blocked:
        table = Table(title="Blocked now", title_justify="left")
        for column in ("nodes", "nodepool", "actions", "by", "until"):
            table.add_column(column)
        rows: dict[tuple[str, tuple[tuple[tuple[str, str], tuple[str, ...]], ...]], list[str]] = {}
        for item in report.blocked:
            by_end: dict[tuple[str, str], list[str]] = {}
            for block in item.blocked:
                by_end.setdefault((", ".join(block.windows), block.ends), []).append(block.action)
            key = (item.nodepool or "-", tuple(sorted((k, tuple(v)) for k, v in by_end.items())))
            rows.setdefault(key, []).append(item.node)
        for (pool, blocks), nodes in sorted(rows.items()):
            shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
            for index, ((by, ends), actions) in enumerate(blocks):
                first = index == 0
                table.add_row(shown if first else "", pool if first else "", ", ".join(actions), by, ends)
        console.print(table)
    if report.node_disruption_budgets:
        table = Table(title="NodeDisruptionBudgets", title_justify="left")
        for column in ("name", "rule", "selected", "unavailable", "may go"):
            table.add_column(column, justify="left" if column in ("name", "rule") else "right")
        for b in report.node_disruption_budgets:
            down = f"{len(b.unavailable)}" + (f" ({', '.join(b.unavailable[:3])})" if b.unavailable else "")
            table.add_row(b.name, b.rule, str(b.selected), down, str(b.remaining))
        console.print(table)
    held = [p for p in report.nodepool_budgets if p.remaining == 0]
    if held:
        table = Table(title="NodePool budgets that allow nothing now", title_justify="left")
        for column in ("nodepool", "reason", "why", "next change"):
            table.add_column(column)
        for p in held:
            table.add_row(p.nodepool, p.reason, p.why, p.next_change or "-")
        console.print(table)
    for problem in report.problems:
        console.print(f"[yellow]problem:[/yellow] {problem}", markup=True, highlight=False)
