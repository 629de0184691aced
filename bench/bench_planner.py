"""How long one planning pass takes, and how much memory it needs, on large synthetic clusters.

    python bench/bench_planner.py                 # 1,000 nodes / 20,000 pods and 5,000 / 100,000
    python bench/bench_planner.py --sizes 200x4000 --yaml

For each size the cluster is generated (bench/gen_cluster.py), written as kubectl-style JSON, then
measured in fresh processes so peak memory is the pass's own:
- in-process: `load_snapshot` then `plan(..., all_methods=True)`, wall and CPU time of each step and
  the peak RSS after loading and after planning;
- CLI: `karpflow plan --snapshot FILE --output json --all-methods`, wall time and peak RSS.
CPU time is printed beside wall time because the machine is shared: wall time includes waiting for
the other processes. Goals: 1,000-node pass < 5 s, 5,000-node pass < 30 s, < 1 GB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
AT = "2026-11-22T10:00:00Z"

_CHILD = r"""
import json, resource, sys, time
from datetime import datetime
from planner.catalog import bundled_catalog
from planner.model import PlanOptions
from planner.plan import default_methods, plan
from planner.snapshot import load_snapshot

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

path, at, max_replacements = sys.argv[1], datetime.fromisoformat(sys.argv[2]), int(sys.argv[3])
w0, c0 = time.perf_counter(), time.process_time()
snapshot = load_snapshot(path, now=at)
w1, c1 = time.perf_counter(), time.process_time()
load_peak = peak_mb()
methods, per_method = default_methods(), {}
for method in methods:  # time each method's compute (the scheduling simulation is built by the first user)
    def timed(ctx, candidates, budgets, _compute=method.compute, _method=method):
        a, b = time.perf_counter(), time.process_time()
        out = _compute(ctx, candidates, budgets)
        per_method[_method.name] = {"wall": time.perf_counter() - a, "cpu": time.process_time() - b,
                                    "candidates": len(candidates), "probes": getattr(_method, "probes", None)}
        return out
    method.compute = timed
result = plan(snapshot, bundled_catalog(snapshot.region() or "us-west-2"),
              PlanOptions(all_methods=True, max_replacements=max_replacements), methods=methods)
w2, c2 = time.perf_counter(), time.process_time()
methods = {}
for command in result.commands:
    methods[command.method] = methods.get(command.method, 0) + 1
print(json.dumps({
    "load_wall": w1 - w0, "load_cpu": c1 - c0, "load_peak_mb": load_peak,
    "plan_wall": w2 - w1, "plan_cpu": c2 - c1, "peak_mb": peak_mb(),
    "nodes": len(snapshot.nodes), "pods": len(snapshot.pods), "commands": methods,
    "blocked": len(result.blocked), "methods": per_method,
}))
"""


def run_in_process(path: Path, max_replacements: int = 1) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), AT, str(max_replacements)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def cli_with_rusage(path: Path, max_replacements: int = 1) -> dict:
    """Wall time and the child's own peak RSS (wait4 reports it per child)."""
    karpflow = Path(sys.executable).with_name("karpflow")
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # child: become the CLI, output discarded
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.execv(
            str(karpflow),
            [
                str(karpflow),
                *("plan", "--snapshot", str(path), "--output", "json", "--all-methods", "--at", AT),
                *("--max-replacements", str(max_replacements)),
            ],
        )
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"karpflow plan exited with {os.waitstatus_to_exitcode(status)}")
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


def generate_file(nodes: int, pods: int, out: Path) -> Path:
    """Generate in a separate process: a forked child inherits its parent's peak RSS on Linux, so
    the parent of the measured processes must stay small."""
    subprocess.run(
        [
            sys.executable,
            str(HERE / "gen_cluster.py"),
            "--nodes",
            str(nodes),
            "--pods",
            str(pods),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


@click.command()
@click.option("--sizes", default="1000x20000,5000x100000", show_default=True, help="NODESxPODS,...")
@click.option("--yaml", "with_yaml", is_flag=True, help="Also time loading the same cluster from YAML.")
@click.option("--keep", type=click.Path(file_okay=False), help="Keep the generated files in this directory.")
@click.option(
    "--max-replacements", default=1, show_default=True, help="PlanOptions.max_replacements (extension)."
)
def main(sizes: str, with_yaml: bool, keep: str | None, max_replacements: int) -> None:
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="karpflow-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes.split(","):
        nodes, pods = (int(x) for x in size.lower().split("x"))
        start = time.perf_counter()
        path = generate_file(nodes, pods, workdir / f"cluster-{nodes}.json")
        generated = time.perf_counter() - start
        mb = path.stat().st_size / 1e6
        click.echo(
            f"== {nodes} nodes / {pods} pods: {path.name} ({mb:.0f} MB), generated in {generated:.1f}s"
        )
        inproc = run_in_process(path, max_replacements)
        click.echo(
            f"   in-process: load {inproc['load_wall']:.2f}s wall / {inproc['load_cpu']:.2f}s cpu "
            f"(peak {inproc['load_peak_mb']:.0f} MB), plan {inproc['plan_wall']:.2f}s wall / "
            f"{inproc['plan_cpu']:.2f}s cpu, total peak {inproc['peak_mb']:.0f} MB"
        )
        click.echo(
            f"   snapshot: {inproc['nodes']} nodes, {inproc['pods']} pods; commands {inproc['commands']}, "
            f"{inproc['blocked']} nodes left alone with a reason"
        )
        for name, m in inproc.get("methods", {}).items():
            probes = f", {m['probes']} simulations" if m.get("probes") is not None else ""
            click.echo(
                f"     {name:27s} {m['wall']:6.2f}s wall / {m['cpu']:5.2f}s cpu "
                f"({m['candidates']} candidates{probes})"
            )
        cli = cli_with_rusage(path, max_replacements)
        click.echo(
            f"   CLI:        {cli['wall']:.2f}s wall / {cli['cpu']:.2f}s cpu, peak {cli['peak_mb']:.0f} MB"
        )
        row = {"nodes": nodes, "pods": pods, "file_mb": mb, "in_process": inproc, "cli": cli}
        if with_yaml:
            yaml_path = generate_file(nodes, pods, workdir / f"cluster-{nodes}.yaml")
            yaml_run = run_in_process(yaml_path)
            click.echo(
                f"   YAML load:  {yaml_run['load_wall']:.2f}s wall / {yaml_run['load_cpu']:.2f}s cpu "
                f"({yaml_path.stat().st_size / 1e6:.0f} MB)"
            )
            row["yaml_load"] = yaml_run
        rows.append(row)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    (results / "bench_planner.json").write_text(json.dumps(rows, indent=2))
    click.echo(f"figures saved to {results / 'bench_planner.json'}")


if __name__ == "__main__":
    main()
