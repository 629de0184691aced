"""The drain rules (kube/drain_rules.py) and the drain loop (activities/drain.py), with a fake API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities.drain import Drainer
from kube.client import KubeError
from kube.drain_rules import Pod, disruption_taint, pdb_group, pdb_selects, plan, tolerates_disrupted

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def pod(
    name: str,
    *,
    ds: bool = False,
    critical: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
    phase: str = "Running",
    deleted: datetime | None = None,
    grace: int | None = 30,
    owner: str = "ReplicaSet",
) -> Pod:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": labels or {},
        "annotations": annotations or {},
        "ownerReferences": [{"kind": "DaemonSet" if ds else owner, "name": "x", "controller": True}],
    }
    if deleted:
        meta["deletionTimestamp"] = deleted.strftime("%Y-%m-%dT%H:%M:%SZ")
    spec: dict[str, Any] = {"tolerations": tolerations or []}
    if critical:
        spec["priorityClassName"] = "system-node-critical"
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return Pod(
        {"metadata": meta, "spec": spec, "status": {"phase": phase, "startTime": "2026-01-01T11:00:00Z"}}
    )


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"operator": "Exists"}, True),
        ({"key": "karpenter.sh/disrupted", "operator": "Exists"}, True),
        ({"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "karpenter.sh/disrupted", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "karpenter.sh/disrupted", "value": ""}, True),
        ({"key": "karpenter.sh/disrupted", "value": "x"}, False),
        ({"key": "node.kubernetes.io/not-ready", "operator": "Exists"}, False),
        ({"operator": "Exists", "effect": "NoExecute"}, False),
    ],
)
def test_which_tolerations_tolerate_the_disrupted_taint(toleration, tolerates):
    assert tolerates_disrupted([toleration]) is tolerates


def test_beside_karpenter_the_drain_waits_for_pods_by_karpflows_own_taint():
    """A node karpflow drains beside Karpenter carries `karpflow.dev/disrupted`: a pod that tolerates
    only Karpenter's key is evicted (it cannot land there again), one that tolerates karpflow's stays."""
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    karpenters = pod("karpenters", tolerations=[{"key": "karpenter.sh/disrupted", "operator": "Exists"}])
    karpflows = pod("karpflows", tolerations=[{"key": "karpflow.dev/disrupted", "operator": "Exists"}])
    everything = pod("everything", tolerations=[{"operator": "Exists"}])
    pods = [karpenters, karpflows, everything]
    assert [p.name for p in plan(pods, None, now).waiting] == ["karpflows"]
    own = disruption_taint("karpflow.dev/disrupted")
    assert [p.name for p in plan(pods, None, now, own).waiting] == ["karpenters"]


def test_tiers_follow_graceful_node_shutdown_order():
    assert [
        pod("a").tier,
        pod("b", ds=True).tier,
        pod("c", critical=True).tier,
        pod("d", ds=True, critical=True).tier,
    ] == [
        0,
        1,
        2,
        3,
    ]


def test_only_the_first_non_empty_tier_is_evicted():
    current = plan([pod("ds", ds=True), pod("crit", critical=True), pod("app")], None, NOW)
    assert current.tier == 0 and [p.name for p in current.evict] == ["app"]
    assert {p.name for p in current.waiting} == {"ds", "crit", "app"}


def test_terminating_pods_of_an_earlier_tier_hold_the_next_tier():
    current = plan([pod("app", deleted=NOW - timedelta(seconds=5)), pod("ds", ds=True)], None, NOW)
    assert current.tier == 0 and current.evict == [] and not current.done


@pytest.mark.parametrize(
    "skipped",
    [
        pod("tolerant", tolerations=[{"operator": "Exists"}]),
        pod("mirror", annotations={"kubernetes.io/config.mirror": "abc"}),
        pod("static", owner="Node"),
        pod("done", phase="Succeeded"),
        pod("failed", phase="Failed"),
        pod("stuck", deleted=NOW - timedelta(minutes=2)),
    ],
    ids=lambda p: p.name,
)
def test_pods_that_are_not_waited_for(skipped):
    assert plan([skipped], None, NOW).done


def test_do_not_disrupt_pods_are_waited_for_but_never_evicted():
    current = plan([pod("held", annotations={"karpenter.sh/do-not-disrupt": "true"}), pod("app")], None, NOW)
    assert [p.name for p in current.evict] == ["app"] and len(current.waiting) == 2


def test_a_do_not_disrupt_duration_expires_after_the_pod_started():
    started_an_hour_ago = pod("held", annotations={"karpenter.sh/do-not-disrupt": "30m"})
    assert not started_an_hour_ago.do_not_disrupt(NOW)
    assert pod("held", annotations={"karpenter.sh/do-not-disrupt": "2h"}).do_not_disrupt(NOW)
    assert pod("old", annotations={"karpenter.sh/do-not-evict": "true"}).do_not_disrupt(NOW)


def test_a_do_not_disrupt_duration_protects_a_pod_with_no_known_start():
    unstarted = pod("held", annotations={"karpenter.sh/do-not-disrupt": "30m"})
    del unstarted.raw["status"]["startTime"]
    assert unstarted.do_not_disrupt(NOW)


def test_the_deadline_forces_deletion_with_the_time_left():
    deadline = NOW + timedelta(seconds=20)
    current = plan([pod("slow", grace=30), pod("quick", grace=5)], deadline, NOW)
    assert [(p.name, grace) for p, grace in current.force_delete] == [("slow", 20)]
    assert [p.name for p in current.evict] == ["quick"]


def test_force_deletion_never_uses_zero_grace_and_ignores_tiers_and_do_not_disrupt():
    past = NOW - timedelta(seconds=10)
    pods = [
        pod("held", annotations={"karpenter.sh/do-not-disrupt": "true"}),
        pod("ds", ds=True, critical=True),
    ]
    assert sorted((p.name, g) for p, g in plan(pods, past, NOW).force_delete) == [("ds", 1), ("held", 1)]


def test_a_deadline_already_past_when_the_drain_begins_deletes_every_pod_in_its_first_look():
    """Issue 30 item 2: what a drain does when it begins with its deadline behind it (as it did after
    a gate wait longer than the grace period): nothing is evicted, every waited-for pod of every tier
    is deleted at once with one second of grace, do-not-disrupt and PDB-guarded ones included. This is
    Karpenter's rule at the deadline, so the fix is in when the deadline is stamped (the gate,
    activities/termination_steps.py `termination_gate`), not here."""
    past = NOW - timedelta(minutes=5)
    pods = [
        pod("web-1", labels={"app": "web"}),  # a PDB guards it: eviction would wait
        pod("web-2", labels={"app": "web"}),
        pod("trainer", annotations={"karpenter.sh/do-not-disrupt": "true"}, grace=3600),
        pod("agent", ds=True),
        pod("dns", critical=True),
    ]
    current = plan(pods, past, NOW)
    assert current.evict == []
    assert sorted((p.name, g) for p, g in current.force_delete) == [
        ("agent", 1),
        ("dns", 1),
        ("trainer", 1),
        ("web-1", 1),
        ("web-2", 1),
    ]


def test_a_pod_terminating_past_the_deadline_is_deleted_again_sooner():
    deadline = NOW + timedelta(seconds=10)
    late = pod("late", deleted=NOW + timedelta(seconds=25))
    early = pod("early", deleted=NOW + timedelta(seconds=5))
    assert [(p.name, g) for p, g in plan([late, early], deadline, NOW).force_delete] == [("late", 10)]


def test_pdb_selectors():
    web = pod("w", labels={"app": "web", "tier": "front"})

    def selects(selector: dict[str, Any] | None, namespace: str = "default") -> bool:
        return pdb_selects(
            {"metadata": {"name": "p", "namespace": namespace}, "spec": {"selector": selector}}, web
        )

    assert selects({})
    assert not selects(None)  # policy/v1: a null selector selects no pod
    assert not selects({}, namespace="other")
    assert selects({"matchLabels": {"app": "web"}})
    assert not selects({"matchLabels": {"app": "db"}})
    assert selects({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front"]}]})
    assert not selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]})
    assert selects({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]})
    assert not selects({"matchExpressions": [{"key": "zone", "operator": "Exists"}]})
    assert not selects({"matchExpressions": [{"key": "zone", "operator": "Near"}]})  # malformed


def pdb(name: str, selector: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "spec": {"selector": selector}}


def test_evictions_are_grouped_by_the_pdbs_guarding_the_pod():
    web = pod("w", labels={"app": "web"})
    pdbs = [pdb("web", {"matchLabels": {"app": "web"}}), pdb("all", {}), pdb("none", None)]
    assert pdb_group(web, pdbs) == ("default/all", "default/web")
    assert pdb_group(pod("lonely"), [pdb("web", {"matchLabels": {"app": "web"}})]) == ("pod:uid-lonely",)


class FakeApi:
    """One node's pods and one PDB allowing `allowed` disruptions at a time. An evicted pod
    terminates, and is gone (replaced elsewhere) after `terminating_rounds` looks at the node."""

    def __init__(self, pods: list[Pod], allowed: int, terminating_rounds: int = 2) -> None:
        self.pods = {p.uid: p.raw for p in pods}
        self.allowed = allowed
        self.rounds = terminating_rounds
        self.leaving: dict[str, int] = {}
        self.evictions: list[str] = []
        self.refused = 0
        self.deleted: list[tuple[str, int]] = []
        self.max_leaving = 0

    async def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        for uid in list(self.leaving):
            self.leaving[uid] -= 1
            if self.leaving[uid] <= 0:
                del self.leaving[uid], self.pods[uid]
        return list(self.pods.values())

    async def pdbs(self, namespace: str) -> list[dict[str, Any]]:
        return [pdb("web", {"matchLabels": {"app": "web"}})]

    async def evict(self, raw: dict[str, Any]) -> None:
        uid = raw["metadata"]["uid"]
        if uid not in self.pods:
            raise KubeError(404, "NotFound")
        if len(self.leaving) >= self.allowed:
            self.refused += 1
            raise KubeError(
                429,
                "TooManyRequests",
                '{"message": "Cannot evict pod as it would violate the pod\'s disruption budget."}',
            )
        self.evictions.append(raw["metadata"]["name"])
        self.pods[uid]["metadata"]["deletionTimestamp"] = "2026-01-01T12:00:00Z"
        self.leaving[uid] = self.rounds
        self.max_leaving = max(self.max_leaving, len(self.leaving))

    async def delete_pod(self, raw: dict[str, Any], grace: int) -> None:
        self.deleted.append((raw["metadata"]["name"], grace))
        self.leaving[raw["metadata"]["uid"]] = 1


async def test_the_drain_evicts_one_pod_at_a_time_under_a_pdb_allowing_one():
    api = FakeApi([pod(f"web-{i}", labels={"app": "web"}) for i in range(4)], allowed=1)
    progress = await Drainer(api, "n", None, poll_interval=0.001, clock=lambda: NOW).run()
    assert progress.evicted == 4 and sorted(api.evictions) == [f"web-{i}" for i in range(4)]
    assert api.max_leaving == 1 and api.refused > 0
    assert progress.pods_left == 0 and "default/web-" not in str(progress.blocked)


class DenyingApi(FakeApi):
    """An admission webhook denies the first `denials` evictions (400), then lifts."""

    def __init__(self, pods: list[Pod], denials: int) -> None:
        super().__init__(pods, allowed=5)
        self.denials = denials

    async def evict(self, raw: dict[str, Any]) -> None:
        if self.denials > 0:
            self.denials -= 1
            raise KubeError(
                400, "BadRequest", '{"message": "admission webhook \\"policy\\" denied the request"}'
            )
        await super().evict(raw)


async def test_evictions_a_webhook_denies_are_retried_until_it_lifts():
    """Chaos (issue 30): evictions denied with 400 for a while; the drain waits them out, backing off,
    as Karpenter's eviction queue does, instead of failing the termination."""
    seen: list[dict[str, str]] = []
    api = DenyingApi([pod("web", labels={"app": "web"})], denials=3)
    progress = await Drainer(
        api,
        "n",
        None,
        poll_interval=0.001,
        clock=lambda: NOW,
        on_progress=lambda p: seen.append(dict(p.blocked)),
    ).run()
    assert progress.evicted == 1 and api.evictions == ["web"] and api.denials == 0
    assert any("HTTP 400" in reason for blocked in seen for reason in blocked.values())


