"""`karpflow sim ...`: operate a running simulator (the dev stack's, or any `python -m sim`).

    karpflow sim status                              what it runs, scenario, controller counters
    karpflow sim invariants [--in-flight n1,n2]      the invariant report (exit 1 on a violation)
    karpflow sim instances                           the cluster's EC2 instances in moto
    karpflow sim faults show | clear
    karpflow sim faults ice m5.large [--zone us-west-2a] [--capacity-type spot]
    karpflow sim faults throttle --probability 0.3 [--rps 5] [--action RunInstances]
    karpflow sim faults never-ready [--instance-type m5.large] [--instance-id i-...]
    karpflow sim faults bad-ami AMI_ID [--pods-crash] [--remove]
    karpflow sim faults api --verb create --resource pods/eviction --status 429 [--rate 0.5] [--times 3]
    karpflow sim api-stats [--user U] [--reset] [--json]
                                                     requests and bytes by user, verb and resource
    karpflow sim flow-control --seats-per-second 200 [--user-share 0.5] | --off
                                                     429s for a user over its share (API Priority and
                                                     Fairness, simplified: sim/apiserver/flowcontrol.py)
    karpflow sim interrupt NODE --kind spot|capacity-reservation|capacity-block-expiration|rebalance|
                                       scheduled-change|stopping|health
                                                     the EventBridge event EC2 (or AWS Health) sends
                                                     about NODE's instance, onto the interruption queue
    karpflow sim dump [-o cluster.yaml]              every object, as a kubectl List (a scenario/snapshot)
    karpflow sim load FILE                           replace the cluster with a scenario
    karpflow sim chaos --seed 7 --minutes 2          a chaos run of its own stack (sim/chaos/), exit 1 on
                                                     an invariant violated or no convergence

The simulator is found with `--url`, else `KARPFLOW_SIM_URL`, else the dev stack's state directory
(`--state-dir` / `KARPFLOW_STATE_DIR`, default `.state/`).
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from api.constants import CAPACITY_RESERVATION_ID_LABEL
from sim.devstack import DevStack
from sim.interruption_messages import KINDS, entry, envelope

console = Console()


class SimClient:
    """The simulator's `/sim/...` HTTP endpoints."""

    def __init__(self, url: str, timeout: float = 60.0, ca_file: Path | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        # A secure emulator's certificate is signed by the dev stack's own CA.
        self.context = (
            ssl.create_default_context(cafile=str(ca_file))
            if url.startswith("https://") and ca_file is not None and ca_file.is_file()
            else None
        )

    def request(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Any:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):
                detail = json.loads(detail).get("message", detail)
            raise click.ClickException(f"{method} {path}: HTTP {err.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as err:
            raise click.ClickException(
                f"no simulator answers at {self.url} ({getattr(err, 'reason', err)}); "
                "start one with `karpflow dev up`"
            ) from None


def _client(ctx: click.Context) -> SimClient:
    return ctx.obj["client"]


@click.group()
@click.option("--url", envvar="KARPFLOW_SIM_URL", help="The simulator's Kubernetes emulator URL.")
@click.option("--state-dir", type=click.Path(path_type=Path), help="The dev stack whose simulator to use.")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="KUBECONFIG",
    help="How to read the cluster's objects (default: the dev stack's kubeconfig).",
)
@click.pass_context
def sim(ctx: click.Context, url: str | None, state_dir: Path | None, kubeconfig: Path | None) -> None:
    """Inspect and steer the simulated cluster: invariants, EC2 and API faults, scenarios."""
    stack = DevStack.from_state_dir(state_dir)
    ctx.obj = {
        "client": SimClient(url or stack.settings.kube_url, ca_file=stack.settings.tls_dir / "ca.crt"),
        "stack": stack,
        # The dev stack's kubeconfig (its token in a secure stack), unless another simulator is named.
        "kubeconfig": kubeconfig or (None if url else stack.settings.kubeconfig_path),
    }


@sim.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """What the simulator runs: endpoints, scenario, controller counters."""
    console.print_json(data=_client(ctx).request("GET", "/sim/status"))


@sim.command()
@click.option(
    "--in-flight", help="Comma-separated nodes with a disruption in flight (their taint is expected)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def invariants(ctx: click.Context, in_flight: str | None, as_json: bool) -> None:
    """The invariant report (PDB violations, do-not-disrupt evictions, lost pods, leaks); exit 1 on one."""
    query = f"?in_flight={in_flight}" if in_flight is not None else ""
    report = _client(ctx).request("GET", f"/sim/invariants{query}")
    if as_json:
        console.print_json(data=report)
    else:
        print_report(report)
    if not report["ok"]:
        sys.exit(1)


def _print_unjudged(report: dict[str, Any], out: Console) -> None:
    for invariant, subjects in (report.get("unjudged") or {}).items():
        out.print(
            f"[yellow]{invariant} not judged[/yellow] (unknown without --in-flight): {', '.join(subjects)}"
        )


def print_report(report: dict[str, Any], out: Console | None = None) -> None:
    out = out or console
    observed = ", ".join(f"{n} {what}" for what, n in report["observed"].items())
    _print_unjudged(report, out)
    if report["ok"]:
        out.print(f"[green]No invariant violations[/green] (observed: {observed})")
        return
    table = Table(title="Invariant violations", header_style="bold")
    for column in ("Invariant", "Subject", "What happened", "At"):
        table.add_column(column)
    for v in report["violations"]:
        table.add_row(v["invariant"], v["subject"], v["message"], v["at"])
    out.print(table)
    out.print(f"(observed: {observed})")


@sim.command()
@click.pass_context
def instances(ctx: click.Context) -> None:
    """The cluster's EC2 instances in moto (every state)."""
    status = _client(ctx).request("GET", "/sim/status")
    # Piped (a script, a test), the table keeps its full width rather than cutting ids short.
    wide = Console(width=None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "200")))
    wide.print(instances_table(status["ec2_endpoint"], status["region"], status["cluster_name"]))


