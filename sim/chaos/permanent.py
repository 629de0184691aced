"""The faults of a chaos run that make a step fail for good, not for a retry, while they last; each
one a small class: `start` injects it, `lift` takes it away (after its hold, or when the fault phase
ends), `findings` says what karpflow did wrong under it (violations of the run), `notes` what it
saw. Every choice comes from the event's own random generator.

- `EvictionsDenied`: an admission webhook denies every eviction (HTTP 400, what kube-apiserver answers
  for a webhook's denial) for a while. Expected: the drains wait and retry (activities/drain.py);
  no termination fails on a denied eviction; the PDB and do-not-disrupt invariants hold as always;
  after it lifts, everything converges.
- `OwnershipRemoved` (standalone only): the `kubernetes.io/cluster/<cluster>: owned` tag is taken
  off the instance of a node karpflow is terminating. Expected: karpflow refuses to terminate the
  instance (activities/ec2.py `terminate_instance`, the guards) and the node stays deleting; the run
  reports the refusal as expected, not as a leak. Then a person puts the tag back (the lift) and the
  node-deletion watcher's retry finishes the termination (cluster/node_deletions.py). A finding: the
  instance was terminated while it had no ownership tag. (While the tag is off the invariant checker
  does not see the instance, so its node counts as an orphan: the hold is kept under that bound.)
- `NodeClaimHeld` (beside Karpenter only): a finalizer of someone else's holds the deletion of the
  NodeClaim of a node karpflow disrupts. Expected: Karpenter drains and terminates it as usual, the
  NodeClaim stays deleting until the finalizer goes (the lift), karpflow's termination waits rather
  than fails; after the lift everything converges.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from api import constants as k
from sim.apiserver.errors import ApiError
from sim.apiserver.faults import FaultRule
from sim.chaos.actions import Effects, _instance_of, _instances, _tainted
from sim.stack import SimStack

log = logging.getLogger(__name__)
Obj = dict[str, Any]
WEBHOOK_DENIAL = 'admission webhook "chaos.policy.example.com" denied the request: evictions are frozen'
HOLD_FINALIZER = "chaos.karpflow.dev/hold"
NODECLAIMS = "nodeclaims"
# How long a fault waits for a node it can act on (one in the middle of a command) before it skips.
FIND_WITHIN = 20.0


@dataclass
class PermanentFault:
    """The shape every permanent fault has (see the module docstring)."""

    stack: SimStack
    effects: Effects
    active: bool = False
    problems: list[str] = field(default_factory=list)
    seen: list[str] = field(default_factory=list)

    kind = "permanent"

    async def start(self, rng: random.Random) -> bool:
        raise NotImplementedError

    def lift(self) -> None:
        raise NotImplementedError

    def findings(self, failures: list[str]) -> list[str]:
        """Violations of the run, given the failed workflows' lines (id: cause)."""
        return list(self.problems)

    def notes(self) -> list[str]:
        return list(self.seen)


