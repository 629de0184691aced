"""When each fault of a chaos run happens: a timeline drawn from the seed alone (pure, no I/O).

The continuous faults (Kubernetes API errors and latency, cut watches and 410s on re-watch, EC2
throttling, capacity errors and never-ready instance types) are on for the whole fault phase; the
timeline holds the discrete ones, and when the permanent faults start (permanent.py). Which node
or pod an event picks is decided when it runs, from the live cluster and a random generator of its
own seeded from the run's seed and the event's index (`ChaosEvent.rng`), so the same seed draws the
same choices from the same state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

EventKind = Literal[
    "kill-worker",
    "second-worker-up",
    "second-worker-down",
    "restart-temporal",
    "vanish-instance",
    "spot-interruption",
    "churn",
    "drift-nodepool",
    # Permanent faults (permanent.py): each lifts itself after its hold, or when the phase ends.
    "deny-evictions",
    "remove-ownership-tag",
    "hold-nodeclaim",
]
# The permanent faults' events come after the others in index (their own generator too), so a seed
# draws the same timeline and choices for the other faults as before they existed.
PERMANENT_INDEX = 10_000


@dataclass(frozen=True)
class ChaosEvent:
    at: float  # seconds into the fault phase
    kind: EventKind
    index: int  # its place in the timeline: with the seed, what seeds its own choices
    seed: int

    def rng(self) -> random.Random:
        return random.Random(f"{self.seed}/{self.index}/{self.kind}")


@dataclass(frozen=True)
class ScheduleSpec:
    """How much of each fault per run; `minutes` is the fault phase."""

    seconds: float
    kills_per_minute: float = 8.0
    min_kills: int = 10
    vanishes_per_minute: float = 1.5
    interruptions_per_minute: float = 1.5
    churn_every: float = 4.0  # seconds between workload changes
    temporal_restart_every: float = 300.0  # at least one, mid-run
    permanent: bool = True  # the faults that make steps fail for good while they last
    karpenter: bool = False  # beside the simulated Karpenter: its NodeClaims, not karpflow's instances


def _times(rng: random.Random, count: int, start: float, end: float, gap: float) -> list[float]:
    """`count` sorted times in [start, end], at least `gap` apart where the span allows."""
    gap = min(gap, (end - start) / max(count, 1) * 0.8)
    times: list[float] = []
    while len(times) < count:
        at = rng.uniform(start, end)
        if all(abs(at - other) >= gap for other in times):
            times.append(at)
    return sorted(times)


def build_schedule(seed: int, spec: ScheduleSpec) -> list[ChaosEvent]:
    rng = random.Random(seed)
    total = spec.seconds
    minutes = total / 60.0
    drafts: list[tuple[float, EventKind]] = []
    kills = max(spec.min_kills, round(minutes * spec.kills_per_minute))
    # No kill in the last stretch (at least 20 s): the workers then come up and list and watch under
    # the faults, so cut watches and 410s on re-watch are met even when a loaded machine starts each
    # worker too slowly to reach its watches between kills.
    last_kill = max(0.5 * total, min(0.92 * total, total - 20.0))
    drafts += [(at, "kill-worker") for at in _times(rng, kills, 0.03 * total, last_kill, 2.0)]
    drafts.append((rng.uniform(0.08, 0.25) * total, "second-worker-up"))
    drafts.append((rng.uniform(0.6, 0.8) * total, "second-worker-down"))
    restarts = max(1, int(total // spec.temporal_restart_every))
    slot = total / restarts
    drafts += [((i + rng.uniform(0.35, 0.65)) * slot, "restart-temporal") for i in range(restarts)]
    vanishes = max(2, round(minutes * spec.vanishes_per_minute))
    drafts += [(at, "vanish-instance") for at in _times(rng, vanishes, 0.1 * total, 0.85 * total, 5.0)]
    interruptions = max(2, round(minutes * spec.interruptions_per_minute))
    drafts += [(at, "spot-interruption") for at in _times(rng, interruptions, 0.05 * total, 0.8 * total, 5.0)]
    churns = max(1, int(total // spec.churn_every))
    drafts += [(at, "churn") for at in _times(rng, churns, 0.0, 0.95 * total, 0.5)]
    drafts.append((rng.uniform(0.2, 0.5) * total, "drift-nodepool"))
    drafts.sort(key=lambda draft: draft[0])
    events = [
        ChaosEvent(at=round(at, 3), kind=kind, index=i, seed=seed) for i, (at, kind) in enumerate(drafts)
    ]
    if spec.permanent:
        events += _permanent(seed, spec)
    return sorted(events, key=lambda event: (event.at, event.index))


def _permanent(seed: int, spec: ScheduleSpec) -> list[ChaosEvent]:
    """One of each permanent fault, early enough that its hold ends and its retries run in the phase.
    Standalone the ownership tag goes; beside Karpenter (which terminates the instances) a NodeClaim
    is held instead."""
    rng = random.Random(f"{seed}/permanent")
    total = spec.seconds
    drafts: list[tuple[float, EventKind]] = [(rng.uniform(0.15, 0.5) * total, "deny-evictions")]
    if spec.karpenter:
        drafts.append((rng.uniform(0.2, 0.6) * total, "hold-nodeclaim"))
    else:
        drafts.append((rng.uniform(0.3, 0.6) * total, "remove-ownership-tag"))
    return [
        ChaosEvent(at=round(at, 3), kind=kind, index=PERMANENT_INDEX + i, seed=seed)
        for i, (at, kind) in enumerate(drafts)
    ]
