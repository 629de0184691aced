"""What a chaos run prints and returns: enough to judge it and to replay it (the seed)."""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel, Field

from sim.invariants import Invariant

# What a permanent fault's own expectation found (sim/chaos/permanent.py), beside the checker's.
PERMANENT_INVARIANT = "permanent-fault"
INVARIANTS: tuple[str, ...] = (*get_args(Invariant), PERMANENT_INVARIANT)


class CommandCounts(BaseModel):
    """karpflow's workflows at the end of the run, from Temporal visibility."""

    started: int = 0
    completed: int = 0
    rolled_back: int = 0
    failed: int = 0  # failed without a rollback (forceful commands, or a rollback that did not finish)
    canceled: int = 0
    terminated: int = 0
    running: int = 0
    by_reason: dict[str, int] = Field(default_factory=dict)
    terminations: dict[str, int] = Field(default_factory=dict)  # TerminationWorkflow status -> count
    interruptions: int = 0  # DisruptionWorkflows started by the interruption poller
    failures: list[str] = Field(default_factory=list)  # one line per failed workflow: id and cause


class ChaosReport(BaseModel):
    seed: int
    minutes: float
    time_scale: float
    nodes: int  # what --nodes asked for (the seed and this give the world)
    karpenter: bool = False  # beside the simulated Karpenter (coexistence mode)
    cluster_nodes: int = 0  # what the world has
    cluster: str
    state_dir: str
    fault_phase_seconds: float = 0.0
    converged: bool = False
    converge_seconds: float | None = None
    not_converged: list[str] = Field(default_factory=list)  # what still was not settled at the timeout
    commands: CommandCounts = Field(default_factory=CommandCounts)
    faults: dict[str, int] = Field(default_factory=dict)
    invariants: dict[str, int] = Field(default_factory=lambda: dict.fromkeys(INVARIANTS, 0))
    violations: list[str] = Field(default_factory=list)
    worker_exits: list[str] = Field(default_factory=list)  # workers that died without being killed
    permanent_faults: list[str] = Field(default_factory=list)  # what each permanent fault saw, or found
    controller_passes: int = 0
    controller_runs: int = 0
    observed: dict[str, int] = Field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.converged
            and not any(self.invariants.values())
            and not self.violations
            and not self.worker_exits
        )

    def replay_command(self) -> str:
        beside = " --karpenter" if self.karpenter else ""
        return (
            f"karpflow sim chaos --seed {self.seed} --minutes {self.minutes:g} --nodes {self.nodes}{beside}"
        )

    def lines(self) -> list[str]:
        c = self.commands
        out = [
            f"chaos run: seed {self.seed}, {self.minutes:g} min of faults, {self.cluster_nodes} nodes, "
            f"time scale {self.time_scale:g}, cluster {self.cluster}"
            + (", beside Karpenter" if self.karpenter else ""),
            f"commands: {c.started} started, {c.completed} completed, {c.rolled_back} rolled back, "
            f"{c.failed} failed, {c.canceled} canceled, {c.terminated} terminated, {c.running} running"
            + (f" (by reason: {_pairs(c.by_reason)})" if c.by_reason else ""),
            f"terminations: {_pairs(c.terminations) or 'none'}; interruption commands: {c.interruptions}; "
            f"controller: {self.controller_passes} passes in {self.controller_runs} runs",
            f"faults injected: {_pairs(self.faults)}",
            f"invariants: {_pairs(self.invariants)}",
            (
                f"converged {self.converge_seconds:.1f}s after the faults stopped"
                if self.converged and self.converge_seconds is not None
                else f"NOT converged: {'; '.join(self.not_converged)}"
            ),
        ]
        out += [f"permanent fault: {line}" for line in self.permanent_faults]
        out += [f"violation: {v}" for v in self.violations]
        out += [f"worker died on its own: {e}" for e in self.worker_exits]
        out += [f"failed workflow: {f}" for f in c.failures]
        out.append(
            f"{'OK' if self.ok else 'FAILED'}; replay: {self.replay_command()} (state: {self.state_dir})"
        )
        return out


def _pairs(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {value}" for name, value in sorted(counts.items()))