async def _poll(find: Callable[[], Any], within: float = FIND_WITHIN) -> Any:
    """`find()` until it answers something, for at most `within` seconds (None: never)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while True:
        found = find()
        if found or loop.time() > until:
            return found or None
        await asyncio.sleep(0.5)


@dataclass
class EvictionsDenied(PermanentFault):
    rule_id: int | None = None
    fired: int = 0

    kind = "evictions-denied"

    async def start(self, rng: random.Random) -> bool:
        rule = FaultRule(verb="create", resource="pods/eviction", status=400, message=WEBHOOK_DENIAL)
        self.rule_id = self.stack.api_faults.add(rule).id
        self.active = True
        self.effects.note(self.kind, "an admission webhook denies every eviction (400)")
        return True

    def lift(self) -> None:
        if not self.active or self.rule_id is None:
            return
        fired = {r.id: r.fired for r in self.stack.api_faults.rules()}
        self.fired += fired.get(self.rule_id, 0)
        self.stack.api_faults.remove(self.rule_id)
        self.active = False
        self.effects.counts["evictions-denied-requests"] += self.fired
        self.seen.append(f"evictions denied: {self.fired} eviction(s) answered 400, then allowed again")
        self.effects.note(self.kind + "-lifted", f"evictions allowed again after {self.fired} denials")

    def findings(self, failures: list[str]) -> list[str]:
        failed = [f for f in failures if f.startswith("termination/") and "API 400" in f]
        return [
            f"evictions-denied: a termination failed on a denied eviction instead of waiting: {f}"
            for f in failed
        ]


@dataclass
class OwnershipRemoved(PermanentFault):
    instance_id: str | None = None
    node: str | None = None
    terminated_untagged: bool = False

    kind = "ownership-removed"

    def _target(self) -> tuple[str, str] | None:
        """A node karpflow is terminating (deleting, still with its instance), else one a command holds."""
        nodes = self.stack.store.list("nodes").items
        deleting = [n for n in nodes if n["metadata"].get("deletionTimestamp") and _instance_of(n)]
        held = [n for n in nodes if _tainted(n) and _instance_of(n)]
        live = {i["InstanceId"] for i in _instances(self.stack)}
        for group in (deleting, held):
            choices = sorted(
                (n["metadata"]["name"], _instance_of(n) or "") for n in group if _instance_of(n) in live
            )
            if choices:
                return choices[0]
        return None

    async def start(self, rng: random.Random) -> bool:
        target = await _poll(self._target)
        if target is None:
            self.effects.note("skipped", "ownership-removed: no node was being disrupted")
            return False
        self.node, self.instance_id = target
        tag = k.cluster_tag(self.stack.cluster_name)
        await asyncio.to_thread(
            self.stack._sim_ec2.delete_tags, Resources=[self.instance_id], Tags=[{"Key": tag}]
        )
        self.active = True
        self.effects.note(self.kind, f"tag {tag} taken off instance {self.instance_id} (node {self.node})")
        return True

    def lift(self) -> None:
        if not self.active or self.instance_id is None:
            return
        self.active = False
        state = _instance_state(self.stack, self.instance_id)
        if state in ("shutting-down", "terminated"):
            # Nothing but karpflow terminates a node's instance in this harness unless it says so.
            if self.instance_id not in self.stack.invariants.lost_instances:
                self.terminated_untagged = True
                self.problems.append(
                    f"ownership-removed: instance {self.instance_id} (node {self.node}) was terminated "
                    "while it had no ownership tag"
                )
            return
        tag = k.cluster_tag(self.stack.cluster_name)
        self.stack._sim_ec2.create_tags(
            Resources=[self.instance_id], Tags=[{"Key": tag, "Value": k.CLUSTER_TAG_VALUE}]
        )
        self.seen.append(
            f"ownership-removed: instance {self.instance_id} (node {self.node}) kept while untagged "
            f"({state}); tag put back"
        )
        self.effects.note(self.kind + "-lifted", f"tag put back on {self.instance_id}")

    def findings(self, failures: list[str]) -> list[str]:
        names = [name for name in (self.instance_id, self.node) if name]
        refused = [f for f in failures if "does not own" in f and any(name in f for name in names)]
        if refused:
            self.effects.counts["ownership-refused"] += len(refused)
            self.seen.append(f"ownership-removed: karpflow refused, as expected: {refused[0]}")
        return list(self.problems)


@dataclass
class NodeClaimHeld(PermanentFault):
    nodeclaim: str | None = None

    kind = "nodeclaim-held"

    def _target(self) -> str | None:
        claims = {
            (c.get("status") or {}).get("nodeName"): c["metadata"]["name"]
            for c in self.stack.store.list(NODECLAIMS).items
            if not c["metadata"].get("deletionTimestamp")
        }
        nodes = self.stack.store.list("nodes").items
        held = sorted(
            n["metadata"]["name"]
            for n in nodes
            if any(t.get("key") in k.DISRUPTION_TAINT_KEYS for t in (n.get("spec") or {}).get("taints") or ())
        )
        for name in held:
            if name in claims:
                return claims[name]
        return None

    async def start(self, rng: random.Random) -> bool:
        name = await _poll(self._target)
        if name is None:
            self.effects.note("skipped", "nodeclaim-held: no NodeClaim of a disrupted node")
            return False

        def hold(obj: Obj) -> None:
            finalizers = obj["metadata"].setdefault("finalizers", [])
            if HOLD_FINALIZER not in finalizers:
                finalizers.append(HOLD_FINALIZER)

        try:
            self.stack.store.mutate(NODECLAIMS, name, hold)
        except ApiError as err:
            self.effects.note("skipped", f"nodeclaim-held: {err}")
            return False
        self.nodeclaim, self.active = name, True
        self.effects.note(self.kind, f"finalizer {HOLD_FINALIZER} holds NodeClaim {name}")
        return True

    def lift(self) -> None:
        if not self.active or self.nodeclaim is None:
            return
        self.active = False

        def release(obj: Obj) -> None:
            obj["metadata"]["finalizers"] = [
                f for f in obj["metadata"].get("finalizers") or () if f != HOLD_FINALIZER
            ]

        try:
            claim = self.stack.store.get(NODECLAIMS, self.nodeclaim)
            deleting = bool(claim["metadata"].get("deletionTimestamp"))
            self.stack.store.mutate(NODECLAIMS, self.nodeclaim, release)
        except ApiError:
            deleting = True  # gone already: nothing held it in the end
        what = "was held deleting" if deleting else "was not deleted"
        self.seen.append(f"nodeclaim-held: NodeClaim {self.nodeclaim} {what} until its finalizer went")
        self.effects.note(self.kind + "-lifted", f"finalizer {HOLD_FINALIZER} off NodeClaim {self.nodeclaim}")


def _instance_state(stack: SimStack, instance_id: str) -> str:
    try:
        response = stack._sim_ec2.describe_instances(InstanceIds=[instance_id])
    except Exception:
        return "unknown"
    for reservation in response.get("Reservations") or ():
        for instance in reservation.get("Instances") or ():
            return str(instance["State"]["Name"])
    return "unknown"


FAULTS: dict[str, type[PermanentFault]] = {
    "deny-evictions": EvictionsDenied,
    "remove-ownership-tag": OwnershipRemoved,
    "hold-nodeclaim": NodeClaimHeld,
}
