"""`karpflow plan`: what one disruption pass would do on a snapshot, and why every other node stays.

    kubectl get nodes,pods,pdb,ds,nodepools,ec2nodeclasses -A -o json > cluster.json
    kubectl get nodeoverlays -o json > overlays.json        # optional: for --node-overlay
    aws ec2 describe-instances --output json > instances.json   # optional: for EC2NodeClass drift
    karpflow plan --snapshot cluster.json [--snapshot instances.json] [--snapshot overlays.json]
                  [--catalog catalog.yaml | --live-catalog] [--at 2026-11-22T10:00:00Z]

The nodes' AMI, subnet and security groups are EC2's, not the cluster's: without the instances,
drift by AMI, subnet or security group is not seen (the controller reads them from EC2 itself).

Exit status: 0 with a plan (objects that could not be read are listed as problems), 2 for input that
cannot be used at all (missing or unparseable file, no Node in it or in the live cluster, bad
catalog, bad --at).
Budgets are reported at the start of the pass (`budgetsAtStart`) and after its commands (`budgets`,
what the next pass could still start); see `karpflow plan --help`.
JSON snapshots load several times faster than YAML; prefer `-o json` for large clusters.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from api.constants import DISRUPTED_TAINT_KEY
from planner.catalog import DEFAULT_REGION, Catalog, CatalogError, bundled_catalog, load_catalog_file
from planner.catalog_live import fetch_live_catalog
from planner.model import PlanOptions
from planner.plan import Plan
from planner.plan import plan as run_plan
from planner.snapshot import Snapshot, SnapshotError, load_snapshot


def parse_at(value: str) -> datetime:
    """RFC 3339 (`2026-11-22T10:00:00Z`, offsets allowed), returned in UTC (budget schedules are UTC);
    naive times are taken as UTC."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an RFC 3339 time such as 2026-11-22T10:00:00Z") from None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


async def read_live_objects(kubeconfig: str | None) -> list[dict[str, Any]]:
    """The cluster's objects, listed once (the planner stays pure: this is the command's I/O).
    Raises what the client raises."""
    from cluster.informer import list_cluster
    from kube.client import KubeApi

    kube = await KubeApi.connect(kubeconfig)  # None: KUBECONFIG, ~/.kube/config or in-cluster
    try:
        return await list_cluster(kube)
    finally:
        await kube.close()


def with_held_tainted(objects: Iterable[dict[str, Any]], held: Collection[str]) -> list[dict[str, Any]]:
    """The objects with the Nodes named in `held` tainted `karpenter.sh/disrupted`, as the controller
    shows the planner the nodes of running workflows (activities/in_flight.py): the planner's own
    rules then leave them out of every command and count them against the budgets. The objects
    given are not changed."""
    out: list[dict[str, Any]] = []
    for obj in objects:
        name = (obj.get("metadata") or {}).get("name")
        if obj.get("kind") == "Node" and name in held:
            spec = dict(obj.get("spec") or {})
            taints = list(spec.get("taints") or [])
            if not any(t.get("key") == DISRUPTED_TAINT_KEY for t in taints):
                taints.append({"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"})
            obj = {**obj, "spec": {**spec, "taints": taints}}
        out.append(obj)
    return out


def live_snapshot(kubeconfig: str | None, now: datetime | None, held: Collection[str] = ()) -> Snapshot:
    """The live cluster as `karpflow plan --live` and `karpflow windows` read it; `held`: nodes that
    running workflows hold (shown tainted, see `with_held_tainted`). Raises what the client raises."""
    import asyncio

    objects = with_held_tainted(asyncio.run(read_live_objects(kubeconfig)), held)
    return Snapshot.from_objects(objects, now=now, source="the live cluster")


def _live_snapshot(kubeconfig: str | None, now: datetime | None) -> Snapshot:
    try:
        return live_snapshot(kubeconfig, now)
    except Exception as err:
        _fail(f"--live: cannot read the cluster: {err}")
        raise  # unreachable: _fail exits


