"""What karpflow asks of the API server on a large cluster, idle and during a drift: prints figures,
asserts nothing (issue 34).

    .venv/bin/python bench/bench_api_load.py                  # 5,000 nodes / 100,000 pods, 500 drifted
    .venv/bin/python bench/bench_api_load.py --nodes 500      # 500 / 10,000, 50 drifted: a few minutes

The stack is the chaos harness's (sim/chaos/): a Temporal dev server, the simulator in this process
(the emulator, kubelets, scheduler, workload controllers, EC2 in moto), and one `karpflow worker`
process running the controller, authenticated as the `karpflow-worker` ServiceAccount (a
TokenRequest token) so the emulator counts its requests apart (sim/apiserver/api_stats.py). The
cluster is bench/gen_cluster.py's (no drifted, expired, NotReady or empty nodes, no blocking PDBs or
do-not-disrupt pods: the drift is the only work). A tenth of the nodes are moved to a NodePool of
their own (`<pool>-wave`, a copy of theirs, whose budget lets a tenth of them go at once: 50 of 500);
every other pool's budget is 0 and nothing consolidates or expires.

1. Sync: the worker starts; its informer lists everything; the controller's first pass.
2. Idle (`--idle-seconds`): nothing to do. Goal: under 1 request/s, watches aside.
3. Drift: the wave pool's template gets a new label, as a user's edit would (every node of it is
   drifted by the NodePool hash); until every drifted node is gone (or `--drift-minutes`).
   Goals: under 2 requests/s on average per node in flight (tainted or deleting), under 50/s in all.
Through both: full LISTs of Nodes and Pods per minute after the sync (goal: none), the worker's CPU.

The worker's intervals are production's (controller pass every 10 s, polls every 1 s, EC2 every
5 s): they set the polling rate. Only the simulated cluster runs faster (`--time-scale`: node
launches, grace periods), so the drift finishes sooner; what a node's drain does once (evictions,
Events) then falls into fewer seconds in flight, so requests per node in flight read high at a fast
pace, and the bench prints requests per node replaced beside them.

Measured on 2 cores shared with seven other sessions (load average ~10), before the client's cache
reads, pagination and rate limits of issue 34 (the emulator's side only):
- `--nodes 500` (10,000 pods, 50 drifted, 5 at once; `--idle-seconds 30 --drift-minutes 8`):
  cluster loaded in 106 s, worker synced and first pass 43 s. Idle: 0.07 requests/s (`GET /apis`
  discovery only), no full LIST, worker at 2 % of a core. Drift: 29 of 50 nodes replaced in the 8
  minutes, 3.1 nodes in flight on average, 10.4 requests/s from karpflow = 3.3 per node in flight
  (goal < 2): Events 6.6/s (PATCH 5.0, POST 1.6), evictions 1.3/s, node GETs 0.85/s, PDB LISTs
  0.43/s, node updates 0.3/s, pod LISTs by node 0.28/s, NodePool GETs 0.27/s; full LISTs of
  NodeDisruptionBudgets (61), MaintenanceWindows (33), VolumeAttachments (31) and one of Nodes (the
  informer listing again after its node watch ended); worker at 5 % of a core: 172 requests per
  node replaced. A second run on a quieter machine (`--idle-seconds 20 --drift-minutes 2`): sync 16
  s, idle 0.00 requests/s, 28 nodes replaced in 2 minutes at 26.5 requests/s (2.6 in flight: 10 per
  node in flight, the pace's effect above), no full LIST of Nodes or Pods, 114 requests per node
  replaced, worker at 11 % of a core.
- 5,000 nodes (100,000 pods asked, 500 drifted): the simulator took 31 minutes to seed the cluster
  (one RunInstances a node into moto), then the worker never synced in the 14 minutes it was given:
  its unpaginated LIST of every Pod, served by the emulator beside the simulated kubelets and
  scheduler in one busy process, did not answer within the worker's 30 s request timeout, so every
  informer listed again every 30 s (issue 34's pagination is the cure; `--kube-request-timeout`
  raises the timeout meanwhile). No idle or drift figures at this size yet.

After issue 34's follow-up (the eviction gate on the cached PDB, the guards' reads from the cache,
one Event per held-back node), `--nodes 500 --idle-seconds 90 --drift-minutes 8`, load average ~11:
- before (the cache reads of issue 34 merged; this bench's diagnostics added, its pools' hashes not
  yet restamped, so the 450 other nodes read as drifted): idle 6.36 requests/s (567 Event PATCHes
  in 90 s: DisruptionBlocked on each budget-0 node a minute); drift 50/50 in 257 s, 3.1 in flight,
  22.3 requests/s = 7.26 per node in flight, 115 per node replaced: Events 65 (DisruptionBlocked
  44, Evicted 20), evictions 26.5 (20 answered 201, 6.3 answered 404: pods the drain had evicted,
  shown by the cache a moment later; 0.08 answered 429), node GETs 8, NodePool GETs 4, node
  updates 4, pod LISTs 3, full LISTs of MaintenanceWindows, NodeDisruptionBudgets and
  VolumeAttachments 1 each;
- after: idle 0.17 requests/s (Event PATCHes of the NodePools' budget Events); drift 50/50 in 286 s,
  3.3 in flight, 11.0 requests/s = 3.30 per node in flight, 63 per node replaced: evictions 20.2
  (0.16 answered 429), Evicted Events 20.2, DisruptionBlocked 5.9, node GETs 4.3 and updates 4.3,
  pod LISTs 3, DisruptionTerminating 1, VolumeAttachment LIST 1 (the volume wait's confirmation),
  NodePool GET 1 (the replacement's template), node DELETE 1. Two thirds of what is left is one
  eviction and one `Evicted` Event per pod, as Karpenter sends them: at this pace (a node in flight
  19 s) that alone is 2.1 requests/s per node in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from api import constants as k
from api.controller_io import ControllerStatus
from api.hashes import nodepool_hash_annotations
from api.nodepool import NodePool
from api.workflow_ids import controller_workflow_id
from bench.bench_controller import with_images
from bench.gen_cluster import bench_spec
from bench.goals import Goal, print_goals
from sim.api_stats_view import difference, verbs_table
from sim.apiserver.api_stats import StatsDoc
from sim.chaos.processes import TemporalServer, Workers
from sim.chaos.runner import worker_env
from sim.cluster_builder import generate_cluster
from sim.interruption_queue import ensure_interruption_queue
from sim.scenario import scenario_from_documents
from sim.stack import SimStack

NAMESPACE, ACCOUNT = "karpflow", "karpflow-worker"
USER = f"system:serviceaccount:{NAMESPACE}:{ACCOUNT}"
WAVE_LABEL = "bench.karpflow.dev/wave"
TICKS = os.sysconf("SC_CLK_TCK")
console = Console(width=130)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


# -- the cluster ---------------------------------------------------------------------------------


def with_owners(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The generator names its pods' owners without writing them all (the planner needs only the
    reference): the ReplicaSets are written here, from their pods, so evicted pods come back as
    a ReplicaSet controller would bring them; DaemonSet pods point at their DaemonSet's uid."""
    daemonsets = {
        (o["metadata"]["namespace"], o["metadata"]["name"]): o["metadata"]["uid"]
        for o in objects
        if o["kind"] == "DaemonSet"
    }
    replicasets: dict[tuple[str, str], dict[str, Any]] = {}
    for pod in (o for o in objects if o["kind"] == "Pod"):
        meta = pod["metadata"]
        for ref in meta.get("ownerReferences") or ():
            key = (meta.get("namespace") or "default", ref["name"])
            if ref["kind"] == "DaemonSet" and key in daemonsets:
                ref["uid"] = daemonsets[key]
            elif ref["kind"] == "ReplicaSet":
                rs = replicasets.get(key)
                if rs is None:
                    template = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
                    rs = replicasets[key] = {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "metadata": {"name": key[1], "namespace": key[0], "uid": ref["uid"]},
                        "spec": {
                            "replicas": 0,
                            "selector": {"matchLabels": dict(meta.get("labels") or {})},
                            "template": {
                                "metadata": {"labels": dict(meta.get("labels") or {})},
                                "spec": template,
                            },
                        },
                    }
                rs["spec"]["replicas"] += 1
    return [*objects, *replicasets.values()]


