"""A NodePool with a rollout policy drifts in waves: a drifted node waits until a wave marks it, the
pass asks for the target's rollout once, and a halted or aborted target drifts nothing
(planner/rollout_holds.py)."""

from __future__ import annotations

import json
from datetime import timedelta

from api.constants import ROLLOUT_ANNOTATION
from api.rollout_policy import ROLLOUT_POLICY_ANNOTATION, ROLLOUT_STATE_ANNOTATION, RolloutState
from planner.drift import Drift
from planner.model import PlanOptions
from planner.plan import plan
from planner.rollout_holds import pool_target
from tests.unit.planner.test_drift import FakeSimulation, cluster

POLICY = json.dumps({"canary": 1, "soak": "2m", "growth": 2})


def drifted_pool(policy: str | None = POLICY, state: RolloutState | None = None, marked: str = ""):
    """Two nodes on an AMI the EC2NodeClass no longer lists (AMIDrift), in a pool with the policy."""
    b = cluster(budgets=[{"nodes": "100%"}])
    annotations = {}
    if policy is not None:
        annotations[ROLLOUT_POLICY_ANNOTATION] = policy
    b.objects[1]["metadata"]["annotations"] = annotations
    for name in ("a", "b"):
        extra = {ROLLOUT_ANNOTATION: "rollout/c/default/drift-x"} if name == marked else {}
        b.node(name, ami="ami-old", security_groups="sg-1,sg-2", annotations=extra, age=timedelta(days=2))
    if state is not None:
        annotations[ROLLOUT_STATE_ANNOTATION] = state.annotation()
    return b


def target_of(b) -> str:
    ctx = b.context(PlanOptions())
    return pool_target(ctx, ctx.snapshot.nodepools["default"])


def run(b):
    return plan(b.snapshot(), b.catalog, PlanOptions(), methods=[Drift()], simulate=FakeSimulation())


def reasons(result) -> dict[str, str]:
    return {x.node: x.reason for x in result.blocked}


def state(b, phase: str, target: str | None = None, reason: str = "") -> RolloutState:
    return RolloutState.model_validate(
        {
            "id": "rollout/c/default/drift-x",
            "target": target or target_of(b),
            "phase": phase,
            "wave": 1,
            "reason": reason,
        }
    )


def test_without_a_policy_drift_goes_as_before():
    result = run(drifted_pool(policy=None))
    assert sorted(n for c in result.commands for n in c.nodes) == ["a", "b"]
    assert result.rollouts == []


def test_with_a_policy_drifted_nodes_wait_and_the_pass_asks_for_the_targets_rollout():
    b = drifted_pool()
    result = run(b)
    assert result.commands == []
    assert all("waiting for the first wave" in r for r in reasons(result).values()), reasons(result)
    (rollout,) = result.rollouts
    assert rollout.nodepool == "default" and rollout.target == target_of(b)
    assert sorted(n.name for n in rollout.nodes) == ["a", "b"] and all(n.uid for n in rollout.nodes)
    assert rollout.policy.canary == "1" and rollout.policy.soak == timedelta(minutes=2)


def test_a_rolling_target_drifts_only_what_its_wave_marked_and_asks_for_nothing_more():
    b = drifted_pool(marked="a")
    b.objects[1]["metadata"]["annotations"][ROLLOUT_STATE_ANNOTATION] = state(b, "Rolling").annotation()
    result = run(b)
    assert [c.nodes for c in result.commands] == [["a"]]
    assert "waiting for its wave" in reasons(result)["b"]
    assert result.rollouts == []


def test_a_halted_target_drifts_nothing_and_says_how_to_go_on():
    b = drifted_pool()
    halted = state(b, "Halted", reason="pod web-1 restarted 5 times")
    b.objects[1]["metadata"]["annotations"][ROLLOUT_STATE_ANNOTATION] = halted.annotation()
    result = run(b)
    assert result.commands == [] and result.rollouts == []
    why = reasons(result)["a"]
    assert "halted at wave 1" in why and "restarted 5 times" in why and "--resume" in why


def test_an_aborted_target_stays_held_until_the_pool_changes():
    b = drifted_pool()
    b.objects[1]["metadata"]["annotations"][ROLLOUT_STATE_ANNOTATION] = state(b, "Aborted").annotation()
    result = run(b)
    assert result.commands == [] and result.rollouts == []
    assert "aborted" in reasons(result)["b"]


def test_a_new_target_after_a_halt_gets_its_own_rollout():
    """The user moved the EC2NodeClass on (a good AMI): the halted target's state no longer applies."""
    b = drifted_pool()
    old = state(b, "Halted", target="0000000000")
    b.objects[1]["metadata"]["annotations"][ROLLOUT_STATE_ANNOTATION] = old.annotation()
    result = run(b)
    (rollout,) = result.rollouts
    assert rollout.target == target_of(b) != "0000000000"
    assert result.commands == []


def test_a_succeeded_target_drifts_as_usual():
    b = drifted_pool()
    b.objects[1]["metadata"]["annotations"][ROLLOUT_STATE_ANNOTATION] = state(b, "Succeeded").annotation()
    result = run(b)
    assert sorted(n for c in result.commands for n in c.nodes) == ["a", "b"]
    assert result.rollouts == []


def test_an_invalid_policy_holds_drift_and_is_reported():
    result = run(drifted_pool(policy='{"canary": 0}'))
    assert result.commands == [] and result.rollouts == []
    assert "rollout policy is invalid" in reasons(result)["a"]
    assert any("karpflow.dev/rollout-policy" in p and "at least one node" in p for p in result.problems)


def test_the_target_changes_with_the_amis_and_not_with_unrelated_pool_fields():
    b = drifted_pool()
    before = target_of(b)
    b.objects[1]["spec"]["weight"] = 7
    assert target_of(b) == before
    b.objects[0]["status"]["amis"] = [{"id": "ami-newer"}]
    assert target_of(b) != before