def instances_table(ec2_endpoint: str, region: str, cluster_name: str) -> Table:
    """The instances carrying the cluster's ownership tag, through boto3 against moto."""
    import boto3

    ec2 = boto3.client(
        "ec2",
        endpoint_url=ec2_endpoint,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    tag = f"kubernetes.io/cluster/{cluster_name}"
    table = Table(title=f"EC2 instances of cluster {cluster_name} ({ec2_endpoint})", header_style="bold")
    for column in ("Instance", "Type", "Zone", "Capacity", "State", "Private IP", "NodePool", "Name"):
        table.add_column(column)
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[{"Name": f"tag:{tag}", "Values": ["owned"]}]
    )
    rows = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
    for i in sorted(rows, key=lambda i: (i["Placement"]["AvailabilityZone"], i.get("PrivateIpAddress", ""))):
        tags = {t["Key"]: t["Value"] for t in i.get("Tags") or []}
        table.add_row(
            i["InstanceId"],
            i["InstanceType"],
            i["Placement"]["AvailabilityZone"],
            i.get("InstanceLifecycle", "on-demand"),
            i["State"]["Name"],
            i.get("PrivateIpAddress", ""),
            tags.get("karpenter.sh/nodepool", ""),
            tags.get("Name", ""),
        )
    return table


# -- faults -------------------------------------------------------------------------------------


@sim.group()
def faults() -> None:
    """EC2 faults (capacity, throttling, nodes that never become ready) and Kubernetes API faults."""


def _print_faults(state: dict[str, Any]) -> None:
    console.print_json(data=state)


@faults.command("show")
@click.pass_context
def faults_show(ctx: click.Context) -> None:
    """Injected EC2 faults and counters, and the Kubernetes API fault rules."""
    client = _client(ctx)
    _print_faults(
        {"ec2": client.request("GET", "/sim/ec2/faults"), "api": client.request("GET", "/sim/faults")}
    )


@faults.command("clear")
@click.pass_context
def faults_clear(ctx: click.Context) -> None:
    """Remove every EC2 and API fault."""
    client = _client(ctx)
    client.request("DELETE", "/sim/ec2/faults")
    client.request("DELETE", "/sim/faults")
    console.print("All faults cleared.")


def _update_ec2(ctx: click.Context, change: Any) -> None:
    client = _client(ctx)
    spec = client.request("GET", "/sim/ec2/faults")["spec"]
    change(spec)
    _print_faults(client.request("PUT", "/sim/ec2/faults", spec))


@faults.command("ice")
@click.argument("instance_type")
@click.option("--zone", help="Only this zone (default: every zone).")
@click.option("--capacity-type", type=click.Choice(["on-demand", "spot"]), help="Only this capacity type.")
@click.option("--remove", is_flag=True, help="Make the pool available again.")
@click.pass_context
def faults_ice(
    ctx: click.Context, instance_type: str, zone: str | None, capacity_type: str | None, remove: bool
) -> None:
    """InsufficientInstanceCapacity for INSTANCE_TYPE (RunInstances fails, CreateFleet reports Errors[])."""
    pool = {"instance_type": instance_type, "zone": zone, "capacity_type": capacity_type}

    def change(spec: dict[str, Any]) -> None:
        pools = [p for p in spec["insufficient_capacity"] if p != pool]
        spec["insufficient_capacity"] = pools if remove else [*pools, pool]

    _update_ec2(ctx, change)


