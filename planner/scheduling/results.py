"""What a simulation answers: placements, new NodeClaims and why pods stay unplaced; the
policies a caller picks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from planner.scheduling.requirements import Reqs

PreferencePolicy = Literal["Respect", "Ignore"]


RESPECT: PreferencePolicy = "Respect"


IGNORE: PreferencePolicy = "Ignore"


# How moved pods that no existing node takes are packed onto new NodeClaims (see Simulator.simulate).
Packing = Literal["karpenter", "cost"]


KARPENTER_PACKING: Packing = "karpenter"


COST_PACKING: Packing = "cost"


@dataclass(frozen=True, slots=True)
class ClaimOption:
    """One instance type a new NodeClaim may launch as."""

    instance_type: str
    price: float  # cheapest available offering allowed by the claim's requirements
    worst_price: float  # worst-case launch price (most expensive offering of the launch capacity type)


@dataclass(slots=True)
class NewNodeClaim:
    name: str
    nodepool: str
    options: tuple[ClaimOption, ...]  # price order, cheapest first
    requirements: Reqs
    capacity_types: tuple[str, ...]
    zones: tuple[str, ...]
    pods: list[str]
    requests: dict[str, int]
    # Opened for background pods (pending, or from nodes already going away): capacity the
    # provisioner launches anyway, not a replacement the caller decides on.
    background: bool = False
    # MinValuesPolicy BestEffort lowered a minValues of its NodePool to open it (Karpenter's
    # karpenter.sh/nodeclaim-min-values-relaxed); whether its requirements carry minValues at all.
    min_values_relaxed: bool = False
    has_min_values: bool = False
    # The removed node whose pods it holds, when the simulation kept each node's new nodes apart.
    group: str | None = None

    @property
    def instance_types(self) -> tuple[str, ...]:
        return tuple(o.instance_type for o in self.options)

    @property
    def cheapest_price(self) -> float:
        return self.options[0].price if self.options else float("inf")

    @property
    def worst_price(self) -> float:
        return max((o.worst_price for o in self.options), default=float("inf"))


@dataclass(slots=True)
class SimulationResult:
    placements: dict[str, str] = field(default_factory=dict)  # pod key -> node name or claim name
    new_claims: list[NewNodeClaim] = field(default_factory=list)
    unschedulable: dict[str, str] = field(default_factory=dict)  # pod key -> why
    pending: frozenset[str] = frozenset()  # keys of the pods that were pending (their failure is tolerated)
    aborted: str | None = None  # set when the simulation stopped early; the result is then incomplete
    # pod key -> the settling node that had room for it, which a consolidation kept it off (inside its
    # NodePool's consolidateAfter window): why the pod needed a new node instead
    held_off: dict[str, str] = field(default_factory=dict)

    def held_off_note(self) -> str:
        """ " (...)" naming the settling nodes pods were kept off, or ""."""
        if not self.held_off:
            return ""
        nodes = ", ".join(sorted(set(self.held_off.values())))
        return f" (pods kept off {nodes}: inside its NodePool's consolidateAfter window)"

    @property
    def replacements(self) -> list[NewNodeClaim]:
        """The new NodeClaims the moved pods need (background claims left out)."""
        return [c for c in self.new_claims if not c.background]

    @property
    def all_non_pending_scheduled(self) -> bool:
        return self.aborted is None and all(key in self.pending for key in self.unschedulable)

    def non_pending_errors(self) -> str:
        if self.aborted:
            return self.aborted
        errors = [
            f"{key}: {why}" for key, why in sorted(self.unschedulable.items()) if key not in self.pending
        ]
        return "; ".join(errors)


class SimulationAborted(Exception):
    pass
