"""A soak: karpflow on a 500-node simulated cluster with continuous workload churn for 10 minutes,
no injected faults: prints figures, asserts nothing.

    .venv/bin/python bench/bench_soak.py                        # 500 nodes, 10 minutes, seed 1
    .venv/bin/python bench/bench_soak.py --nodes 200 --minutes 3

The stack is the chaos harness's (sim/chaos/): a Temporal dev server on a database file, the simulator
with a generated fragmented cluster (drift, expiry, spot nodes, PDBs that never allow, pods that
ignore eviction), one `karpflow worker` process running the controller and the interruption poller.
For the soak phase only the workload changes (a deployment scaled, a pod deleted, a deployment made
or removed every `--churn-every` seconds); then the run waits for convergence and asks the invariant
checker.

Printed each minute: commands started and completed so far (and per minute), the worker's CPU (% of
one core) and RSS, the Kubernetes API requests per second the simulator served, the controller's
current history (events, bytes). At the end: the chaos harness's report (commands by outcome, every
invariant counter, the time to converge).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sim.chaos import actions
from sim.chaos.faults import ContinuousFaults
from sim.chaos.runner import PRIMARY, ChaosConfig, ChaosRun

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def soak(run: ChaosRun, minutes: float, churn_every: float, seed: int) -> None:
    assert run.stack is not None and run.workers is not None
    stack, rng = run.stack, random.Random(f"{seed}/soak")
    # No fault is injected; the harness's judge still reads the (empty) fault counters.
    run.faults = ContinuousFaults(stack, seed, api_error_rate=0.0, ec2_throttle=0.0)
    began = last_sample = time.monotonic()
    pid = run.workers.running[PRIMARY].process.pid
    cpu_before, started_before = cpu_seconds(pid), 0
    seq_before = max((r.seq for r in stack.requests.query()), default=0)
    next_churn = began
    while (now := time.monotonic()) - began < minutes * 60:
        if now >= next_churn:
            actions.churn(stack, rng, run.effects)
            next_churn = now + churn_every
        if now - last_sample >= 60:
            commands = await run.commands()
            status = await run.controller_status()
            worker = run.workers.running.get(PRIMARY)
            if worker is not None and worker.process.pid != pid:  # restarted: a new process to follow
                pid, cpu_before = worker.process.pid, 0.0
            cpu = cpu_seconds(pid)
            seq = max((r.seq for r in stack.requests.query()), default=seq_before)
            elapsed = now - last_sample
            print(
                f"   {(now - began) / 60:4.1f} min: commands {commands.started} started "
                f"(+{commands.started - started_before}), {commands.completed} completed, "
                f"{commands.running} running; worker CPU {(cpu - cpu_before) / elapsed * 100:.0f} %, "
                f"RSS {rss_mb(pid):.0f} MB; API {(seq - seq_before) / elapsed:.1f} req/s; controller history "
                f"{status.history_events if status else '?'} events, "
                f"{(status.history_bytes if status else 0) / 1e6:.2f} MB",
                flush=True,
            )
            cpu_before, started_before, seq_before, last_sample = cpu, commands.started, seq, now
        await asyncio.sleep(0.25)
    run.report.fault_phase_seconds = round(time.monotonic() - began, 1)


async def main(arguments: argparse.Namespace) -> int:
    config = ChaosConfig(
        seed=arguments.seed,
        minutes=arguments.minutes,
        nodes=arguments.nodes,
        time_scale=arguments.time_scale,
        converge_within=arguments.converge_within,
        api_error_rate=0.0,
        ec2_throttle=0.0,
    )
    run = ChaosRun(config, print)
    try:
        await run.start()
        await soak(run, arguments.minutes, arguments.churn_every, arguments.seed)
        print(
            f"churn stopped after {run.report.fault_phase_seconds:.0f}s; waiting for the cluster to converge"
        )
        run.faults_off()
        await run.converge()
        await run.judge()
    finally:
        await run.stop()
    for line in run.report.lines():
        print(line)
    if run.report.ok:
        shutil.rmtree(run.state_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--churn-every", type=float, default=2.0)
    parser.add_argument("--converge-within", type=float, default=600.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