@faults.command("throttle")
@click.option(
    "--probability", type=float, default=0.0, help="Chance that a call fails with RequestLimitExceeded."
)
@click.option("--rps", type=float, help="Token bucket: calls per second per action before throttling.")
@click.option("--burst", type=int, default=10, help="Token bucket size.")
@click.option("--action", "actions", multiple=True, help="Only these EC2 actions (repeatable; default all).")
@click.pass_context
def faults_throttle(
    ctx: click.Context, probability: float, rps: float | None, burst: int, actions: tuple[str, ...]
) -> None:
    """Throttle karpflow's EC2 calls (the simulator's own are exempt). `--probability 0` turns it off."""

    def change(spec: dict[str, Any]) -> None:
        spec["throttle"] = {
            "probability": probability,
            "requests_per_second": rps,
            "burst": burst,
            "actions": list(actions),
        }

    _update_ec2(ctx, change)


@faults.command("never-ready")
@click.option("--instance-type", "types", multiple=True, help="Nodes of this type never become Ready.")
@click.option("--instance-id", "ids", multiple=True, help="This instance's node never becomes Ready.")
@click.pass_context
def faults_never_ready(ctx: click.Context, types: tuple[str, ...], ids: tuple[str, ...]) -> None:
    """Launched instances whose node registers but never becomes Ready."""
    if not types and not ids:
        raise click.UsageError("give --instance-type or --instance-id")

    def change(spec: dict[str, Any]) -> None:
        never = spec["never_ready"]
        never["instance_types"] = sorted({*never.get("instance_types", []), *types})
        never["instance_ids"] = sorted({*never.get("instance_ids", []), *ids})

    _update_ec2(ctx, change)


@faults.command("bad-ami")
@click.argument("image_id")
@click.option(
    "--pods-crash",
    is_flag=True,
    help="The nodes turn Ready but every container exits at once and crash-loops "
    "(default: the nodes never turn Ready).",
)
@click.option("--remove", is_flag=True, help="The image boots well again (nodes already up recover).")
@click.pass_context
def faults_bad_ami(ctx: click.Context, image_id: str, pods_crash: bool, remove: bool) -> None:
    """Instances booted from IMAGE_ID (an AMI id) never turn Ready, or their pods crash-loop."""
    if not image_id.startswith("ami-"):
        raise click.BadParameter(f"{image_id!r} is not an AMI id (ami-...)", param_hint="IMAGE_ID")

    def change(spec: dict[str, Any]) -> None:
        section = spec["crash_loop"] if pods_crash else spec["never_ready"]
        images = [i for i in section.get("image_ids", []) if i != image_id]
        section["image_ids"] = images if remove else [*images, image_id]

    _update_ec2(ctx, change)


@faults.command("api")
@click.option("--verb", default="*", help="Kubernetes verb: get, list, watch, create, update, patch, delete.")
@click.option("--resource", default="*", help='Plural, with subresource: "pods/eviction", "nodes".')
@click.option("--namespace")
@click.option("--name")
@click.option("--status", type=int, help="HTTP status to answer (429, 500, 409, 503...).")
@click.option("--rate", type=float, default=1.0, help="Fraction of matching requests that fail.")
@click.option("--latency-ms", type=float, default=0.0, help="Added latency.")
@click.option("--times", type=int, help="Fire at most this many times.")
@click.pass_context
def faults_api(ctx: click.Context, rate: float, **rule: Any) -> None:
    """Add a Kubernetes API fault rule (the emulator's `/sim/faults`)."""
    body = {key: value for key, value in rule.items() if value is not None}
    body["error_rate"] = rate
    _print_faults(_client(ctx).request("POST", "/sim/faults", body))


# -- the API's load -------------------------------------------------------------------------------


