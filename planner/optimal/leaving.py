"""The nodes leaving in a later move wear `karpflow.io/leaving:PreferNoSchedule`.

While one move's pods are evicted, the kube-scheduler places them by its own scoring: without a
hint it favours the emptiest nodes, which are the ones the target removes next, and those pods would
move twice. A PreferNoSchedule taint makes it choose any other node that fits first (kube-scheduler's
TaintToleration score) and never leaves a pod pending. karpflow writes it, so a real cluster has it.

The planner asks for the taint set it wants each pass, as `TaintChange`s the controller applies
(activity `apply_taints`): added on nodes the target removes later, removed from nodes it no longer
removes. Desired state rather than events: a lost pass, a restart or a change of plan heals at the
next pass. When the Optimal method did not run in a pass (an earlier method ended it), the taints on
its pools' nodes stay as they are; a pool that no longer uses the strategy loses them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from kube.selectors import Taint
from planner.snapshot import Snapshot

LEAVING_TAINT_KEY = "karpflow.io/leaving"
LEAVING_TAINT_EFFECT = "PreferNoSchedule"


class TaintChange(BaseModel):
    """A taint the pass wants on a node (add) or gone from it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    node: str
    key: str = LEAVING_TAINT_KEY
    effect: str = LEAVING_TAINT_EFFECT
    add: bool = True


def has_leaving_taint(taints: Iterable[Taint]) -> bool:
    return any(t.key == LEAVING_TAINT_KEY and t.effect == LEAVING_TAINT_EFFECT for t in taints)


def leaving_taint_changes(
    snapshot: Snapshot, desired: set[str] | None, commanded: Collection[str], optimal_pools: Collection[str]
) -> list[TaintChange]:
    """The changes that make the leaving taints match `desired` (None: the method did not run, keep
    what its pools have). Nodes being deleted or disrupted, or in this pass's commands, are left as
    they are."""
    out = []
    for name, node in sorted(snapshot.nodes.items()):
        if node.is_deleting or node.has_disrupted_taint or name in commanded:
            continue  # on its way out: its taints go with it
        has = has_leaving_taint(node.taints)
        want = desired is not None and name in desired
        if want and not has:
            out.append(TaintChange(node=name, add=True))
        elif has and not want:
            if desired is None and node.nodepool in optimal_pools:
                continue
            out.append(TaintChange(node=name, add=False))
    return out


__all__ = [
    "LEAVING_TAINT_EFFECT",
    "LEAVING_TAINT_KEY",
    "TaintChange",
    "has_leaving_taint",
    "leaving_taint_changes",
]