def _fail(message: str) -> None:
    click.echo(f"karpflow plan: {message}", err=True)
    sys.exit(2)


@click.command("plan")
@click.option(
    "--snapshot",
    "snapshots",
    multiple=True,
    metavar="FILE",
    help="kubectl -o yaml/json output (a List, multi-document YAML or JSON), or `aws ec2 "
    "describe-instances --output json` (the nodes' AMIs, subnets, security groups); repeat to combine.",
)
@click.option(
    "--live",
    is_flag=True,
    help="Plan on the live cluster instead of a file: its objects are listed once through KUBECONFIG "
    "(or --kubeconfig; in a pod, the in-cluster configuration). On the dev stack: source .state/env.",
)
@click.option(
    "--kubeconfig", type=click.Path(exists=True, dir_okay=False), help="With --live: the kubeconfig."
)
@click.option(
    "--catalog", "catalog_path", metavar="FILE", help="Instance catalog file overriding the bundled table."
)
@click.option(
    "--live-catalog",
    is_flag=True,
    help="Build the catalog from AWS (EC2 instance types, offerings and spot prices; Pricing API on-demand "
    "prices) for the bundled table's types and the snapshot's, with the standard credential chain and "
    "AWS_ENDPOINT_URL. Falls back to the bundled table, with a warning, when AWS fails.",
)
@click.option("--region", help="Region of the catalog (default: from node labels, else us-west-2).")
@click.option(
    "--at",
    "at",
    metavar="RFC3339",
    help="Plan as of this time (default: the snapshot's karpflow.io/captured-at annotation, else now).",
)
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option(
    "--all-methods", is_flag=True, help="Evaluate every method instead of stopping at the first that acts."
)
@click.option(
    "--spot-to-spot", is_flag=True, help="Allow spot-to-spot consolidation (feature gate, off by default)."
)
@click.option(
    "--node-overlay",
    is_flag=True,
    help="Apply the snapshot's NodeOverlays to prices and capacity (Karpenter's NodeOverlay feature "
    "gate, off by default).",
)
@click.option(
    "--preference-policy",
    type=click.Choice(["Respect", "Ignore"]),
    default="Respect",
    show_default=True,
    help="Preferred affinities and ScheduleAnyway spreads in the simulation.",
)
@click.option(
    "--min-values-policy",
    type=click.Choice(["Strict", "BestEffort"]),
    default="Strict",
    show_default=True,
    help="NodePool minValues on new nodes (Karpenter's --min-values-policy): Strict refuses a new node "
    "whose options span too few values; BestEffort lowers minValues to what they reach.",
)
@click.option("--instance-type-drift", is_flag=True, help="Drift nodes whose type left the catalog.")
@click.option(
    "--max-replacements",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    metavar="N",
    help="karpflow extension: let multi-node consolidation replace its nodes with up to N cheaper new "
    "nodes (strictly cheaper in total). 1 is Karpenter's rule: at most one.",
)
@click.option(
    "--drift-per-pass",
    type=click.IntRange(1, 1000),
    default=PlanOptions().drift_commands_per_pass,
    show_default=True,
    metavar="N",
    help="Drift commands one pass may start, validated together, each within the Drifted budget, "
    "NodeDisruptionBudgets, rate budgets and windows. 1 is Karpenter's pace: one per pass.",
)
@click.option(
    "--strategy",
    type=click.Choice(["karpenter", "optimal"]),
    default=None,
    help="Consolidation strategy for every NodePool, overriding their karpflow.dev/consolidation-strategy "
    "annotations. optimal: plan toward the cheapest fleet and show it (target, its cost against today's "
    "and the fluid optimum, the moves). Default: each pool's annotation (Karpenter's rules without one).",
)
def plan(
    snapshots: tuple[str, ...],
    live: bool,
    kubeconfig: str | None,
    catalog_path: str | None,
    live_catalog: bool,
    region: str | None,
    at: str | None,
    output: str,
    all_methods: bool,
    spot_to_spot: bool,
    node_overlay: bool,
    preference_policy: str,
    min_values_policy: str,
    instance_type_drift: bool,
    max_replacements: int,
    drift_per_pass: int,
    strategy: str | None,
) -> None:
    """Show what one disruption pass would do, and why every other managed node is left alone.

    \b
    Disruption budgets are shown per NodePool and reason twice (JSON keys in brackets):
      allowed when the pass starts, before any of its commands   [budgetsAtStart]
      still allowed after all of this plan's commands, i.e. what [budgets]
        the next pass could start while these are in flight
    and the node counts behind them [budgetNodes]: nodes the budgets count, those already
    disrupting (NotReady, deleting, tainted karpenter.sh/disrupted) and those this plan disrupts.
    Expiration is never stopped by a budget but its nodes count as disrupting.

    \b
    savings/h [savingsPerHour] is guaranteed: the removed nodes' price minus each replacement's
    worst-case (most expensive) option, the price consolidation decides on; [savingsPerHourBest]
    is the saving if each replacement launches as its cheapest option.
    """
    if catalog_path and live_catalog:
        _fail("--catalog and --live-catalog are alternatives; give one")
    if bool(snapshots) == live:
        _fail("give --snapshot FILE or --live (one of them)")
    try:
        now = parse_at(at) if at else None  # the files' capture time, else the current time
    except click.BadParameter as err:
        _fail(f"--at: {err.message}")
    if live:
        snapshot = _live_snapshot(kubeconfig, now)
    else:
        _hint_json(snapshots)
        try:
            snapshot = load_snapshot(list(snapshots), now=now)
        except SnapshotError as err:
            _fail(str(err))
    if not snapshot.nodes:
        # "0 nodes, nothing to do" reads like good news; it almost always means the wrong cluster,
        # an empty or wrong file, or a kubeconfig that lists nothing.
        where = (
            f"the cluster at KUBECONFIG={os.environ.get('KUBECONFIG') or '~/.kube/config'}"
            if live
            else ", ".join(snapshots)
        )
        hint = (
            " (on the dev stack: `source .state/env` or `karpflow --state-dir DIR plan --live`)"
            if live
            else ""
        )
        _fail(f"no Node in {where}: nothing to plan on{hint}")
    region = region or snapshot.region() or DEFAULT_REGION
    try:
        if catalog_path:
            catalog = load_catalog_file(catalog_path)
        elif live_catalog:
            catalog = _live_catalog(region, snapshot)
        else:
            catalog = bundled_catalog(region)
    except CatalogError as err:
        _fail(str(err))
    # Validated as what click read (its choices are plain strings).
    options = PlanOptions.model_validate(
        {
            "all_methods": all_methods,
            "spot_to_spot": spot_to_spot,
            "node_overlay": node_overlay,
            "preference_policy": preference_policy,
            "min_values_policy": min_values_policy,
            "instance_type_drift": instance_type_drift,
            "max_replacements": max_replacements,
            "drift_commands_per_pass": drift_per_pass,
            "consolidation_strategy": strategy.capitalize() if strategy else None,
        }
    )
    result = run_plan(snapshot, catalog, options)
    if output == "json":
        click.echo(result.to_json())
    else:
        print_table(result, snapshot, all_methods)


