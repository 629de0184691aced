"""The faults that stay on for the whole fault phase of a chaos run, and how many times each fired.

Kubernetes API (the emulator's fault rules, sim/apiserver/faults.py; they hit every HTTP client, which
during a run is karpflow's workers): 500, 429 and, on writes, 409 on about `api_error_rate` of the
calls; added latency on some; watches cut after a few seconds; a 410 on some re-watches (the
informers must list again). EC2 (sim/ec2_faults.py, karpflow's calls only): RequestLimitExceeded on
`ec2_throttle` of the calls, InsufficientInstanceCapacity on a few cheap offerings, and some of the
replacements karpflow launches never become Ready while the faults last.

Every random choice is drawn from the run's seed.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sim.apiserver.faults import FaultRule
from sim.stack import SimStack

COMMAND_TAG = "karpflow.io/command-id"
# Cheap offerings the planner picks first for replacements: where capacity errors hurt.
CHEAP_TYPES = ("c5.large", "c6i.large", "m5.large", "c5a.large", "m6i.large", "m5a.large")
ZONES = ("us-west-2a", "us-west-2b")
WRITE_VERBS = ("create", "update", "patch", "delete")


@dataclass
class ContinuousFaults:
    """Install with `on()`, remove with `off()`; `counts()` says what fired, by kind."""

    stack: SimStack
    seed: int
    api_error_rate: float = 0.10
    ec2_throttle: float = 0.10
    never_ready_share: float = 0.3
    rules: dict[str, list[int]] = field(default_factory=dict)  # kind -> rule ids
    never_ready_ids: set[str] = field(default_factory=set)
    ice_pools: list[dict[str, Any]] = field(default_factory=list)
    _fired: Counter[str] = field(default_factory=Counter)
    _ec2: Counter[str] = field(default_factory=Counter)

    def on(self) -> None:
        rng = random.Random(f"{self.seed}/continuous-faults")
        share = self.api_error_rate / 3
        self._rule("api-500", FaultRule(status=500, error_rate=share, message="injected: etcd timeout"))
        self._rule("api-429", FaultRule(status=429, error_rate=share, message="injected: too many requests"))
        for verb in WRITE_VERBS:
            # A conflict is what a write meets when the object changed under it.
            self._rule(
                "api-409",
                FaultRule(
                    verb=verb, status=409, error_rate=share, message="injected: the object has been modified"
                ),
            )
        self._rule("api-latency", FaultRule(latency_ms=rng.choice((150, 250, 400)), error_rate=0.05))
        self._rule("watch-cut", FaultRule(verb="watch", watch_disconnect_after_seconds=rng.uniform(2.0, 6.0)))
        self._rule("watch-410", FaultRule(verb="watch", status=410, rewatch_only=True, error_rate=0.25))
        faults = self.stack.faults
        faults.set_throttle(probability=self.ec2_throttle, seed=rng.randrange(2**31))
        for instance_type in rng.sample(CHEAP_TYPES, 2):
            pool = {"instance_type": instance_type, "zone": rng.choice(ZONES), "capacity_type": None}
            if rng.random() < 0.5:
                pool["capacity_type"] = "spot"
            faults.add_insufficient_capacity(**pool)
            self.ice_pools.append(pool)
        salt = f"{self.seed}/never-ready"
        faults.add_never_ready(predicate=lambda instance: self._never_ready(instance, salt))

    def _rule(self, kind: str, rule: FaultRule) -> None:
        self.rules.setdefault(kind, []).append(self.stack.api_faults.add(rule).id or 0)

    def _never_ready(self, instance: Mapping[str, Any], salt: str) -> bool:
        """Some of karpflow's replacements (they carry the command tag) stay NotReady; which ones is a
        hash of the seed and the instance id, so a restart of the simulator keeps the choice."""
        tags = {t.get("Key"): t.get("Value") for t in instance.get("Tags") or ()}
        if COMMAND_TAG not in tags:
            return False
        digest = hashlib.sha256(f"{salt}/{instance.get('InstanceId')}".encode()).digest()
        chosen = digest[0] / 256 < self.never_ready_share
        if chosen:
            self.never_ready_ids.add(str(instance.get("InstanceId")))
        return chosen

    def off(self) -> None:
        """Every fault off: the emulator serves, EC2 launches, held nodes go on to Ready."""
        self._collect()
        self.stack.api_faults.clear()
        self.rules.clear()
        ec2 = self.stack.faults
        self._ec2["ec2-throttle"] += ec2.counters.throttled
        self._ec2["ec2-insufficient-capacity"] += ec2.counters.insufficient_capacity
        ec2.clear()
        if self.stack.controllers is not None:
            self.stack.controllers.poll_ec2_now()

    def _collect(self) -> None:
        fired = {rule.id: rule.fired for rule in self.stack.api_faults.rules()}
        for kind, ids in self.rules.items():
            self._fired[kind] += sum(fired.get(i, 0) for i in ids)

    def counts(self) -> dict[str, int]:
        live: Counter[str] = Counter(self._fired)
        if self.rules:
            fired = {rule.id: rule.fired for rule in self.stack.api_faults.rules()}
            for kind, ids in self.rules.items():
                live[kind] += sum(fired.get(i, 0) for i in ids)
            ec2 = self.stack.faults.counters
            live["ec2-throttle"] += ec2.throttled
            live["ec2-insufficient-capacity"] += ec2.insufficient_capacity
        live.update(self._ec2)
        live["never-ready-replacement"] = len(self.never_ready_ids)
        return dict(live)
