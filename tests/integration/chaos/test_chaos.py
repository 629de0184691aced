"""The bounded chaos run of CI (sim/chaos/): a minute of every fault, then convergence, with every
invariant at zero. Longer runs and other seeds: `karpflow sim chaos --seed N --minutes M`."""

from __future__ import annotations

import pytest

from sim.chaos.runner import ChaosConfig, run_chaos

pytestmark = pytest.mark.integration

SEED = 20261126
ALWAYS = (
    "worker-killed",
    "second-worker",
    "temporal-restart",
    "api-500",
    "api-429",
    "api-latency",
    "watch-cut",
    "watch-410",
    "ec2-throttle",
    "instance-vanished",
    "sqs-spot-warning",
    "sqs-rebalance",
    # A permanent fault (sim/chaos/permanent.py): every eviction denied for a while.
    "evictions-denied",
)


@pytest.mark.slow(seconds=125)
@pytest.mark.timeout(900)
async def test_a_minute_of_chaos_ends_converged_with_every_invariant_at_zero(tmp_path):
    lines: list[str] = []
    report = await run_chaos(
        ChaosConfig(seed=SEED, minutes=1.0, state_dir=tmp_path / "chaos", converge_within=240),
        say=lines.append,
    )
    print("\n".join(lines))
    # The faults really happened: a run that injected nothing would prove nothing.
    missing = [kind for kind in ALWAYS if not report.faults.get(kind)]
    assert not missing, f"faults never injected: {missing}\n" + "\n".join(lines)
    assert report.faults["worker-killed"] >= 10
    assert report.commands.started >= 5 and report.commands.interruptions >= 1
    assert report.ok, "\n".join(lines)