def _live_catalog(region: str, snapshot: Snapshot) -> Catalog:
    """The catalog from AWS for the bundled table's types and those of the snapshot's nodes (the
    Pricing API is asked once per type, so not for every type EC2 has); the bundled table on failure."""
    try:
        bundled = bundled_catalog(region)
    except CatalogError:
        bundled = bundled_catalog(DEFAULT_REGION)  # the type names, for a region without a table
    names = {t.name for t in bundled} | {n.instance_type for n in snapshot.nodes.values() if n.instance_type}
    try:
        return fetch_live_catalog(region, names, snapshot.nodeclasses.values())
    except Exception as err:  # credentials, endpoint, throttling: all mean "no live catalog now"
        click.echo(f"karpflow plan: live catalog unavailable ({err}); using the bundled table", err=True)
        return bundled_catalog(region)


def _hint_json(paths: tuple[str, ...]) -> None:
    """PyYAML parses about 1 MB/s here; JSON is an order of magnitude faster. Say so before a long wait."""
    for path in paths:
        try:
            with open(path, "rb") as handle:
                first = handle.read(64).lstrip()[:1]
            size = os.path.getsize(path)
        except OSError:
            continue  # load_snapshot reports it
        if first not in (b"{", b"[") and size > 10_000_000:
            click.echo(
                f"karpflow plan: {path} is {size / 1e6:.0f} MB of YAML, which loads slowly; "
                "`kubectl get ... -o json` output loads much faster",
                err=True,
            )