@sim.command("api-stats")
@click.option("--user", help="Only this user's verbs and resources (default: every user's).")
@click.option("--reset", is_flag=True, help="Start counting again after printing.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@click.pass_context
def api_stats(ctx: click.Context, user: str | None, reset: bool, as_json: bool) -> None:
    """Requests, response bytes, full LISTs and 429s the emulator served, by user, verb and resource."""
    from sim.api_stats_view import users_table, verbs_table
    from sim.apiserver.api_stats import StatsDoc

    doc = StatsDoc.model_validate(_client(ctx).request("GET", "/sim/api-stats"))
    if as_json:
        console.print_json(doc.model_dump_json())
    else:
        console.print(users_table(doc))
        for name in [user] if user else sorted({row.user for row in doc.rows}):
            console.print(verbs_table(doc, name))
    if reset:
        _client(ctx).request("DELETE", "/sim/api-stats")


@sim.command("flow-control")
@click.option("--seats-per-second", type=float, help="What the server serves a second, in seats.")
@click.option("--user-share", type=float, default=0.5, show_default=True, help="The most one user may take.")
@click.option("--off", is_flag=True, help="Turn flow control off (the default).")
@click.pass_context
def flow_control(ctx: click.Context, seats_per_second: float | None, user_share: float, off: bool) -> None:
    """Answer 429 with Retry-After to a user over its share of the server, as API Priority and Fairness
    would (simplified: sim/apiserver/flowcontrol.py). Without options: the current setting."""
    if off:
        state = _client(ctx).request("DELETE", "/sim/flowcontrol")
    elif seats_per_second is not None:
        body = {"seats_per_second": seats_per_second, "user_share": user_share}
        state = _client(ctx).request("PUT", "/sim/flowcontrol", body)
    else:
        state = _client(ctx).request("GET", "/sim/flowcontrol")
    console.print_json(data=state)


# -- interruptions -------------------------------------------------------------------------------


def _read_node(ctx: click.Context, name: str) -> dict[str, Any]:
    kubeconfig: Path | None = ctx.obj.get("kubeconfig")
    if kubeconfig is not None and kubeconfig.is_file():
        from kubernetes import client as k8s
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(kubeconfig))
        try:
            response = k8s.CoreV1Api(api).read_node(name, _preload_content=False)
        except k8s.ApiException as err:
            raise click.ClickException(f"node {name}: HTTP {err.status} {err.reason}") from None
        finally:
            api.close()
        return dict(json.loads(response.data))
    return dict(_client(ctx).request("GET", f"/api/v1/nodes/{name}"))


def instance_of(ctx: click.Context, node: str) -> str:
    """The EC2 instance behind NODE (its providerID), or NODE itself when it is an instance id."""
    if node.startswith("i-"):
        return node
    provider_id = str((_read_node(ctx, node).get("spec") or {}).get("providerID") or "")
    instance_id = provider_id.rsplit("/", 1)[-1]
    if not provider_id.startswith("aws://") or not instance_id.startswith("i-"):
        raise click.ClickException(f"node {node} names no EC2 instance (providerID {provider_id!r})")
    return instance_id


@sim.command()
@click.argument("node")
@click.option("--kind", type=click.Choice(KINDS), required=True, help="Which event EC2 or AWS Health sends.")
@click.option(
    "--queue",
    help="Send the message straight to this SQS queue (URL or name) instead of through EventBridge's rules.",
)
@click.pass_context
def interrupt(ctx: click.Context, node: str, kind: str, queue: str | None) -> None:
    """Send the EventBridge event EC2 (or AWS Health) sends about NODE's instance (a node name or an
    instance id): through EventBridge, whose rules (`karpflow dev up` creates them) deliver it to the
    interruption queue the worker polls. The instance itself is left as it is."""
    import boto3

    instance_id = instance_of(ctx, node)
    reservation_id = None
    if kind == "capacity-block-expiration":  # the warning names the node's capacity block
        labels = (_read_node(ctx, node).get("metadata") or {}).get("labels") or {}
        reservation_id = labels.get(CAPACITY_RESERVATION_ID_LABEL)
        if not reservation_id:
            raise click.ClickException(f"node {node} has no {CAPACITY_RESERVATION_ID_LABEL} label")
    status = _client(ctx).request("GET", "/sim/status")
    endpoint, region = status["ec2_endpoint"], status["region"]
    keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    what = f"{kind} event for {instance_id}" + (f" (node {node})" if node != instance_id else "")
    if queue is not None:
        sqs = boto3.client("sqs", endpoint_url=endpoint, region_name=region, **keys)
        url = queue if "://" in queue else sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        body = envelope(kind, instance_id, region=region, reservation_id=reservation_id)
        sent = sqs.send_message(QueueUrl=url, MessageBody=body)
        click.echo(f"Sent the {what} to {url} (message {sent['MessageId']})")
        return
    events = boto3.client("events", endpoint_url=endpoint, region_name=region, **keys)
    result = events.put_events(
        Entries=[entry(kind, instance_id, region=region, reservation_id=reservation_id)]
    )
    failed = [e for e in result.get("Entries") or () if e.get("ErrorCode")]
    if result.get("FailedEntryCount") or failed:
        raise click.ClickException(f"EventBridge refused the {what}: {failed}")
    event_id = (result.get("Entries") or [{}])[0].get("EventId", "?")
    click.echo(f"Sent the {what} through EventBridge (event {event_id})")


