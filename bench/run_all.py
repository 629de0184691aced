"""`make bench`: every bench in bench/, at modest sizes, one after the other.

Each bench prints its own figures (the issue-21 ones end with a goals table: measure, goal, now);
this runner prints, at the end, how long each took and which failed. The default sizes keep the
whole run to roughly 15-25 minutes on a 2-core machine; the big sizes are in each script's
docstring, e.g.

    .venv/bin/python bench/bench_controller.py --sizes 5000x100000,10000x200000
    .venv/bin/python bench/bench_interruption.py --nodes 100 --messages 500

    .venv/bin/python bench/run_all.py [--only controller,interruption] [--list]

Timing is never asserted: a bench fails only when it cannot run.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]

# bench name (bench/bench_<name>.py) → modest arguments for `make bench`.
MODEST: dict[str, list[str]] = {
    "controller": ["--sizes", "1000x20000", "--passes", "4"],
    "interruption": ["--nodes", "100", "--messages", "500"],
    "workflows": ["--terminations", "50"],
    "planner": ["--sizes", "1000x20000"],
    "controls": ["--nodes", "1000", "--pods", "10000", "--rounds", "3"],
    "controller_history": ["--nodes", "1000", "--passes", "300"],
    "emulator": ["--nodes", "1000", "--pods", "20000"],
    "instance_descriptions": ["--sizes", "100,1000"],
    "launch": [],
    "optimal_solver": ["--nodes", "300", "--passes", "2"],
    "quality": ["--nodes", "50", "--seeds", "1"],
    "quality_live": ["--nodes", "20", "--strategy", "karpenter"],
    "sim_controllers": ["--instances", "300", "--pods", "3000", "--nodes", "150"],
    "scheduler": ["--pods", "3000", "--nodes", "150"],
    "week": ["--days", "1", "--nodes", "1000"],
    "soak": ["--nodes", "200", "--minutes", "3"],
    "rollout": ["--nodes", "1000", "--pods", "20000", "--minutes", "4"],
    "api_load": ["--nodes", "500", "--idle-seconds", "30"],
}


def benches() -> list[str]:
    """Every bench/bench_*.py, so that a new bench runs too (with its own defaults until listed)."""
    return sorted(p.stem.removeprefix("bench_") for p in (ROOT / "bench").glob("bench_*.py"))


@click.command(help=__doc__)
@click.option("--only", default="", help="comma-separated bench names (default: all)")
@click.option("--list", "just_list", is_flag=True, help="print what would run, and how")
def main(only: str, just_list: bool) -> None:
    chosen = [b for b in benches() if not only or b in only.split(",")]
    outcomes: list[tuple[str, float, int]] = []
    for name in chosen:
        command = [sys.executable, str(ROOT / "bench" / f"bench_{name}.py"), *MODEST.get(name, [])]
        printable = " ".join(["python", *command[1:]]).replace(str(ROOT) + "/", "")
        if just_list:
            print(printable)
            continue
        print(f"\n== {printable}", flush=True)
        began = time.perf_counter()
        code = subprocess.run(command, cwd=ROOT, check=False).returncode
        outcomes.append((name, time.perf_counter() - began, code))
    if just_list:
        return
    print("\nbenches run")
    for name, seconds, code in outcomes:
        print(f"  {name:<24} {seconds:7.0f} s  {'ok' if code == 0 else f'FAILED (exit {code})'}")
    sys.exit(1 if any(code for _, _, code in outcomes) else 0)


if __name__ == "__main__":
    main()