def _console() -> Console:
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(width=width, soft_wrap=False, highlight=False)


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def print_budgets(console: Console, result: Plan) -> None:
    """One row per NodePool: the nodes its budgets count, those already disrupting, those this plan
    disrupts, and per reason "allowed when the pass starts -> still allowed after this plan"."""
    console.print(
        "[bold]Disruption budgets[/bold] per NodePool and reason: "
        "allowed when this pass starts → still allowed after its commands"
    )
    table = Table(show_edge=True)
    reasons = sorted({r for b in result.budgets.values() for r in b})
    table.add_column("nodepool")
    for column in ("nodes", "disrupting", "this plan"):
        table.add_column(column, justify="right")
    for reason in reasons:
        table.add_column(reason, justify="right")
    for pool, after in result.budgets.items():
        start = result.budgets_at_start.get(pool, {})
        counts = result.budget_nodes.get(pool)
        numbers = [str(counts.nodes), str(counts.disrupting), str(counts.this_plan)] if counts else ["-"] * 3
        table.add_row(pool, *numbers, *(f"{start.get(r, 0)} → {after.get(r, 0)}" for r in reasons))
    console.print(table)
    console.print(
        "  disrupting: NotReady, deleting or tainted at the start. "
        "this plan: nodes its commands disrupt (expiration too: budgets count it, never stop it)",
        markup=False,
    )


def _versus(cost: float, reference: float | None) -> str:
    return f"{cost / reference - 1:+.1%}" if reference else "-"


def print_target_fleet(console: Console, result: Plan) -> None:
    """The Optimal strategy's target: its cost against today's and the fluid optimum, what it keeps,
    launches and removes, the plan held across passes, and this pass's move."""
    target = result.target_fleet
    assert target is not None
    fluid = target.fluid_optimum
    console.print(
        f"[bold]Target fleet[/bold] (Optimal NodePools: {target.nodes} candidate nodes, {target.pods} pods): "
        f"${target.target_cost:.4f}/h against ${target.current_cost:.4f}/h today "
        f"({_versus(target.target_cost, target.current_cost)}); fluid optimum "
        f"{_money(fluid)}/h: today {_versus(target.current_cost, fluid)}, target "
        f"{_versus(target.target_cost, fluid)}; solver {target.status} in {target.target_seconds:.2f} s "
        f"(+{target.layout_seconds:.2f} s for its layout, +{target.step_seconds:.2f} s for this pass's move)",
        markup=True,
    )
    table = Table(show_edge=True)
    for column in ("", "nodes", "detail"):
        table.add_column(column)
    table.add_row("keep", str(len(target.keep)), ", ".join(target.keep) or "-")
    table.add_row("remove", str(len(target.remove)), ", ".join(target.remove) or "-")
    launches = "\n".join(
        f"{launch.count} x {launch.nodepool}: {launch.instance_type} {launch.capacity_type} "
        f"{','.join(launch.zones)} {_money(launch.price)}/h"
        for launch in target.launches
    )
    table.add_row("launch", str(sum(launch.count for launch in target.launches)), launches or "-")
    console.print(table)
    if target.ended:
        console.print(f"  {target.ended}", markup=False)
    held = target.plan
    if held is not None:
        console.print(
            f"  plan {held.id} ({held.state}, since {held.since}): ${held.start_cost:.4f}/h when it started, "
            f"${held.target_cost:.4f}/h once done; so far {_money(held.ledger)}/h (never above 0); "
            f"{len(held.leaving)} node(s) still to remove, {len(held.launched)} launched with room kept",
            markup=False,
        )
    moves = [c for c in result.commands if c.method == "optimal-consolidation"]
    if moves:
        for move in moves:
            console.print(f"  move now: {move.message}", markup=False)
        later = len(held.leaving) - sum(len(m.nodes) for m in moves) if held is not None else 0
        if later > 0:
            console.print(
                f"  later moves: {later} node(s), tainted karpflow.io/leaving and marked with the plan now",
                markup=False,
            )
    elif target.why_no_step:
        console.print(f"  no move: {target.why_no_step}", markup=False)


