"""The drain asks the API server for an eviction only when the cached PodDisruptionBudget has room
(kube/pdb_budget.py, activities/drain.py): the eviction rules read off a PDB, and a drain under a
budget of one that is never answered 429, even with a cache one look behind the server."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from activities.drain import Drainer
from kube.client import KubeError
from kube.pdb_budget import Spent, eviction_may_pass

Json = dict[str, Any]


def pod(name: str, *, ready: bool = True, phase: str = "Running", deleting: bool = False) -> Json:
    meta: Json = {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {"app": "web"}}
    meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web", "controller": True}]
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T12:00:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "metadata": meta,
        "spec": {"terminationGracePeriodSeconds": 30},
        "status": {"phase": phase, "conditions": conditions},
    }


def pdb(
    allowed: int | None,
    *,
    version: int = 1,
    healthy: tuple[int, int] = (3, 3),
    policy: str | None = None,
    behind: bool = False,
) -> Json:
    """The `web` PDB; `allowed=None`: no status yet; `healthy`: (current, desired)."""
    obj: Json = {
        "metadata": {
            "name": "web",
            "namespace": "default",
            "uid": "pdb-web",
            "resourceVersion": str(version),
            "generation": 2 if behind else 1,
        },
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
    }
    if policy:
        obj["spec"]["unhealthyPodEvictionPolicy"] = policy
    if allowed is not None:
        obj["status"] = {
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy[0],
            "desiredHealthy": healthy[1],
            "observedGeneration": 1,
        }
    return obj


@pytest.mark.parametrize(
    ("the_pod", "pdbs", "spent", "passes"),
    [
        (pod("a"), [pdb(1)], 0, True),
        (pod("a"), [pdb(0)], 0, False),
        (pod("a"), [pdb(1)], 1, False),  # this worker took the one disruption the cache still shows
        (pod("a"), [pdb(2)], 1, True),
        (pod("a"), [pdb(1, behind=True)], 0, False),  # the controller has not seen the new spec: 429
        (pod("a"), [], 0, None),  # nothing guards it: the server decides
        (pod("a"), [pdb(1), pdb(1)], 0, None),  # two PDBs: the server's 500
        (pod("a"), [pdb(None)], 0, None),  # no status written yet
        # kube-apiserver ignores PDBs for these
        (pod("a", phase="Pending"), [pdb(0)], 0, True),
        (pod("a", phase="Succeeded"), [pdb(0)], 0, True),
        (pod("a", deleting=True), [pdb(0)], 0, True),
        # an unready pod spends no budget while the budget is healthy, or always with AlwaysAllow
        (pod("a", ready=False), [pdb(0, healthy=(3, 3))], 0, True),
        (pod("a", ready=False), [pdb(0, healthy=(2, 3))], 0, False),
        (pod("a", ready=False), [pdb(0, healthy=(0, 0))], 0, False),
        (pod("a", ready=False), [pdb(0, healthy=(2, 3), policy="AlwaysAllow")], 0, True),
    ],
)
def test_what_the_cached_pdb_says_of_an_eviction(
    the_pod: Json, pdbs: list[Json], spent: int, passes: bool | None
) -> None:
    assert eviction_may_pass(the_pod, pdbs, spent) is passes


def test_what_this_worker_spent_is_forgotten_once_the_cache_shows_a_newer_version() -> None:
    spent = Spent()
    spent.spend(pdb(2, version=5))
    spent.spend(pdb(2, version=5))
    assert spent.of(pdb(2, version=5)) == 2
    assert spent.of(pdb(0, version=6)) == 0  # the server's status counts them now
    assert spent.of(pdb(2, version=5)) == 0


class BudgetApi:
    """One node's pods under the `web` PDB as kube-apiserver keeps it: an eviction takes one
    disruption from `disruptionsAllowed` (a new resourceVersion) or is answered 429; an evicted pod is
    gone after `rounds` looks at the node, and its replacement elsewhere gives the disruption back.
    The PDB is read one look behind (`lag`): what a watch delivers a moment later."""

    def __init__(self, names: list[str], allowed: int, rounds: int = 3, lag: bool = True) -> None:
        self.pods = {f"uid-{n}": pod(n) for n in names}
        self.allowed, self.version, self.rounds, self.lag = allowed, 1, rounds, lag
        self.leaving: dict[str, int] = {}
        self.evictions: list[str] = []
        self.refused = 0
        self.seen = pdb(allowed)

    def _pdb(self) -> Json:
        return pdb(self.allowed, version=self.version)

    async def pods_on_node(self, node: str) -> list[Json]:
        for uid in list(self.leaving):
            self.leaving[uid] -= 1
            if self.leaving[uid] <= 0:
                del self.leaving[uid], self.pods[uid]
                self.allowed, self.version = self.allowed + 1, self.version + 1
        return [copy.deepcopy(p) for p in self.pods.values()]

    async def pdbs(self, namespace: str) -> list[Json]:
        shown, self.seen = self.seen, self._pdb()
        return [shown if self.lag else self.seen]

    async def evict(self, raw: Json) -> None:
        uid = raw["metadata"]["uid"]
        if uid not in self.pods:
            raise KubeError(404, "NotFound")
        if self.allowed <= 0:
            self.refused += 1
            raise KubeError(429, "TooManyRequests", '{"message": "Cannot evict pod as it would violate"}')
        self.allowed, self.version = self.allowed - 1, self.version + 1
        self.evictions.append(raw["metadata"]["name"])
        self.pods[uid]["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
        self.leaving[uid] = self.rounds

    async def delete_pod(self, raw: Json, grace: int) -> None:
        raise AssertionError("no deadline: nothing is deleted")


@pytest.mark.parametrize("lag", [True, False])
async def test_a_drain_under_a_budget_of_one_is_never_refused(lag: bool) -> None:
    """Before issue 34's fix every pod after the first was sent at once and answered 429, then again
    with each back-off: here, with the PDB read from the cache, each eviction is sent once."""
    api = BudgetApi([f"web-{i}" for i in range(4)], allowed=1, lag=lag)
    progress = await Drainer(api, "n", None, poll_interval=0.001).run()  # type: ignore[arg-type]
    assert progress.evicted == 4 and sorted(api.evictions) == [f"web-{i}" for i in range(4)]
    assert api.refused == 0


async def test_a_budget_that_allows_nothing_is_waited_for_without_asking() -> None:
    """A PDB at 0 in the cache: no eviction is sent within the back-off (10 s), and the drain
    reports the pod blocked by the PDB; the passes end when the check says the node is another."""
    api = BudgetApi(["web-0"], allowed=0, lag=False)
    passes = 0

    async def check() -> tuple[str | None, None]:
        nonlocal passes
        passes += 1
        return ("enough passes" if passes > 30 else None), None

    progress = await Drainer(api, "n", None, poll_interval=0.001, check=check).run()  # type: ignore[arg-type]
    assert api.refused == 0 and api.evictions == []
    assert "PodDisruptionBudget: default/web allows no disruption now" in progress.blocked["default/web-0"]


class LaggingApi:
    """A cache a few looks behind: an evicted pod is still shown running, then gone."""

    def __init__(self) -> None:
        self.pods = {"uid-web-0": pod("web-0")}
        self.shown_for: dict[str, int] = {}
        self.evictions = 0

    async def pods_on_node(self, node: str) -> list[Json]:
        for uid in list(self.shown_for):
            self.shown_for[uid] -= 1
            if self.shown_for[uid] <= 0:
                del self.shown_for[uid], self.pods[uid]
        return [copy.deepcopy(p) for p in self.pods.values()]

    async def pdbs(self, namespace: str) -> list[Json]:
        return []

    async def evict(self, raw: Json) -> None:
        self.evictions += 1
        if raw["metadata"]["uid"] in self.shown_for:
            raise KubeError(404, "NotFound")  # gone on the server already
        self.shown_for[raw["metadata"]["uid"]] = 4


async def test_a_pod_the_drain_evicted_is_not_evicted_again_while_the_cache_still_shows_it() -> None:
    """bench_api_load's drift before this: 6 evictions a node answered 404."""
    api = LaggingApi()
    progress = await Drainer(api, "n", None, poll_interval=0.001).run()  # type: ignore[arg-type]
    assert progress.evicted == 1 and api.evictions == 1
