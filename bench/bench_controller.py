"""What one controller pass costs the worker, at the scale of the largest EKS clusters.

    python bench/bench_controller.py                           # 1,000 nodes / 20,000 pods
    python bench/bench_controller.py --sizes 5000x100000
    python bench/bench_controller.py --sizes 10000x200000      # ~10 min, ~6 GB in all
    python bench/bench_controller.py --sizes 20000x400000      # issue 34's size

Each part runs in its own process, as in production, so the figures are the worker's own:
- the Kubernetes API emulator (`python -m sim.apiserver`, no simulated controllers, so nothing
  changes but what the bench changes), loaded with a generated cluster
  (sim.cluster_builder.generate_cluster) by a short-lived loader process;
- the Temporal dev server (the pass asks visibility what is in flight);
- the worker: the informer cache (cluster/informer.py) and the controller's real `plan_pass`
  activity (activities/planning.py), run in an activity context with its result encoded by the
  worker's data converter, as a Temporal worker runs it. It reports, per pass: wall time, CPU time of
  the process, time spent in the garbage collector, RSS; and the API requests the pass made.
Meanwhile the bench churns the cluster (`--churn` pod changes a second: half are edits, half a pod
deleted and another created), so each pass after the first sees a cluster that moved.

The figures are printed against the goals (issue 21) as a table. Timing is never asserted here: the
machine may be shared, so run it twice and read the spread.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.goals import Goal, print_goals  # noqa: E402

# issue 21's goals (and issue 34's at 20,000 nodes): pass wall time and worker RSS per size.
PASS_GOALS = {1000: 0.5, 5000: 3.0, 10000: 6.0, 20000: 10.0}
RSS_GOALS_MB = {5000: 1536, 10000: 3072, 20000: 3584}
EMULATOR_TIMEOUT = 1800.0


def with_images(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The generator writes what the planner reads; the emulator also wants what a real API server
    requires (a container image)."""
    for item in items:
        spec = item.get("spec") or {}
        pod_spec = (spec.get("template") or {}).get("spec") if item["kind"] != "Pod" else spec
        for container in (pod_spec or {}).get("containers") or ():
            container.setdefault("image", "registry.k8s.io/pause:3.10")
    return items


def http(url: str, method: str = "GET", body: Any = None, content_type: str = "application/json") -> Any:
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": content_type})
    with urllib.request.urlopen(request, timeout=EMULATOR_TIMEOUT) as response:
        return json.loads(response.read() or b"null")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int | None = None) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


# -- the loader process ------------------------------------------------------------------------------


def load(url: str, nodes: int, pods: int, names: Path) -> None:
    """Generate the cluster and load it into the emulator; write the pods' keys for the churn."""
    from datetime import UTC, datetime

    from sim.cluster_builder import ClusterSpec, generate_cluster

    # Ages are relative to now: the worker plans at the wall clock's time, and a cluster generated at
    # the builder's fixed date would age by the days since, expiring a fifth of its nodes (issue 34).
    spec = ClusterSpec(nodes=nodes, pods=pods, pools=4, seed=1)
    items = with_images(generate_cluster(spec, now=datetime.now(UTC)).objects)
    import orjson

    # A loaded store has no namespaces unless given: the churn creates pods in them.
    namespaces = sorted({item["metadata"].get("namespace") or "default" for item in items} - {"default"})
    spaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in namespaces]
    body = b"\n".join(orjson.dumps(item) for item in [*spaces, *items])
    http(f"{url}/sim/state", "POST", body, "application/x-ndjson")
    keys = [
        f"{item['metadata'].get('namespace') or 'default'}/{item['metadata']['name']}"
        for item in items
        if item["kind"] == "Pod" and (item.get("spec") or {}).get("nodeName")
    ]
    names.write_text("\n".join(keys))
    counts: dict[str, int] = {}
    for item in items:
        counts[item["kind"]] = counts.get(item["kind"], 0) + 1
    print(json.dumps(counts), flush=True)


# -- the worker process ------------------------------------------------------------------------------