def build_cluster(nodes: int, pods: int, drift: int, seed: int) -> tuple[list[dict[str, Any]], set[str]]:
    """gen_cluster's cluster with nothing to do, and `drift` nodes in a wave pool of their own."""
    spec = bench_spec(nodes, pods, seed)
    spec.drifted_fraction = spec.expired_fraction = spec.not_ready_fraction = spec.empty_fraction = 0.0
    spec.blocking_pdb_fraction = spec.do_not_disrupt_fraction = 0.0
    spec.budgets = [[{"nodes": "0"}]]
    objects = with_owners(with_images(generate_cluster(spec, now=datetime.now(UTC)).objects))
    pools = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NodePool"}
    for pool in pools.values():
        pool["spec"]["disruption"]["consolidateAfter"] = "Never"
        pool["spec"]["template"]["spec"]["expireAfter"] = "Never"
    source = sorted(pools)[0]
    wave = copy.deepcopy(pools[source])
    wave["metadata"]["name"] = f"{source}-wave"
    wave["spec"]["disruption"]["budgets"] = [{"nodes": str(max(1, drift // 10))}]
    pools[wave["metadata"]["name"]] = wave
    # The hashes of the pools as edited here (expireAfter is in the template's hash): stamped on every
    # node, or all of them read as drifted and the idle cluster is not idle (held back by budget 0).
    stamps = {name: nodepool_hash_annotations(NodePool.model_validate(pool)) for name, pool in pools.items()}
    moved: set[str] = set()
    for obj in (o for o in objects if o["kind"] == "Node"):
        labels = obj["metadata"].get("labels") or {}
        if labels.get(k.NODEPOOL_LABEL) == source and len(moved) < drift:
            labels[k.NODEPOOL_LABEL] = wave["metadata"]["name"]
            moved.add(obj["metadata"]["name"])
        if labels.get(k.NODEPOOL_LABEL) in stamps:
            obj["metadata"].setdefault("annotations", {}).update(stamps[labels[k.NODEPOOL_LABEL]])
    if len(moved) < drift:
        raise SystemExit(f"pool {source} has only {len(moved)} nodes; ask for a smaller --drift")
    return [*objects, wave], moved


# -- the run ---------------------------------------------------------------------------------------


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.state_dir = Path(tempfile.mkdtemp(prefix="karpflow-api-load-"))
        self.cluster = f"api-load-{uuid.uuid4().hex[:4]}"
        self.temporal = TemporalServer(self.state_dir)
        self.stack: SimStack | None = None
        self.workers: Workers | None = None
        self.client: Client | None = None
        self.goals: list[Goal] = []
        # During the drift: karpflow's requests by (verb, resource, code), its Events by reason.
        self.codes_before: Counter[tuple[str, str, int]] = Counter()
        self.codes_during: Counter[tuple[str, str, int]] = Counter()
        self.events_before: dict[str, tuple[str, int]] = {}
        self.events_during: dict[str, tuple[int, int]] = {}

    def stats(self) -> StatsDoc:
        assert self.stack is not None
        return self.stack.api.stats.doc()

    async def status(self) -> ControllerStatus | None:
        assert self.client is not None
        with contextlib.suppress(Exception):
            handle = self.client.get_workflow_handle(controller_workflow_id(self.cluster))
            return await handle.query("status", result_type=ControllerStatus)
        return None

    async def start(self, objects: list[dict[str, Any]]) -> float:
        a = self.args
        began = time.monotonic()
        await asyncio.to_thread(self.temporal.start)
        await asyncio.to_thread(self.temporal.register_search_attributes)
        self.stack = SimStack(
            time_scale=a.time_scale, cluster_name=self.cluster, scenario=scenario_from_documents(objects)
        )
        await asyncio.to_thread(self.stack.start, 3600.0)
        stack = self.stack
        print(f"   cluster loaded into the simulator in {time.monotonic() - began:.0f} s", flush=True)
        # The worker's identity: a ServiceAccount and a token the TokenRequest API would give.
        with contextlib.suppress(Exception):
            stack.store.create("namespaces", {"metadata": {"name": NAMESPACE}})
        stack.store.create("serviceaccounts", {"metadata": {"name": ACCOUNT}}, NAMESPACE)
        token_file = self.state_dir / "token"
        token_file.write_text(stack.api.issuer.issue(NAMESPACE, ACCOUNT, 7 * 86400)[0])
        queue = await asyncio.to_thread(
            ensure_interruption_queue, stack.ec2_endpoint, stack.region, f"{self.cluster}-interruption"
        )
        env = worker_env(stack, self.temporal, queue, a.time_scale)
        env.update(
            KARPFLOW_KUBE_TOKEN_FILE=str(token_file),
            # Production's pace, which sets the request rate (docstring).
            KARPFLOW_CONTROLLER_INTERVAL="10",
            KARPFLOW_CONTROLLER_VALIDATION="15",
            KARPFLOW_POLL_INTERVAL="1",
            KARPFLOW_EC2_POLL_INTERVAL="5",
            KARPFLOW_KUBE_REQUEST_TIMEOUT=str(a.kube_request_timeout),
        )
        logs = self.state_dir / "logs"
        logs.mkdir()
        self.client = await Client.connect(self.temporal.address, data_converter=pydantic_data_converter)
        self.workers = Workers(env, logs)
        self.worker_began = time.monotonic()
        self.workers.start("a")
        deadline = time.monotonic() + 3600
        while True:
            status = await self.status()
            if status is not None and status.passes > 0:
                break
            self.workers.check()
            if self.workers.exits or time.monotonic() > deadline:
                raise RuntimeError(f"no first pass: {self.workers.exits or 'timed out'} (logs in {logs})")
            await asyncio.sleep(1)
        synced = time.monotonic() - self.worker_began
        print(f"   worker synced and first pass done {synced:.0f} s after it started", flush=True)
        return synced

    @property
    def pid(self) -> int:
        assert self.workers is not None
        return self.workers.running["a"].process.pid

    def in_flight(self) -> int:
        """Nodes karpflow is disrupting: tainted or deleting."""
        assert self.stack is not None
        count = 0
        for node in self.stack.store.list("nodes").items:
            taints = (node.get("spec") or {}).get("taints") or ()
            if node["metadata"].get("deletionTimestamp") or any(
                t.get("key") in k.DISRUPTION_TAINT_KEYS for t in taints
            ):
                count += 1
        return count

    def remaining(self, drifted: set[str]) -> int:
        assert self.stack is not None
        return sum(1 for n in self.stack.store.list("nodes").items if n["metadata"]["name"] in drifted)

    async def events_written(self, quiet: float = 10.0, most: float = 180.0) -> None:
        """Until the first passes' Events are written (the recorder writes a pass's batch in the
        background: at 500 nodes, on a loaded machine, that outlasts the settle time): no new Event
        from karpflow for `quiet` seconds, at most `most`. The idle window is then the steady state."""
        began = time.monotonic()

        def posted() -> int:
            return sum(r.requests for r in self.stats().rows if r.user == USER and r.resource == "events")

        last, since = posted(), time.monotonic()
        while time.monotonic() - since < quiet and time.monotonic() - began < most:
            await asyncio.sleep(2)
            if (now := posted()) != last:
                last, since = now, time.monotonic()
        print(
            f"   first passes' Events written {time.monotonic() - began:.0f} s after the settle", flush=True
        )

    async def window(self, seconds: float) -> tuple[StatsDoc, float]:
        """The karpflow user's requests over `seconds`, and the worker's CPU (% of one core)."""
        before, cpu = self.stats(), cpu_seconds(self.pid)
        await asyncio.sleep(seconds)
        return difference(self.stats(), before), cpu

    def codes(self) -> Counter[tuple[str, str, int]]:
        """karpflow's requests by (verb, resource, status code) so far."""
        assert self.stack is not None
        return Counter(
            {
                (key.verb, key.resource, code): count
                for key, code, count in self.stack.api.stats.by_code()
                if key.user == USER and key.verb != "watch"
            }
        )

    def event_counts(self) -> dict[str, tuple[str, int]]:
        """karpflow's Events in the store: name -> (reason, count)."""
        assert self.stack is not None
        return {
            f"{e['metadata'].get('namespace')}/{e['metadata']['name']}": (
                str(e.get("reason")),
                int(e.get("count") or 1),
            )
            for e in self.stack.store.list("events").items
            if (e.get("source") or {}).get("component") == "karpflow"
        }

    async def drift(self, drifted: set[str], wave_pool: str) -> tuple[StatsDoc, float, float, float]:
        """Edit the wave pool's template; wait until its old nodes are gone. Returns the counts, the
        worker's CPU seconds, the mean nodes in flight and the seconds it took."""
        assert self.stack is not None
        before, cpu = self.stats(), cpu_seconds(self.pid)
        self.codes_before, self.events_before = self.codes(), self.event_counts()
        self.stack.store.patch(
            "nodepools",
            wave_pool,
            {"spec": {"template": {"metadata": {"labels": {WAVE_LABEL: "2"}}}}},
            patch_type="merge",
        )
        began = time.monotonic()
        samples: list[int] = []
        last_print = began
        while (left := self.remaining(drifted)) and time.monotonic() - began < self.args.drift_minutes * 60:
            samples.append(self.in_flight())
            if time.monotonic() - last_print >= 30:
                last_print = time.monotonic()
                doc = difference(self.stats(), before)
                asked = sum(r.requests for r in doc.rows if r.user == USER and r.verb != "watch")
                print(
                    f"   {last_print - began:5.0f} s: {len(drifted) - left}/{len(drifted)} replaced, "
                    f"{samples[-1]} in flight, {asked / max(1e-9, doc.seconds):.1f} req/s from karpflow",
                    flush=True,
                )
            await asyncio.sleep(2)
        elapsed = time.monotonic() - began
        mean = sum(samples) / len(samples) if samples else 0.0
        self.codes_during = self.codes() - self.codes_before
        self.events_during = events_written(self.events_before, self.event_counts())
        return difference(self.stats(), before), cpu_seconds(self.pid) - cpu, mean, elapsed

    async def stop(self) -> None:
        if self.workers is not None:
            await asyncio.to_thread(self.workers.stop_all)
        if self.stack is not None:
            await asyncio.to_thread(self.stack.stop)
        await asyncio.to_thread(self.temporal.stop)


def karpflow_rate(doc: StatsDoc) -> float:
    return sum(r.requests for r in doc.rows if r.user == USER and r.verb != "watch") / max(doc.seconds, 1e-9)


def full_lists_per_minute(doc: StatsDoc, resource: str) -> float:
    count = sum(r.full_lists for r in doc.rows if r.user == USER and r.resource == resource)
    return count / max(doc.seconds, 1e-9) * 60


def events_written(
    before: dict[str, tuple[str, int]], after: dict[str, tuple[str, int]]
) -> dict[str, tuple[int, int]]:
    """Events karpflow wrote between two readings, by reason: (new Events: POSTs, counts added to
    Events already there: PATCHes)."""
    out: dict[str, tuple[int, int]] = {}
    for name, (reason, count) in after.items():
        posts, patches = out.get(reason, (0, 0))
        old = before.get(name)
        if old is None:
            out[reason] = (posts + 1, patches + count - 1)
        elif count > old[1]:
            out[reason] = (posts, patches + count - old[1])
    return out


def print_drift_detail(run: Run, replaced: int) -> None:
    """What the drift's requests were: status codes (evictions answered 429 are retries) and
    karpflow's Events by reason, each per node replaced."""
    per = max(1, replaced)
    print("   drift, by verb, resource and code (per node replaced):")
    for (verb, resource, code), count in sorted(run.codes_during.items(), key=lambda item: -item[1]):
        print(f"     {verb:7} {resource:40} {code}  {count:6}  {count / per:7.2f}")
    print("   drift, karpflow's Events by reason: POSTs, PATCHes (per node replaced):")
    for reason, (posts, patches) in sorted(run.events_during.items(), key=lambda item: -sum(item[1])):
        print(f"     {reason:45} {posts:6} {patches:6}  {posts / per:7.2f} {patches / per:7.2f}")


def report(name: str, doc: StatsDoc, cpu: float) -> None:
    console.print(verbs_table(doc, USER, title=f"{name}: karpflow's requests over {doc.seconds:.0f} s"))
    print(
        f"   {name}: {karpflow_rate(doc):.2f} req/s from karpflow (watches aside); full LISTs a minute: "
        f"nodes {full_lists_per_minute(doc, 'nodes'):.2f}, pods {full_lists_per_minute(doc, 'pods'):.2f}; "
        f"worker CPU {cpu / max(doc.seconds, 1e-9) * 100:.0f} % of a core",
        flush=True,
    )


async def main(args: argparse.Namespace) -> int:
    drift = args.drift or max(1, args.nodes // 10)
    pods = args.pods or args.nodes * 20
    print(f"== {args.nodes} nodes / {pods} pods, {drift} drifted ({max(1, drift // 10)} at once)", flush=True)
    began = time.monotonic()
    objects, drifted = build_cluster(args.nodes, pods, drift, args.seed)
    wave_pool = next(
        o["metadata"]["name"] for o in objects if o["kind"] == "NodePool" and "-wave" in o["metadata"]["name"]
    )
    print(f"   generated in {time.monotonic() - began:.0f} s", flush=True)
    run = Run(args)
    goals: list[Goal] = []
    try:
        synced = await run.start(objects)
        # Everything karpflow asked until its first pass: the informer's lists, over the sync's time.
        console.print(
            verbs_table(
                run.stats(), USER, seconds=synced, title=f"sync: karpflow's requests over {synced:.0f} s"
            )
        )
        await asyncio.sleep(args.settle_seconds)
        await run.events_written()
        idle, cpu = await run.window(args.idle_seconds)
        idle_cpu = cpu_seconds(run.pid) - cpu
        report("idle", idle, idle_cpu)
        during, drift_cpu, mean_in_flight, took = await run.drift(drifted, wave_pool)
        left = run.remaining(drifted)
        print(
            f"   drift: {len(drifted) - left}/{len(drifted)} replaced in {took:.0f} s, "
            f"{mean_in_flight:.1f} nodes in flight on average",
            flush=True,
        )
        report("drift", during, drift_cpu)
        print_drift_detail(run, len(drifted) - left)
        rate = karpflow_rate(during)
        per_node = rate / mean_in_flight if mean_in_flight else float("nan")
        after_sync = [idle, during]
        lists = sum(
            full_lists_per_minute(d, r) * d.seconds / 60 for d in after_sync for r in ("nodes", "pods")
        )
        goals = [
            Goal("worker sync and first pass", "-", f"{synced:.0f} s"),
            Goal("full LISTs of Nodes and Pods after the sync", "0", f"{lists:.0f}", lists == 0),
            Goal(
                "idle: karpflow's requests/s (watches aside)",
                "< 1",
                f"{karpflow_rate(idle):.2f}",
                karpflow_rate(idle) < 1,
            ),
            Goal("drift: requests/s per node in flight", "< 2", f"{per_node:.2f}", per_node < 2),
            Goal("drift: karpflow's requests/s in all", "< 50", f"{rate:.1f}", rate < 50),
            # Apart from the simulated cluster's pace (--time-scale), which compresses a node's
            # evictions and Events into fewer seconds in flight.
            Goal(
                "drift: karpflow's requests per node replaced",
                "-",
                f"{rate * during.seconds / max(1, len(drifted) - left):.0f}",
            ),
            Goal(
                "drift finished", f"{len(drifted)} nodes", f"{len(drifted) - left} in {took:.0f} s", left == 0
            ),
        ]
    finally:
        await run.stop()
    print_goals(f"API load, {args.nodes:,} nodes (bench_api_load.py)", goals)
    if all(g.met is not False for g in goals) and goals and not args.keep_state:
        shutil.rmtree(run.state_dir, ignore_errors=True)
    else:
        print(f"state and worker logs kept in {run.state_dir}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, help="default: 20 a node")
    parser.add_argument("--drift", type=int, help="nodes drifted (default: a tenth); a tenth of them at once")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--time-scale", type=float, default=0.05, help="the simulated cluster's pace")
    parser.add_argument(
        "--settle-seconds", type=float, default=20.0, help="after the first pass, before idle"
    )
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--drift-minutes", type=float, default=20.0, help="stop waiting for the drift after")
    parser.add_argument(
        "--kube-request-timeout",
        type=float,
        default=30.0,
        help="the worker's Kubernetes request timeout (its default: 30 s; see the 5,000-node figures)",
    )
    parser.add_argument("--keep-state", action="store_true")
    code = 1
    try:
        code = asyncio.run(main(parser.parse_args()))
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        os._exit(code)  # the Temporal SDK may abort at interpreter exit (sdk-python #300)
