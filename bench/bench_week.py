"""A week of the controller on a 3,000-node cluster with churn, in accelerated time: prints figures,
asserts nothing.

    .venv/bin/python bench/bench_week.py                       # 3,000 nodes, 7 simulated days
    .venv/bin/python bench/bench_week.py --days 1 --nodes 1000 # a shorter look

A week of passes at the controller's default interval (10 s between passes that start nothing) is
60,480 passes. They run back to back on Temporal's time-skipping test server (10 ms between passes:
the history a pass writes does not depend on the interval), with the real ControllerWorkflow, the
churn of bench_controller_history.py (reasons changing on 0.5 % of the nodes each pass, a command in
one pass out of ten, failed commands, malformed signals, the worker's memory of what it sent lost
now and then) and its controller activities, all in this process.

Printed, at twentieths of the run: passes, the simulated time they stand for, the current run's
history (events, bytes; each continue-as-new starts a new run), the resident memory (RSS) of this
process (the worker, its workflow cache and the client) and of the test server. At the end, every
run of the chain: why it continued as new, its largest history in bytes and events (goal: under
10 MB and 10k events), failed workflow tasks and runs that do not replay on the current code (both
must be 0), and whether the controller is still running (it must be).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

from activities.planning import SentReasons
from api.controller_io import ControllerInput, ControllerStatus
from bench.bench_controller_history import (
    BAD_SIGNALS,
    BenchActivities,
    BusyCluster,
    PlannedCluster,
    chain,
    time_skipping_client,
)
from worker import WORKFLOWS

PRODUCTION_INTERVAL = 10.0  # seconds between passes that started nothing (ControllerInput's default)
MAX_BYTES, MAX_EVENTS = 10_000_000, 10_000


def rss_mb(pid: int | str = "self") -> float:
    """Resident memory of a process, from /proc (Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def test_server_pid() -> int | None:
    """The time-skipping server: the one child process this bench starts."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text().splitlines()
        except OSError:
            continue
        if f"PPid:\t{os.getpid()}" in lines:
            return int(status.parent.name)
    return None


async def week(client: Client, cluster: PlannedCluster, passes: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    busy = BusyCluster(cluster, rng)
    task_queue = f"week-{uuid.uuid4().hex[:8]}"
    workflow_id = f"karpflow-controller/{task_queue}"
    bench = BenchActivities(busy)
    fields: dict[str, Any] = {
        "cluster": "week",
        "task_queue": f"{task_queue}-commands",  # no worker polls it: commands stay running
        "interval_seconds": 0.01,
        "validation_seconds": 0.01,
    }
    server = test_server_pid()
    samples: list[tuple[int, float, int, float, float]] = []
    began = time.perf_counter()
    every = max(1, passes // 20)
    async with Worker(client, task_queue=task_queue, workflows=list(WORKFLOWS), activities=bench.all()):
        handle = await client.start_workflow(
            "ControllerWorkflow", ControllerInput(**fields), id=workflow_id, task_queue=task_queue
        )
        forget_at, signal_at, sample_at = rng.randint(50, 150), rng.randint(10, 60), 0
        signals = forgotten = 0
        while busy.calls < passes:
            await asyncio.sleep(0.1)
            if busy.calls >= signal_at:
                name, args = rng.choice(BAD_SIGNALS)
                await handle.signal(name, args=args)
                signals, signal_at = signals + 1, busy.calls + rng.randint(10, 60)
            if busy.calls >= forget_at:
                bench.sent, forgotten = SentReasons(), forgotten + 1
                forget_at = busy.calls + rng.randint(50, 150)
            if busy.calls >= sample_at:
                now = await handle.query("status", result_type=ControllerStatus)
                days = busy.calls * PRODUCTION_INTERVAL / 86400
                sample = (
                    busy.calls,
                    days,
                    now.history_events,
                    rss_mb(),
                    rss_mb(server) if server else float("nan"),
                )
                samples.append(sample)
                print(
                    f"   pass {sample[0]:>6} ({sample[1]:.2f} days): this run's history {now.history_events} "
                    f"events, {now.history_bytes / 1e6:.2f} MB; worker RSS {sample[3]:.0f} MB, "
                    f"test server RSS {sample[4]:.0f} MB, wall {time.perf_counter() - began:.0f}s",
                    flush=True,
                )
                sample_at = busy.calls + every
        running = (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        status = await handle.query("status", result_type=ControllerStatus)
        await handle.terminate("bench over")
    runs = await chain(client, workflow_id, handle.result_run_id or "")
    return {
        "passes": busy.calls,
        "runs": runs,
        "samples": samples,
        "signals": signals,
        "forgotten": forgotten,
        "running": running,
        "status": status,
        "seconds": time.perf_counter() - began,
    }


def report(nodes: int, figures: dict[str, Any]) -> None:
    runs = figures["runs"]
    ended: dict[str, int] = {}
    for run in runs:
        ended[run.ended] = ended.get(run.ended, 0) + 1
    largest = max(runs, key=lambda r: r.bytes)
    most = max(runs, key=lambda r: r.events)
    samples = figures["samples"]
    worker = [s[3] for s in samples]
    settled = worker[len(worker) // 4 :] or worker  # after start-up and the first runs
    print(
        f"== {nodes} nodes, {figures['passes']} passes = "
        f"{figures['passes'] * PRODUCTION_INTERVAL / 86400:.2f} days at {PRODUCTION_INTERVAL:.0f} s a pass"
    )
    print(f"   runs: {len(runs)} ({', '.join(f'{n} {why}' for why, n in sorted(ended.items()))})")
    print(
        f"   largest run: {largest.bytes / 1e6:.2f} MB; most events: {most.events} "
        f"(limits {MAX_BYTES / 1e6:.1f} MB, {MAX_EVENTS}); over a limit: "
        f"{sum(1 for r in runs if r.bytes > MAX_BYTES or r.events > MAX_EVENTS)}"
    )
    print(
        f"   failed workflow tasks: {sum(r.failed_tasks for r in runs)}; runs that do not replay: "
        f"{sum(1 for r in runs if r.replay_error)}; malformed signals {figures['signals']}, worker memory "
        f"lost {figures['forgotten']} times"
    )
    print(
        f"   worker RSS: first {worker[0]:.0f} MB, min/max after the first quarter "
        f"{min(settled):.0f}/{max(settled):.0f} MB, last {worker[-1]:.0f} MB"
    )
    status = figures["status"]
    print(
        f"   at the end: {'RUNNING' if figures['running'] else 'NOT RUNNING'}, "
        f"controller pass {status.passes}, error {status.error!r}; wall {figures['seconds']:.0f}s "
        f"({figures['seconds'] / max(1, figures['passes']) * 1e3:.0f} ms a pass)"
    )


async def main(nodes: int, days: float, seed: int) -> None:
    passes = round(days * 86400 / PRODUCTION_INTERVAL)
    t0 = time.perf_counter()
    cluster = PlannedCluster.generate(nodes, seed=seed)
    print(f"   planned a generated {nodes}-node cluster in {time.perf_counter() - t0:.0f}s", flush=True)
    env, client = await time_skipping_client()
    try:
        report(nodes, await week(client, cluster, passes, seed))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=3000)
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=1)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.nodes, arguments.days, arguments.seed))
    sys.stdout.flush()