# -- state --------------------------------------------------------------------------------------


def dump_as_list(state: dict[str, Any]) -> dict[str, Any]:
    """The emulator's `/sim/state` as a kubectl-style List: a scenario or a planner snapshot."""
    items = [obj for objects in state.get("objects", {}).values() for obj in objects]
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


@sim.command()
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here (default stdout)."
)
@click.option("--json", "as_json", is_flag=True, help="JSON instead of YAML.")
@click.pass_context
def dump(ctx: click.Context, output: Path | None, as_json: bool) -> None:
    """Every object of the cluster as a kubectl List (usable by `karpflow plan --snapshot` and `sim load`)."""
    document = dump_as_list(_client(ctx).request("GET", "/sim/state"))
    text = json.dumps(document, indent=1) if as_json else yaml.safe_dump(document, sort_keys=False)
    if output is None:
        click.echo(text)
    else:
        output.write_text(text)
        console.print(f"Wrote {len(document['items'])} objects to {output}")


@sim.command()
@click.argument("scenario", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def load(ctx: click.Context, scenario: Path) -> None:
    """Replace the cluster with SCENARIO (its instances are terminated, the new ones launched)."""
    report = _client(ctx).request("POST", "/sim/scenario", raw=scenario.read_bytes())
    created = ", ".join(f"{n} {kind}" for kind, n in report["created"].items())
    console.print(f"Loaded {scenario}: {created}")
    for warning in report["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {warning}")


# -- chaos --------------------------------------------------------------------------------------


@sim.command()
@click.option("--seed", type=int, default=1, show_default=True, help="Every random choice of the run.")
@click.option("--minutes", type=float, default=2.0, show_default=True, help="Length of the fault phase.")
@click.option("--nodes", type=int, default=16, show_default=True, help="Nodes of the generated cluster.")
@click.option("--time-scale", type=float, default=0.05, show_default=True, help="Factor on simulated delays.")
@click.option(
    "--converge-within",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds the cluster may take to converge once the faults stop.",
)
@click.option(
    "--state-dir", "run_dir", type=click.Path(file_okay=False, path_type=Path), help="Keep its state here."
)
@click.option(
    "--keep-state", is_flag=True, help="Keep the state directory (logs, Temporal database) after a clean run."
)
@click.option(
    "--karpenter", is_flag=True, help="Coexistence: karpflow beside the simulated Karpenter (its NodeClaims)."
)
@click.option(
    "--permanent-faults/--no-permanent-faults",
    default=True,
    show_default=True,
    help="Evictions denied, an ownership tag removed (beside Karpenter: a NodeClaim held) for a while.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON at the end.")
def chaos(
    seed: int,
    minutes: float,
    nodes: int,
    time_scale: float,
    converge_within: float,
    run_dir: Path | None,
    keep_state: bool,
    karpenter: bool,
    permanent_faults: bool,
    as_json: bool,
) -> None:
    """Run karpflow's controller on a generated cluster of its own stack while injecting faults
    (killed workers, a Temporal restart, API and EC2 errors, vanished instances, spot interruptions,
    churn, and for a while evictions denied, an ownership tag removed or a NodeClaim held), then check
    convergence and every invariant (sim/chaos/). The seed replays a run."""
    import asyncio

    from sim.chaos.runner import ChaosConfig, run_chaos
    from sim.demo import exit_now

    config = ChaosConfig(
        seed=seed,
        minutes=minutes,
        nodes=nodes,
        time_scale=time_scale,
        converge_within=converge_within,
        state_dir=run_dir,
        keep_state=keep_state,
        karpenter=karpenter,
        permanent_faults=permanent_faults,
    )
    try:
        report = asyncio.run(
            run_chaos(config, say=lambda line: console.print(line, highlight=False, soft_wrap=True))
        )
    except Exception as err:
        console.print(f"[red]the chaos run could not run:[/red] {err!r}", highlight=False)
        exit_now(2)
    if as_json:
        click.echo(report.model_dump_json(indent=1))
    exit_now(0 if report.ok else 1)