async def test_the_drain_moves_to_the_next_tier_only_when_the_first_is_gone():
    api = FakeApi([pod("web", labels={"app": "web"}), pod("agent", ds=True)], allowed=5, terminating_rounds=3)
    await Drainer(api, "n", None, poll_interval=0.001, clock=lambda: NOW).run()
    assert api.evictions == ["web", "agent"]


async def test_the_drain_deletes_a_held_pod_when_the_deadline_comes():
    clock = iter(
        [NOW, NOW + timedelta(seconds=5), NOW + timedelta(seconds=9), *[NOW + timedelta(seconds=9)] * 10]
    )
    api = FakeApi([pod("held", annotations={"karpenter.sh/do-not-disrupt": "true"}, grace=2)], allowed=1)
    progress = await Drainer(
        api, "n", NOW + timedelta(seconds=10), poll_interval=0.001, clock=lambda: next(clock)
    ).run()
    assert api.evictions == [] and api.deleted == [("held", 1)] and progress.deleted == 1


class VolumeApi:
    """Attachments on a node; one belongs to a pod that is not drained (it tolerates the taint)."""

    async def volume_attachments(self) -> list[dict[str, Any]]:
        def attachment(volume: str | None, node: str = "n") -> dict[str, Any]:
            source = {"persistentVolumeName": volume} if volume else {"inlineVolumeSpec": {}}
            return {"spec": {"nodeName": node, "source": source}}

        return [
            attachment("pv-app"),
            attachment("pv-agent"),
            attachment(None),
            attachment("pv-elsewhere", "m"),
        ]

    async def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        agent = pod("agent", tolerations=[{"operator": "Exists"}]).raw
        agent["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "agent-data"}}]
        return [agent]

    async def pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"spec": {"volumeName": "pv-agent"}} if name == "agent-data" else None


async def test_only_volumes_of_drained_pods_hold_the_termination():
    from activities.kubernetes import KubernetesActivities

    assert await KubernetesActivities(VolumeApi())._blocking_attachments("n") == ["pv-app"]
