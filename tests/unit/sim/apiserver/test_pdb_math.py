"""PodDisruptionBudget status arithmetic, as the disruption controller computes it (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sim.apiserver.eviction import compute_pdb_status, scaled_value

NOW = datetime(2025, 1, 1, tzinfo=UTC)
RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs", "uid": "rs-uid", "controller": True}


def pod(
    name: str,
    ready: bool = True,
    *,
    owner: dict | None = RS,
    deleting: bool = False,
    ns: str = "default",
    app: str = "web",
) -> dict:
    meta: dict = {"name": name, "namespace": ns, "labels": {"app": app}}
    if owner:
        meta["ownerReferences"] = [owner]
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def pdb(**spec: object) -> dict:
    return {
        "metadata": {"name": "web", "namespace": "default", "generation": 3},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


def scale(replicas: int):
    return lambda ref: ("deploy-uid", replicas) if ref.get("kind") == "ReplicaSet" else None


def status(
    budget: dict, pods: list[dict], replicas: int = 3, now: datetime = NOW
) -> tuple[int, int, int, int]:
    s = compute_pdb_status(budget, pods, scale(replicas), now)
    return s["expectedPods"], s["desiredHealthy"], s["currentHealthy"], s["disruptionsAllowed"]


@pytest.mark.parametrize(
    ("value", "total", "expected"),
    [(2, 10, 2), ("50%", 3, 2), ("10%", 5, 1), ("0%", 5, 0), ("100%", 7, 7), ("34%", 3, 2)],
)
def test_scaled_value_rounds_up(value: int | str, total: int, expected: int) -> None:
    assert scaled_value(value, total) == expected


def test_min_available_integer_counts_matching_pods() -> None:
    pods = [pod("a"), pod("b"), pod("c", ready=False)]
    assert status(pdb(minAvailable=1), pods, replicas=10) == (3, 1, 2, 1)


def test_min_available_percent_uses_controller_scale_rounded_up() -> None:
    pods = [pod("a"), pod("b"), pod("c")]
    assert status(pdb(minAvailable="50%"), pods, replicas=3) == (3, 2, 3, 1)


def test_max_unavailable_percent_rounds_up() -> None:
    pods = [pod(str(i)) for i in range(10)]
    # ceil(10 * 15%) = 2 may be unavailable: desired 8 of 10.
    assert status(pdb(maxUnavailable="15%"), pods, replicas=10) == (10, 8, 10, 2)
    assert status(pdb(maxUnavailable=0), pods, replicas=10) == (10, 10, 10, 0)


def test_terminating_and_recently_disrupted_pods_are_not_healthy() -> None:
    budget = pdb(maxUnavailable=1)
    budget["status"] = {"disruptedPods": {"b": "2024-12-31T23:59:30Z", "c": "2024-12-31T23:50:00Z"}}
    pods = [pod("a", deleting=True), pod("b"), pod("c"), pod("d")]
    out = compute_pdb_status(budget, pods, scale(4), NOW)
    # a is terminating, b was evicted 30 s ago (kept), c's eviction is older than 2 minutes (dropped).
    assert out["currentHealthy"] == 2 and out["disruptedPods"] == {"b": "2024-12-31T23:59:30Z"}
    assert out["desiredHealthy"] == 3 and out["disruptionsAllowed"] == 0


def test_selector_and_namespace_scope() -> None:
    pods = [pod("a"), pod("b", app="other"), pod("c", ns="elsewhere")]
    assert status(pdb(minAvailable=0), pods) == (1, 0, 1, 1)
    none_selected = pdb(minAvailable=0)
    del none_selected["spec"]["selector"]  # policy/v1: a null selector selects nothing
    assert status(none_selected, pods) == (0, 0, 0, 0)


def test_no_expected_pods_allows_nothing() -> None:
    assert status(pdb(minAvailable=0), []) == (0, 0, 0, 0)


def test_pods_without_a_scalable_controller_fail_safe() -> None:
    out = compute_pdb_status(pdb(maxUnavailable=1), [pod("a", owner=None)], scale(1), NOW)
    assert out["disruptionsAllowed"] == 0
    cond = out["conditions"][-1]
    assert (cond["type"], cond["status"], cond["reason"]) == ("DisruptionAllowed", "False", "SyncFailed")
    # An integer minAvailable needs no controller: pods are simply counted.
    assert status(pdb(minAvailable=0), [pod("a", owner=None)]) == (1, 0, 1, 1)


def test_condition_and_observed_generation() -> None:
    out = compute_pdb_status(pdb(minAvailable=1), [pod("a"), pod("b")], scale(2), NOW)
    assert out["observedGeneration"] == 3
    assert out["conditions"] == [
        {
            "type": "DisruptionAllowed",
            "status": "True",
            "reason": "SufficientPods",
            "message": "",
            "observedGeneration": 3,
            "lastTransitionTime": "2025-01-01T00:00:00Z",
        }
    ]
    later = compute_pdb_status(
        {**pdb(minAvailable=1), "status": out}, [pod("a"), pod("b")], scale(2), NOW + timedelta(minutes=5)
    )
    assert (
        later["conditions"][0]["lastTransitionTime"] == "2025-01-01T00:00:00Z"
    )  # unchanged status keeps its time
