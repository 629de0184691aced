"""Drift in a NodePool with a rollout policy goes in waves (workflows/rollout_waves.py).

Pure, like the rest of the planner. For such a pool, a drifted node is a candidate only once a
rollout's wave has marked it (`karpflow.dev/rollout-requested`); until then it is held with the
reason, read from the NodePool's `karpflow.dev/rollout-state` for the pool's current target
(api/hashes.py `rollout_target`):
- no state for this target: the pass asks the controller to start the target's rollout
  (`drift_rollouts`: one per pool and target, a deterministic workflow id, so asking twice starts
  nothing twice) and the node waits for its wave;
- Rolling / Soaking: waiting for its wave;
- Halted: the gate failed, nothing drifts toward this target until the operator resumes or aborts;
- Aborted: nothing drifts toward this target again: the NodePool or EC2NodeClass must change;
- Succeeded: every wave passed; a node drifted toward the same target later drifts as usual.
An invalid policy holds the pool's drift (fails closed) and is reported as a problem.
"""

from __future__ import annotations

from api.constants import ROLLOUT_ANNOTATION
from api.hashes import rollout_target
from api.nodepool import EC2NodeClass, NodePool
from api.rollout_io import DriftRollout, RolloutNode
from api.rollout_policy import (
    ROLLOUT_POLICY_ANNOTATION,
    ROLLOUT_STATE_ANNOTATION,
    PolicyError,
    RolloutPolicy,
    RolloutState,
    parse_policy,
    parse_state,
)
from planner.model import PlanContext
from planner.snapshot import Node


def pool_policy(ctx: PlanContext, pool: NodePool) -> tuple[RolloutPolicy | None, str]:
    """The pool's policy (None: none) and why it is unreadable ('' when it is fine)."""
    key = ("rollout_policy", pool.name)
    if key not in ctx.memo:
        text = pool.metadata.annotations.get(ROLLOUT_POLICY_ANNOTATION)
        try:
            ctx.memo[key] = (parse_policy(text), "")
        except PolicyError as err:
            ctx.memo[key] = (None, str(err))
    found: tuple[RolloutPolicy | None, str] = ctx.memo[key]
    return found


def pool_target(ctx: PlanContext, pool: NodePool) -> str:
    key = ("rollout_target", pool.name)
    if key not in ctx.memo:
        ref = pool.spec.template.spec.node_class_ref
        nodeclass: EC2NodeClass | None = ctx.snapshot.nodeclasses.get(ref.name) if ref else None
        ctx.memo[key] = rollout_target(pool, nodeclass)
    target: str = ctx.memo[key]
    return target


def pool_state(pool: NodePool) -> RolloutState | None:
    return parse_state(pool.metadata.annotations.get(ROLLOUT_STATE_ANNOTATION))


def drift_hold(ctx: PlanContext, node: Node, pool: NodePool) -> str | None:
    """Why a drifted node of `pool` waits for a wave instead of drifting now (None: it drifts)."""
    if node.annotation(ROLLOUT_ANNOTATION):
        return None  # a wave (or `karpflow rollout`) marked it: drift takes it within the controls
    policy, error = pool_policy(ctx, pool)
    if error:
        return (
            f"NodePool {pool.name}'s rollout policy is invalid ({error}); its drift waits until it is fixed"
        )
    if policy is None:
        return None
    target = pool_target(ctx, pool)
    state = pool_state(pool)
    if state is None or state.target != target or state.phase == "Superseded":
        return f"waiting for the first wave of NodePool {pool.name}'s rollout toward target {target}"
    if state.phase == "Succeeded":
        return None
    if state.phase == "Halted":
        return (
            f"rollout {state.rollout_id} toward target {target} halted at wave {state.wave}: "
            f"{state.reason or 'the gate failed'}; `karpflow rollout --resume` or `--abort` it"
        )
    if state.phase == "Aborted":
        return (
            f"rollout {state.rollout_id} toward target {target} was aborted: nothing drifts toward it "
            "until the NodePool or its EC2NodeClass changes"
        )
    return f"waiting for its wave of rollout {state.rollout_id} (wave {state.wave}, {state.phase})"


def drift_rollouts(ctx: PlanContext, drifted: dict[str, list[Node]]) -> list[DriftRollout]:
    """The rollouts to start: pools with a valid policy whose drifted, unmarked nodes wait for a
    target that has no rollout yet. `drifted`: pool -> its drifted nodes this pass."""
    out: list[DriftRollout] = []
    for name in sorted(drifted):
        pool = ctx.snapshot.nodepools[name]
        policy, error = pool_policy(ctx, pool)
        if policy is None or error or pool.spec.is_static:
            continue
        target = pool_target(ctx, pool)
        state = pool_state(pool)
        if state is not None and state.target == target and state.phase != "Superseded":
            continue  # that target's rollout runs, halted, aborted or done
        nodes = [
            RolloutNode(name=n.name, uid=n.uid or "", zone=n.zone or "")
            for n in drifted[name]
            if not n.annotation(ROLLOUT_ANNOTATION) and n.uid
        ]
        if nodes:
            out.append(DriftRollout(nodepool=name, target=target, policy=policy, nodes=nodes))
    return out