def print_table(result: Plan, snapshot: Snapshot, all_methods: bool = False) -> None:
    console = _console()
    summary = result.summary
    console.print(
        f"[bold]Plan at {result.at}[/bold]  region {result.region}  catalog: {result.catalog}\n"
        f"{summary.nodes} nodes, {summary.managed} managed, {summary.candidates} candidates; "
        f"methods: {', '.join(summary.methods)}"
        + (f"; the pass ends after [bold]{summary.ended_by}[/bold]" if summary.ended_by else "")
        + (
            "; [bold]--all-methods[/bold]: every method ran, later ones counting earlier commands"
            if all_methods
            else ""
        )
    )
    if result.commands:
        table = Table(title="Commands", title_justify="left")
        scored = any(command.scores for command in result.commands)  # a Balanced pool's move
        columns = ("#", "method", "reason", "decision", "nodes", "replacements", "savings/h")
        for column in (*columns, "Balanced score") if scored else columns:
            table.add_column(column, justify="right" if column in ("#", "savings/h") else "left")
        for index, command in enumerate(result.commands, 1):
            replacements = "\n".join(
                f"{r.nodepool}: {', '.join(r.instance_types[:3])}{' …' if len(r.instance_types) > 3 else ''}"
                f" {r.capacity_type}{' (' + ','.join(r.reservation_ids) + ')' if r.reservation_ids else ''}"
                f" {','.join(r.zones)} {_money(r.price)}"
                + (" (minValues relaxed)" if r.min_values_relaxed else "")
                for r in command.replacements
            )
            table.add_row(
                str(index),
                command.method,
                command.reason,
                command.decision,
                "\n".join(command.nodes),
                replacements or "-",
                "-" if command.method == "expiration" else _money(command.savings_per_hour),
                *(["\n".join(command.scores) or "-"] if scored else []),
            )
        console.print(table)
    else:
        console.print("No commands: nothing to disrupt in this pass.")
    if result.target_fleet is not None:
        print_target_fleet(console, result)
    if result.budgets:
        print_budgets(console, result)
    if result.blocked:
        table = Table(title="Left alone", title_justify="left")
        table.add_column("node")
        table.add_column("nodepool")
        table.add_column("why")
        for item in result.blocked:
            table.add_row(item.node, item.nodepool or "-", item.reason)
        console.print(table)
    if result.breaker:
        console.print(
            f"[yellow]cluster-health breaker open[/yellow]: {result.breaker}; emptiness, consolidation, "
            "drift and rebalance wait until the cluster recovers",
            highlight=False,
        )
    for note in result.node_overlays:
        console.print(note, markup=False)
    if result.problems:
        console.print(f"[yellow]{len(result.problems)} problem(s) in the input:[/yellow]")
        for problem in result.problems[:50]:
            console.print(f"  - {problem}", markup=False)
        if len(result.problems) > 50:
            console.print(f"  ... and {len(result.problems) - 50} more (see --output json)")
