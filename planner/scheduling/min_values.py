"""NodePool `minValues` (Karpenter v1.0) and the `MinValuesPolicy` (v1.6, Karpenter's operator flag
`--min-values-policy`): a new node's instance-type options must span at least `minValues` distinct
values of each such requirement's key.

Written from Karpenter's rules (kubernetes-sigs/karpenter):
- pkg/cloudprovider/types.go `SatisfiesMinValues`: walk the options in order, collecting each key's
  distinct values; the answer is how many options it took to satisfy every key, or the keys still
  short and how many values they reached;
- pkg/cloudprovider/types.go `Truncate`: keep the cheapest N options; under Strict the kept ones must
  still satisfy minValues, or the node is refused; under BestEffort they are kept as they are;
- pkg/controllers/provisioning/scheduling/nodeclaim.go `filterInstanceTypesByRequirements` and
  `tryVolumeAlternative`: when a pod opens a new NodeClaim, Strict refuses the NodeClaim if the
  fitting types fall short; BestEffort lowers each short key's minValues to the count reached, and
  the NodeClaim carries the lowered value from then on (a later pod may not lower it again);
- pkg/controllers/provisioning/scheduling/scheduler.go: a NodeClaim whose minValues were lowered is
  annotated `karpenter.sh/nodeclaim-min-values-relaxed: "true"` ("false" otherwise), which
  Karpenter's registration copies onto the Node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from planner.scheduling.requirements import Req, Reqs

MinValuesPolicy = Literal["Strict", "BestEffort"]
STRICT: MinValuesPolicy = "Strict"
BEST_EFFORT: MinValuesPolicy = "BestEffort"

# Karpenter's scheduling keeps at most this many options per new NodeClaim (nodeclaimtemplate.go
# MaxInstanceTypes, checked by Results.TruncateInstanceTypes in disruption's SimulateScheduling).
MAX_SCHEDULING_INSTANCE_TYPES = 600
# The AWS provider sends at most this many to CreateFleet (pkg/providers/instance/instance.go
# maxInstanceTypes, through the same Truncate): karpflow's launch list.
MAX_LAUNCH_INSTANCE_TYPES = 60

MIN_VALUES_RELAXED_ANNOTATION = "karpenter.sh/nodeclaim-min-values-relaxed"

# The values an instance type (by name) has for a label key: its label, or for zone and capacity
# type the values its offerings span.
ValuesOf = Callable[[str, str], Iterable[str]]


def has_min_values(reqs: Reqs) -> bool:
    return any(r.min_values is not None for r in reqs)


def min_values_shortfall(
    reqs: Reqs, options: Sequence[str], values_of: ValuesOf
) -> tuple[int, dict[str, int]]:
    """Karpenter's SatisfiesMinValues over `options` in their order: (how many of the first options
    it takes to satisfy every minValues, {}) or (len(options), {key: distinct values reached}) for
    the keys still short."""
    wanted = [r for r in reqs if r.min_values is not None]
    if not wanted:
        return 0, {}
    seen: dict[str, set[str]] = {r.key: set() for r in wanted}
    short: dict[str, int] = {}
    for index, name in enumerate(options):
        for r in wanted:
            seen[r.key].update(values_of(name, r.key))
        short = {r.key: len(seen[r.key]) for r in wanted if len(seen[r.key]) < (r.min_values or 0)}
        if not short:
            return index + 1, {}
    if not options:
        short = {r.key: 0 for r in wanted if (r.min_values or 0) > 0}
    return len(options), short


def relax(reqs: Reqs, short: dict[str, int]) -> Reqs:
    """The requirements with each short key's minValues lowered to the count reached (BestEffort)."""
    return tuple(_with_min_values(r, short[r.key]) if r.key in short else r for r in reqs)


def was_relaxed(original: Reqs, current: Reqs) -> bool:
    """Whether some key's minValues in `current` is below the `original` one (scheduler.go)."""
    before = {r.key: r.min_values for r in original if r.min_values is not None}
    return any(
        r.min_values is not None and r.key in before and r.min_values < (before[r.key] or 0) for r in current
    )


def describe_shortfall(reqs: Reqs, short: dict[str, int]) -> str:
    """Karpenter's error, with the numbers: "minValues requirement is not met for label(s) ..."."""
    wanted = {r.key: r.min_values for r in reqs}
    detail = ", ".join(
        f"{key} has {count} of minValues {wanted.get(key)}" for key, count in sorted(short.items())
    )
    return f"minValues requirement is not met for label(s) {sorted(short)} ({detail})"


def truncate(
    options: Sequence[str], reqs: Reqs, max_items: int, policy: MinValuesPolicy, values_of: ValuesOf
) -> tuple[list[str], str | None]:
    """Karpenter's Truncate on options already in price order: the first `max_items`, and under
    Strict why they cannot launch (None when they can)."""
    kept = list(options[:max_items])
    if policy != BEST_EFFORT and has_min_values(reqs):
        _, short = min_values_shortfall(reqs, kept, values_of)
        if short:
            why = describe_shortfall(reqs, short)
            return kept, f"validating minValues of the {len(kept)} cheapest options: {why}"
    return kept, None


def _with_min_values(req: Req, min_values: int) -> Req:
    copy = Req(
        req.key,
        req.values,
        complement=req.complement,
        allow_absent=req.allow_absent,
        gt=req.gt,
        lt=req.lt,
        min_values=min_values,
    )
    return copy
