"""The in-process store: object semantics controllers rely on, without HTTP."""

from __future__ import annotations

import asyncio
import time

import pytest

from sim.apiserver import AlreadyExists, BadRequest, Conflict, Gone, Invalid, NotFound, Store
from sim.apiserver.errors import Forbidden, UnsupportedMediaType
from sim.timescale import TimeScale


def pod(name: str, node: str | None = "n1", labels: dict | None = None, **meta) -> dict:
    spec: dict = {"containers": [{"name": "app", "image": "nginx:1.27"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "labels": labels or {"app": "web"}, **meta},
        "spec": spec,
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def node(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {"phase": "Running"}}


@pytest.fixture
def store() -> Store:
    return Store(TimeScale(0))


def test_create_fills_metadata_and_rejects_duplicates(store: Store) -> None:
    created = store.create("pods", pod("a"))
    meta = created["metadata"]
    assert created["apiVersion"] == "v1" and created["kind"] == "Pod"
    assert meta["namespace"] == "default" and meta["uid"] and meta["creationTimestamp"]
    assert int(meta["resourceVersion"]) == store.resource_version
    assert meta["generation"] == 1
    assert created["status"]["phase"] == "Pending"  # kube-apiserver resets a pod's status on create
    assert created["spec"]["terminationGracePeriodSeconds"] == 30
    with pytest.raises(AlreadyExists, match='pods "a" already exists'):
        store.create("pods", pod("a"))


def test_generate_name_and_invalid_names(store: Store) -> None:
    made = store.create("pods", {"metadata": {"generateName": "web-"}, "spec": pod("x")["spec"]})
    assert made["metadata"]["name"].startswith("web-") and len(made["metadata"]["name"]) == 9
    with pytest.raises(Invalid) as err:
        store.create("pods", pod("Not_Valid"))
    assert err.value.code == 422 and err.value.causes[0]["field"] == "metadata.name"


def test_missing_namespace_and_wrong_kind(store: Store) -> None:
    with pytest.raises(NotFound, match='namespaces "nope" not found'):
        store.create("pods", pod("a"), "nope")
    with pytest.raises(BadRequest):
        store.create("pods", {**pod("a"), "kind": "Node"})


def test_returned_objects_are_private_copies(store: Store) -> None:
    got = store.create("nodes", node("n1", zone="a"))
    got["metadata"]["labels"]["zone"] = "changed"
    assert store.get("nodes", "n1")["metadata"]["labels"]["zone"] == "a"


def test_update_with_stale_resource_version_conflicts(store: Store) -> None:
    first = store.create("nodes", node("n1"))
    first["metadata"]["labels"] = {"a": "1"}
    second = store.update("nodes", first)
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    first["metadata"]["labels"] = {"a": "2"}
    with pytest.raises(Conflict, match="the object has been modified"):
        store.update("nodes", first)


def test_noop_update_does_not_bump_resource_version(store: Store) -> None:
    created = store.create("nodes", node("n1"))
    again = store.update("nodes", created)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


def test_status_is_isolated_from_spec(store: Store) -> None:
    created = store.create("nodes", node("n1"))
    created["status"] = {"phase": "Hacked"}
    created["spec"]["unschedulable"] = True
    updated = store.update("nodes", created)
    assert updated["status"] == {"phase": "Running"} and updated["spec"]["unschedulable"] is True
    updated["status"] = {"phase": "Ready"}
    updated["spec"]["unschedulable"] = False
    via_status = store.update_status("nodes", updated)
    assert via_status["status"] == {"phase": "Ready"} and via_status["spec"]["unschedulable"] is True


# What Karpenter's CRDs require of a NodePool template and a NodeClaim (the emulator validates them).
NODECLAIM_SPEC = {
    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
    "requirements": [],
}


def test_generation_follows_spec_only(store: Store) -> None:
    pool = store.create(
        "nodepools", {"metadata": {"name": "p"}, "spec": {"weight": 1, "template": {"spec": NODECLAIM_SPEC}}}
    )
    assert pool["metadata"]["generation"] == 1
    labelled = store.patch("nodepools", "p", {"metadata": {"labels": {"x": "y"}}})
    assert labelled["metadata"]["generation"] == 1
    status = store.patch("nodepools", "p", {"status": {"nodes": 3}}, subresource="status")
    assert status["metadata"]["generation"] == 1
    assert store.patch("nodepools", "p", {"spec": {"weight": 2}})["metadata"]["generation"] == 2


def test_strategic_patch_on_custom_resource_is_415(store: Store) -> None:
    store.create("nodeclaims", {"metadata": {"name": "c"}, "spec": NODECLAIM_SPEC})
    with pytest.raises(UnsupportedMediaType):
        store.patch("nodeclaims", "c", {"metadata": {"labels": {"a": "b"}}}, patch_type="strategic")


def test_strategic_patch_replaces_taints_and_merges_finalizers(store: Store) -> None:
    store.create("nodes", {**node("n1"), "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    store.patch("nodes", "n1", {"metadata": {"finalizers": ["x"]}}, patch_type="strategic")
    patched = store.patch(
        "nodes",
        "n1",
        {"metadata": {"finalizers": ["y"]}, "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}},
        patch_type="strategic",
    )
    assert patched["spec"]["taints"] == [{"key": "b", "effect": "NoExecute"}]
    assert patched["metadata"]["finalizers"] == ["x", "y"]


def test_label_and_field_selectors(store: Store) -> None:
    store.create("pods", pod("a", "n1", {"app": "web", "tier": "front"}))
    store.create("pods", pod("b", "n2", {"app": "web"}))
    store.create("pods", pod("c", None, {"app": "db"}))

    def names(**kw) -> list[str]:
        return [p["metadata"]["name"] for p in store.list("pods", **kw).items]

    assert names(label_selector="app=web") == ["a", "b"]
    assert names(label_selector="app!=web") == ["c"]
    assert names(label_selector="tier") == ["a"]
    assert names(label_selector="!tier") == ["b", "c"]
    assert names(label_selector="app in (db, x)") == ["c"]
    assert names(label_selector="app notin (db),tier notin (front)") == ["b"]
    assert names(field_selector="spec.nodeName=n2") == ["b"]
    assert names(field_selector="spec.nodeName=") == ["c"]
    assert names(field_selector="spec.nodeName!=n1,metadata.name!=c") == ["b"]
    assert [p["metadata"]["name"] for p in store.pods_on_node("n1")] == ["a"]
    with pytest.raises(BadRequest, match="not a known field selector"):
        store.list("pods", field_selector="spec.bogus=1")


def test_node_index_follows_binding_and_deletion(store: Store) -> None:
    store.create("pods", pod("a", None))
    assert store.pods_on_node("n9") == []
    store.bind("default", "a", "n9")
    assert [p["metadata"]["name"] for p in store.pods_on_node("n9")] == ["a"]
    with pytest.raises(Conflict, match="already assigned"):
        store.bind("default", "a", "n8")
    store.delete("pods", "a", grace_period_seconds=0)
    assert store.pods_on_node("n9") == []


def test_a_write_that_cannot_be_stored_changes_nothing(store: Store) -> None:
    store.create("pods", pod("a", "n1"))
    rv = store.resource_version
    # A value orjson cannot serialize fails while the new version is built, past every check.
    with pytest.raises(TypeError):
        store.mutate("pods", "a", lambda p: p["status"].update(unserializable={1, 2}), subresource="status")
    assert [p["metadata"]["name"] for p in store.pods_on_node("n1")] == ["a"]
    assert store.resource_version == rv and store.get("pods", "a")["metadata"]["resourceVersion"] == str(rv)


def test_wrong_json_types_are_refused_before_anything_reads_them(store: Store) -> None:
    store.create("pods", pod("a", "n1"))
    with pytest.raises(BadRequest, match="cannot be handled as a Pod"):
        store.patch("pods", "a", {"status": "x"}, subresource="status")
    with pytest.raises(BadRequest, match=r"requests\[cpu\]: quantities must match"):
        store.create(
            "pods",
            {
                **pod("b"),
                "spec": {
                    "containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "1x"}}}]
                },
            },
        )
    with pytest.raises(Invalid) as err:
        store.create(
            "pods",
            {
                **pod("b"),
                "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"cpu": -1}}}]},
            },
        )
    assert err.value.causes[0]["field"] == "spec.containers[0].resources.limits[cpu]"
    assert [p["metadata"]["name"] for p in store.pods_on_node("n1")] == ["a"]


def test_limit_and_continue_walk_every_item_once(store: Store) -> None:
    for i in range(7):
        store.create("nodes", node(f"n{i}"))
    seen, token = [], None
    while True:
        page = store.list("nodes", limit=3, continue_token=token)
        seen += [n["metadata"]["name"] for n in page.items]
        token = page.continue_token
        if token is None:
            break
        assert page.remaining_item_count == 7 - len(seen)
    assert seen == [f"n{i}" for i in range(7)]


def test_finalizers_keep_a_deleted_object_until_removed(store: Store) -> None:
    store.create(
        "nodes", {**node("n1"), "metadata": {"name": "n1", "finalizers": ["karpenter.sh/termination"]}}
    )
    terminating = store.delete("nodes", "n1")
    assert terminating["metadata"]["deletionTimestamp"]
    assert store.get("nodes", "n1")["metadata"]["deletionTimestamp"]
    with pytest.raises(Invalid, match="no new finalizers"):
        store.patch("nodes", "n1", {"metadata": {"finalizers": ["karpenter.sh/termination", "other"]}})
    store.patch("nodes", "n1", {"metadata": {"finalizers": None}})
    with pytest.raises(NotFound):
        store.get("nodes", "n1")


def test_delete_preconditions(store: Store) -> None:
    created = store.create("nodes", node("n1"))
    with pytest.raises(Conflict, match="UID in precondition"):
        store.delete("nodes", "n1", preconditions={"uid": "other"})
    with pytest.raises(Conflict, match="ResourceVersion in precondition"):
        store.delete("nodes", "n1", preconditions={"resourceVersion": "1"})
    store.delete("nodes", "n1", preconditions={"uid": created["metadata"]["uid"]})
    with pytest.raises(NotFound):
        store.get("nodes", "n1")


def test_pod_on_a_node_terminates_for_its_scaled_grace_period() -> None:
    store = Store(TimeScale(0.01))  # 30 s grace -> 0.3 s
    store.create("pods", pod("a", "n1"))
    store.create("pods", pod("b", None))
    terminating = store.delete("pods", "a")
    assert terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    assert store.get("pods", "a")["metadata"]["deletionTimestamp"]
    store.delete("pods", "b")  # unscheduled: gone at once
    with pytest.raises(NotFound):
        store.get("pods", "b")
    time.sleep(0.35)
    with pytest.raises(NotFound):
        store.get("pods", "a")


def test_second_delete_with_zero_grace_is_immediate() -> None:
    store = Store(TimeScale(1))
    store.create("pods", pod("a", "n1"))
    store.delete("pods", "a")
    store.delete("pods", "a", grace_period_seconds=0)
    with pytest.raises(NotFound):
        store.get("pods", "a")


def test_garbage_collection_background_orphan_foreground(store: Store) -> None:
    def rs(name: str) -> dict:
        template = {"metadata": {"labels": {"app": name}}, "spec": pod("x")["spec"]}
        spec = {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template}
        return store.create("replicasets", {"metadata": {"name": name}, "spec": spec})

    def owned(name: str, owner: dict) -> None:
        ref = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
        }
        store.create("pods", pod(name, None, ownerReferences=[ref]))

    owned("a1", rs("a"))
    owned("b1", rs("b"))
    owned("c1", rs("c"))
    store.delete("replicasets", "a")
    assert store.count("pods") == 2
    store.delete("replicasets", "b", propagation_policy="Orphan")
    assert store.get("pods", "b1")["metadata"].get("ownerReferences") is None
    with pytest.raises(NotFound):
        store.get("replicasets", "b")
    store.delete("replicasets", "c", propagation_policy="Foreground")
    with pytest.raises(NotFound):
        store.get("pods", "c1")
    with pytest.raises(NotFound):
        store.get("replicasets", "c")


def test_namespace_deletion_removes_content(store: Store) -> None:
    store.create("namespaces", {"metadata": {"name": "team"}})
    store.create("pods", pod("a", None), "team")
    store.delete("namespaces", "team")
    assert store.count("pods") == 0
    with pytest.raises(NotFound):
        store.get("namespaces", "team")


def test_terminating_namespace_refuses_new_content(store: Store) -> None:
    store.create("namespaces", {"metadata": {"name": "team"}})
    store.create("pods", {**pod("a", None), "metadata": {"name": "a", "finalizers": ["hold"]}}, "team")
    store.delete("namespaces", "team")
    assert store.get("namespaces", "team")["status"]["phase"] == "Terminating"
    with pytest.raises(Forbidden):
        store.create("pods", pod("b", None), "team")


def test_dump_and_load_round_trip(store: Store) -> None:
    store.create("nodes", node("n1"))
    dumped = store.dump()
    other = Store(TimeScale(0))
    other.load(dumped)
    assert other.get("nodes", "n1") == store.get("nodes", "n1")
    # Never behind the dump's counter, nor its own: resourceVersions only move forward.
    assert other.resource_version >= store.resource_version


async def test_subscribe_sees_changes_in_order_with_old_object(store: Store) -> None:
    store.create("nodes", node("n0"))
    sub = store.subscribe("nodes")
    store.create("nodes", node("n1"))
    store.patch("nodes", "n1", {"metadata": {"labels": {"x": "y"}}})
    store.create("pods", pod("p", None))  # another resource: not delivered
    store.delete("nodes", "n1")
    events = [await sub.get(1) for _ in range(3)]
    assert [(e.type, e.name) for e in events] == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]
    assert (
        events[1].object["metadata"]["labels"] == {"x": "y"}
        and events[1].old_object["metadata"]["labels"] == {}
    )
    assert await sub.get(0.01) is None
    sub.close()


async def test_subscribe_resume_and_initial_state(store: Store) -> None:
    store.create("nodes", node("n1"))
    mark = store.resource_version
    store.create("nodes", node("n2"))
    with store.subscribe("nodes", since=mark) as resumed:
        assert [e.name for e in resumed.pending()] == ["n2"]
    with store.subscribe("nodes", initial=True, label_selector="x!=y") as initial:
        assert [(e.type, e.name) for e in initial.pending()] == [("ADDED", "n1"), ("ADDED", "n2")]


async def test_resume_past_window_is_gone() -> None:
    store = Store(TimeScale(0), watch_window=5)
    for i in range(10):
        store.create("nodes", node(f"n{i}"))
    with pytest.raises(Gone, match="too old resource version"):
        store.subscribe("nodes", since=2)


async def test_reset_and_load_move_forward_and_end_watches(store: Store) -> None:
    store.create("nodes", node("n1"))
    before = store.resource_version
    dump = store.dump()
    open_watch = store.subscribe("nodes")
    store.reset()
    assert store.resource_version > before
    assert await open_watch.get(1) is None and isinstance(open_watch.error, Gone)
    with pytest.raises(Gone):  # nothing listed before the reset can be resumed
        store.subscribe("nodes", since=before)
    after_reset = store.resource_version
    with store.subscribe("nodes", since=after_reset) as resumed:
        store.load(dump)
        assert resumed.closed and isinstance(resumed.error, Gone)
    assert store.resource_version > after_reset
    with pytest.raises(Gone):
        store.subscribe("nodes", since=after_reset)
    with store.subscribe("nodes", since=store.resource_version) as fresh:
        store.patch("nodes", "n1", {"metadata": {"labels": {"a": "b"}}})
        assert [(e.type, e.name) for e in fresh.pending()] == [("MODIFIED", "n1")]


async def test_subscription_from_another_thread() -> None:
    store = Store(TimeScale(0))
    sub = store.subscribe("nodes")
    await asyncio.to_thread(store.create, "nodes", node("n1"))
    event = await sub.get(1)
    assert event is not None and event.name == "n1"


def test_listener_runs_inside_each_write(store: Store) -> None:
    seen: list[tuple[str, str]] = []
    remove = store.add_listener(lambda e: seen.append((e.type, e.name)))
    store.create("nodes", node("n1"))
    remove()
    store.create("nodes", node("n2"))
    assert seen == [("ADDED", "n1")]


def test_mutate_is_an_atomic_read_modify_write(store: Store) -> None:
    store.create("nodes", node("n1"))
    out = store.mutate("nodes", "n1", lambda n: n["spec"].update(unschedulable=True))
    assert out["spec"]["unschedulable"] is True