class GcClock:
    """Seconds the garbage collector ran, and its full (generation 2) collections."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.full += info.get("generation") == 2


async def work(url: str, temporal: str, passes: int, pause: float, profile: str | None) -> None:
    from temporalio.client import Client
    from temporalio.testing import ActivityEnvironment

    from activities.planning import PlanningActivities
    from api.controller_io import PassRequest
    from cluster.heap import HeapFreezer
    from cluster.informer import ClusterCache
    from kube.client import KubeApi
    from runtime.connections import with_karpflow_converter

    clock = GcClock()
    kube = KubeApi.for_host(url, user_agent="karpflow-bench", request_timeout=EMULATOR_TIMEOUT)
    client = with_karpflow_converter(await Client.connect(temporal))
    cache = ClusterCache(kube, heap=HeapFreezer())  # as the worker process has it (worker.py serve)
    began = time.perf_counter()
    cache.start()
    assert await cache.wait_synced(EMULATOR_TIMEOUT), cache.unsynced()
    synced, gc_at_sync = time.perf_counter(), clock.seconds
    # What a pass waits for after the sync: the cache parsed for the planner (informer.py).
    assert await cache.wait_ready(EMULATOR_TIMEOUT)
    report(
        {
            "synced_s": round(synced - began, 1),
            "ready_s": round(time.perf_counter() - synced, 1),
            "ready_gc_s": round(clock.seconds - gc_at_sync, 1),
            "rss_mb": round(rss_mb()),
        }
    )
    # As the worker builds it (worker.py), less EC2 (bench_instance_descriptions.py measures that).
    planning = PlanningActivities(
        cache, kube, client, task_queue="bench-controller", region="us-west-2", cluster="bench"
    )
    env = ActivityEnvironment()
    base = ""
    for index in range(passes):
        await asyncio.sleep(pause)
        mark = http(f"{url}/sim/requests?limit=1")["items"]
        since = mark[-1]["seq"] if mark else 0
        gc_before, full_before = clock.seconds, clock.full
        hits_before, misses_before = planning.pass_cache.hits, planning.pass_cache.misses
        wall, cpu = time.perf_counter(), time.process_time()
        profiler = ThreadProfile() if profile and index == passes - 1 else None
        if profiler is not None:
            profiler.loop.enable()
        result = await env.run(planning.plan_pass, PassRequest(reasons_base=base))
        await client.data_converter.encode([result])  # what the worker sends back to Temporal
        if profiler is not None:
            profiler.loop.disable()
            asyncio.to_thread = profiler.real  # type: ignore[assignment]
            profiler.profile.dump_stats(profile)
            profiler.loop.dump_stats(f"{profile}.loop")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        requests = [
            r
            for r in http(f"{url}/sim/requests?since={since}")["items"]
            if (r.get("user_agent") or "").startswith("karpflow-bench") and r.get("verb") != "watch"
        ]
        base = result.reasons.fingerprint if result.reasons is not None else ""
        report(
            {
                "pass": index + 1,
                "wall_s": round(wall, 3),
                "cpu_s": round(cpu, 3),
                "gc_s": round(clock.seconds - gc_before, 3),
                "gc_full": clock.full - full_before,
                "requests": len(requests),
                "pod_lists": sum(1 for r in requests if r["verb"] == "list" and r["resource"] == "pods"),
                "commands": len(result.commands),
                "nodes": result.nodes,
                "pods": result.pods,
                "rss_mb": round(rss_mb()),
                # Nodes whose pod work the pass took from the last one (planner/pass_cache.py).
                "reused": planning.pass_cache.hits - hits_before,
                "redone": planning.pass_cache.misses - misses_before,
            }
        )
    report(
        {
            # The heap is frozen once the first pass is planned (informer.py), between passes.
            "freezes": cache.heap.freezes if cache.heap else 0,
            "freeze_s": round(cache.heap.last_seconds if cache.heap else 0.0, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "events": sum(s.events for s in cache.stats().values()),
        }
    )
    await cache.stop()
    await kube.close()


class ThreadProfile:
    """cProfile of what the pass runs in threads (`asyncio.to_thread`: the snapshot and the planner),
    and apart (`loop`, dumped to FILE.loop) of what it runs on the event loop: the rest of the activity
    and the encoding of its result."""

    def __init__(self) -> None:
        import cProfile

        self.profile = cProfile.Profile()
        self.loop = cProfile.Profile()
        self.real = asyncio.to_thread

        async def to_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await self.real(self.profile.runcall, fn, *args, **kwargs)

        asyncio.to_thread = to_thread  # type: ignore[assignment]


def report(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)


# -- the bench ---------------------------------------------------------------------------------------


class Churn(threading.Thread):
    """`rate` pod changes a second against the emulator: edits (an annotation) and replacements (the
    pod deleted and a copy created under a new name), as Deployments roll in a live cluster."""

    def __init__(self, url: str, keys: list[str], rate: float) -> None:
        super().__init__(daemon=True)
        self.url, self.keys, self.rate = url, keys, rate
        self.stop = threading.Event()
        self.changes = 0
        self.errors = 0
        self.first_error = ""
        self.random = random.Random(3)

    def run(self) -> None:
        while self.rate > 0 and self.keys and not self.stop.wait(1.0 / self.rate):
            try:
                self.change()
                self.changes += 1
            except Exception as err:
                self.errors += 1
                if not self.first_error:
                    detail = err.read()[:200] if isinstance(err, urllib.error.HTTPError) else b""
                    self.first_error = f"{err!r} {detail!r}"

    def change(self) -> None:
        index = self.random.randrange(len(self.keys))
        namespace, name = self.keys[index].split("/", 1)
        path = f"{self.url}/api/v1/namespaces/{namespace}/pods"
        if self.changes % 2 == 0:
            patch = {"metadata": {"annotations": {"bench.karpflow.io/edit": str(self.changes)}}}
            http(f"{path}/{name}", "PATCH", patch, "application/merge-patch+json")
            return
        pod = http(f"{path}/{name}")
        http(f"{path}/{name}?gracePeriodSeconds=0", "DELETE")
        meta = pod["metadata"]
        renamed = f"{name.rsplit('-r', 1)[0]}-r{self.changes}"
        pod["metadata"] = {k: v for k, v in meta.items() if k not in ("uid", "resourceVersion")}
        pod["metadata"]["name"] = renamed
        http(path, "POST", pod)
        self.keys[index] = f"{namespace}/{renamed}"


def measure(size: str, passes: int, pause: float, churn: float, profile: str | None) -> dict[str, Any]:
    from temporalio.testing import WorkflowEnvironment

    from sim.binaries import temporal_cli

    nodes, pods = (int(x) for x in size.split("x"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    python = sys.executable
    emulator = subprocess.Popen(
        [python, "-m", "sim.apiserver", "--port", str(port), "--timescale", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # The profiled pass (the last) runs under cProfile, several times slower: not a figure to read.
    out: dict[str, Any] = {"size": size, "nodes": nodes, "pods": pods, "profiled": bool(profile)}

    async def temporal() -> Any:
        return await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_cli(),
            ui=False,
            dev_server_extra_args=["--dynamic-config-value", "frontend.enableServerVersionCheck=false"],
            dev_server_log_level="error",
        )

    loop = asyncio.new_event_loop()
    try:  # on a loaded machine the dev server may miss its 5 s to start: try again once
        env = loop.run_until_complete(temporal())
    except RuntimeError:
        try:
            env = loop.run_until_complete(temporal())
        except BaseException:
            emulator.terminate()  # not left behind
            raise
    churner: Churn | None = None
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError):
                http(f"{url}/version")
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the emulator did not start")
            time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            names = Path(tmp) / "pods.txt"
            began = time.perf_counter()
            loaded = subprocess.run(
                [python, __file__, "load", url, str(nodes), str(pods), str(names)],
                check=True,
                capture_output=True,
                text=True,
            )
            out["objects"] = json.loads(loaded.stdout.strip().splitlines()[-1])
            out["load_s"] = round(time.perf_counter() - began)
            keys = names.read_text().splitlines()
        address = env.client.service_client.config.target_host
        command = [python, __file__, "work", url, address, str(passes), str(pause)]
        if profile:
            command += ["--profile", profile]
        worker = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert worker.stdout is not None
        rows: list[dict[str, Any]] = []
        emulator_peak = 0.0
        for line in worker.stdout:
            row = json.loads(line)
            emulator_peak = max(emulator_peak, rss_mb(emulator.pid))
            if "synced_s" in row:
                out.update(
                    sync_s=row["synced_s"],
                    ready_s=row["ready_s"],
                    ready_gc_s=row["ready_gc_s"],
                    synced_rss_mb=row["rss_mb"],
                )
                churner = Churn(url, keys, churn)
                churner.start()
            elif "pass" in row:
                rows.append(row)
            else:
                out.update(row)
        if worker.wait() != 0:
            raise RuntimeError(f"the worker process failed ({worker.returncode})")
        out["passes"] = rows
        out["emulator_rss_mb"] = round(emulator_peak)
        out["churn"] = (
            {"changes": churner.changes, "errors": churner.errors, "first_error": churner.first_error}
            if churner
            else {}
        )
    finally:
        if churner is not None:
            churner.stop.set()
        emulator.terminate()
        emulator.wait(60)
        loop.run_until_complete(env.shutdown())
        loop.close()
    return out


def print_size(figures: dict[str, Any]) -> list[Goal]:
    nodes = figures["nodes"]
    passes = figures["passes"]
    objects = figures["objects"]
    print(
        f"== {nodes} nodes / {figures['pods']} pods asked ({objects.get('Node', 0)} nodes, "
        f"{objects.get('Pod', 0)} pods generated; loaded in {figures['load_s']} s)"
    )
    print(
        f"   informer sync: {figures['sync_s']} s, then parsed for the planner in {figures['ready_s']} s "
        f"({figures['ready_gc_s']} s in GC); worker RSS {figures['synced_rss_mb']} MB"
    )
    for row in passes:
        print(
            f"   pass {row['pass']}: {row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s CPU "
            f"({row['gc_s']:.2f} s in GC, {row['gc_full']} full), {row['requests']} API requests "
            f"({row['pod_lists']} pod lists), {row['commands']} command(s), RSS {row['rss_mb']} MB, "
            f"per-node pod work {row['reused']} reused, {row['redone']} redone"
        )
    churn = figures["churn"]
    print(
        f"   churn meanwhile: {churn.get('changes', 0)} pod changes ({churn.get('errors', 0)} failed); "
        f"{figures.get('events', 0)} watch events applied"
    )
    if churn.get("first_error"):
        print(f"   first churn error: {churn['first_error']}")
    print(
        f"   heap frozen {figures.get('freezes', 0)} time(s), after the first pass; the last freeze "
        f"held the event loop {figures.get('freeze_s', 0.0)} s"
    )
    print(
        f"   peak RSS: worker {figures['peak_rss_mb']} MB, emulator {figures['emulator_rss_mb']} MB "
        "(separate processes)"
    )
    timed = passes[:-1] if figures.get("profiled") and len(passes) > 2 else passes
    steady = [row["wall_s"] for row in timed[1:]] or [timed[0]["wall_s"]]
    goals = []
    label = f"{nodes:,} nodes / {figures['pods']:,} pods"
    if nodes in PASS_GOALS:
        goals.append(
            Goal(
                f"controller pass, {label} (median after the first"
                + (", the profiled pass left out)" if timed is not passes else ")"),
                f"< {PASS_GOALS[nodes]} s",
                f"{statistics.median(steady):.2f} s (first {passes[0]['wall_s']:.2f} s)",
                statistics.median(steady) < PASS_GOALS[nodes],
            )
        )
    if nodes in RSS_GOALS_MB:
        goals.append(
            Goal(
                f"worker peak RSS, {label}",
                f"< {RSS_GOALS_MB[nodes] / 1024:.1f} GB",
                f"{figures['peak_rss_mb'] / 1024:.2f} GB",
                figures["peak_rss_mb"] < RSS_GOALS_MB[nodes],
            )
        )
    goals.append(
        Goal(
            f"pod lists per pass, {label}",
            "0",
            str(max(row["pod_lists"] for row in passes)),
            all(row["pod_lists"] == 0 for row in passes),
        )
    )
    return goals


@click.group(invoke_without_command=True)
@click.option("--sizes", default="1000x20000", show_default=True, help="NODESxPODS[,NODESxPODS...]")
@click.option("--passes", default=4, show_default=True, help="passes per size (the first is cold)")
@click.option("--pause", default=2.0, show_default=True, help="seconds between passes")
@click.option("--churn", default=20.0, show_default=True, help="pod changes a second during the passes")
@click.option(
    "--profile",
    type=click.Path(dir_okay=False),
    help="cProfile the last pass: its threads (snapshot, planner) into FILE, its event loop into FILE.loop",
)
@click.option("--json-out", type=click.Path(dir_okay=False), help="write the figures as JSON")
@click.pass_context
def main(
    ctx: click.Context,
    sizes: str,
    passes: int,
    pause: float,
    churn: float,
    profile: str | None,
    json_out: str | None,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    goals, everything = [], []
    for size in sizes.split(","):
        figures = measure(size, passes, pause, churn, profile)
        everything.append(figures)
        goals += print_size(figures)
    print_goals("controller pass (bench_controller.py)", goals)
    if json_out:
        Path(json_out).write_text(json.dumps(everything, indent=1))


@main.command("load", hidden=True)
@click.argument("url")
@click.argument("nodes", type=int)
@click.argument("pods", type=int)
@click.argument("names", type=click.Path(path_type=Path))
def load_command(url: str, nodes: int, pods: int, names: Path) -> None:
    load(url, nodes, pods, names)


@main.command("work", hidden=True)
@click.argument("url")
@click.argument("temporal")
@click.argument("passes", type=int)
@click.argument("pause", type=float)
@click.option("--profile")
def work_command(url: str, temporal: str, passes: int, pause: float, profile: str | None) -> None:
    asyncio.run(work(url, temporal, passes, pause, profile))
    sys.stdout.flush()
    os._exit(0)  # the Temporal SDK may abort at interpreter exit (sdk-python #300)


if __name__ == "__main__":
    code = 0
    try:
        main(standalone_mode=False)
    except click.ClickException as err:
        err.show()
        code = err.exit_code
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the Temporal SDK may abort at interpreter exit (sdk-python #300)
