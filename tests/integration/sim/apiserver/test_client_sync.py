"""The official `kubernetes` client (sync) against the emulator over HTTP: every object semantic."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client, watch

from sim.apiserver import EmulatorServer

from . import builders as b
from .helpers import http, owned_pods, status_of

pytestmark = pytest.mark.integration


def running(core: client.CoreV1Api, name: str, status: dict | None = None, ns: str = "default") -> None:
    core.patch_namespaced_pod_status(name, ns, {"status": status or b.RUNNING_READY})


# --- create / read / errors --------------------------------------------------------------------------


def test_create_get_list_and_typed_errors(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    created = core.create_node(b.node("n1"))
    assert created.metadata.uid and created.metadata.creation_timestamp
    got = core.read_node("n1")
    assert got.metadata.resource_version == created.metadata.resource_version
    listed = core.list_node()
    assert listed.kind == "NodeList" and int(listed.metadata.resource_version) >= int(
        got.metadata.resource_version
    )
    assert [n.metadata.name for n in listed.items] == ["n1"]

    with pytest.raises(client.ApiException) as err:
        core.create_node(b.node("n1"))
    assert err.value.status == 409 and status_of(err.value)["reason"] == "AlreadyExists"
    with pytest.raises(client.ApiException) as err:
        core.read_node("missing")
    assert err.value.status == 404 and status_of(err.value)["reason"] == "NotFound"
    with pytest.raises(client.ApiException) as err:
        core.create_node(b.node("Bad_Name"))
    assert err.value.status == 422 and status_of(err.value)["reason"] == "Invalid"


def test_create_answers_201_and_generate_name(emu: EmulatorServer) -> None:
    code, body = http(
        emu,
        "POST",
        "/api/v1/namespaces/default/pods",
        {**b.pod("", None), "metadata": {"generateName": "web-"}},
    )
    assert code == 201 and body["metadata"]["name"].startswith("web-")


def test_bad_bodies_are_client_errors_not_crashes(emu: EmulatorServer) -> None:
    code, body = http(emu, "POST", "/api/v1/nodes", b"{not json")
    assert (code, body["reason"]) == (400, "BadRequest")
    code, body = http(emu, "POST", "/api/v1/nodes", b.pod("p", None))  # a Pod sent to nodes
    assert (code, body["reason"]) == (400, "BadRequest")
    code, body = http(emu, "POST", "/api/v1/nodes", b"[1, 2]")
    assert code == 400
    code, body = http(
        emu, "POST", "/api/v1/nodes", b"\x0a\x02", **{"Content-Type": "application/vnd.kubernetes.protobuf"}
    )
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    emu.store.create("nodes", b.node("n1"))
    code, body = http(
        emu, "PATCH", "/api/v1/nodes/n1", b"{}", **{"Content-Type": "application/apply-patch+yaml"}
    )
    assert (code, body["reason"]) == (415, "UnsupportedMediaType")
    code, body = http(emu, "PUT", "/api/v1/nodes", b.node("n1"))
    assert (code, body["reason"]) == (405, "MethodNotAllowed")
    code, body = http(emu, "GET", "/apis/nope.io/v1/things")
    assert code == 404
    assert all(r.status < 500 for r in emu.requests.query())


def _pod_requesting(**requests: Any) -> dict[str, Any]:
    pod = b.pod("p2", None)
    pod["spec"]["containers"][0]["resources"] = {"requests": requests}
    return pod


_PODS = "/api/v1/namespaces/default/pods"
_MERGE = {"Content-Type": "application/merge-patch+json"}

# Bodies that are JSON but not the Go types: kube-apiserver's decoder answers 400 BadRequest (a
# CRD's OpenAPI schema, 422), its validation 422 Invalid naming the field. Never a 500.
MALFORMED = {
    "node spec string": ("POST", "/api/v1/nodes", {"metadata": {"name": "n2"}, "spec": "x"}, {}, 400, "spec"),
    "node name number": ("POST", "/api/v1/nodes", {"metadata": {"name": 123}}, {}, 400, "metadata.name"),
    "labels list": (
        "POST",
        "/api/v1/nodes",
        {"metadata": {"name": "n2", "labels": ["a"]}},
        {},
        400,
        "labels",
    ),
    "pod spec string": ("POST", _PODS, {"metadata": {"name": "p2"}, "spec": "x"}, {}, 400, "spec"),
    "pdb selector string": (
        "POST",
        "/apis/policy/v1/namespaces/default/poddisruptionbudgets",
        {"metadata": {"name": "pdb"}, "spec": {"selector": "x"}},
        {},
        400,
        "spec.selector",
    ),
    "merge patch spec string": ("PATCH", "/api/v1/nodes/n1", {"spec": "x"}, _MERGE, 400, "spec"),
    "status patch string": ("PATCH", f"{_PODS}/p/status", {"status": "x"}, _MERGE, 400, "status"),
    "unparseable request": (
        "POST",
        _PODS,
        _pod_requesting(cpu="lots"),
        {},
        400,
        "spec.containers[0].resources.requests[cpu]: quantities must match",
    ),
    "negative request": (
        "POST",
        _PODS,
        _pod_requesting(memory="-1Gi"),
        {},
        422,
        "spec.containers[0].resources.requests[memory]",
    ),
    "negative capacity": (
        "POST",
        "/api/v1/nodes",
        {**b.node("n2"), "status": {"capacity": {"cpu": "-2"}}},
        {},
        422,
        "status.capacity[cpu]",
    ),
    "custom resource spec string": (
        "POST",
        "/apis/karpenter.sh/v1/nodepools",
        {"metadata": {"name": "np"}, "spec": "x"},
        {},
        422,
        "spec",
    ),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_bodies_are_400_or_422(emu: EmulatorServer, case: tuple) -> None:
    method, path, body, headers, code, where = case
    emu.store.create("nodes", b.node("n1"))
    emu.store.create("pods", b.pod("p", "n1"))
    got, status = http(emu, method, path, body, **headers)
    assert (got, status["kind"]) == (code, "Status"), status
    if code == 422:
        assert status["reason"] == "Invalid" and where in status["details"]["causes"][0]["field"]
    else:
        assert status["reason"] == "BadRequest" and where in status["message"]
    assert all(r.status < 500 for r in emu.requests.query())


def test_a_refused_status_patch_leaves_the_pod_on_its_node(
    emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    before = core.create_namespaced_pod("default", b.pod("p", "n1"))
    with pytest.raises(client.ApiException) as err:
        core.patch_namespaced_pod_status("p", "default", {"status": "x"})
    assert err.value.status == 400
    # The by-node index answers both: the failed write must not have dropped the pod from it.
    assert [p["metadata"]["name"] for p in emu.store.pods_on_node("n1")] == ["p"]
    on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items
    assert [p.metadata.name for p in on_n1] == ["p"]
    assert (
        core.read_namespaced_pod("p", "default").metadata.resource_version == before.metadata.resource_version
    )


def test_stale_resource_version_conflicts(core: client.CoreV1Api) -> None:
    node = core.create_node(b.node("n1"))
    node.metadata.labels["a"] = "1"
    core.replace_node("n1", node)
    node.metadata.labels["a"] = "2"
    with pytest.raises(client.ApiException) as err:
        core.replace_node("n1", node)
    assert err.value.status == 409 and status_of(err.value)["reason"] == "Conflict"


def test_status_subresource_is_isolated(core: client.CoreV1Api) -> None:
    core.create_node(b.node("n1"))
    node = core.read_node("n1")
    node.spec.unschedulable = True
    node.status.conditions[0].status = "False"
    updated = core.replace_node("n1", node)
    assert updated.spec.unschedulable is True and updated.status.conditions[0].status == "True"
    updated.status.conditions[0].status = "False"
    updated.spec.unschedulable = False
    via_status = core.replace_node_status("n1", updated)
    assert via_status.status.conditions[0].status == "False" and via_status.spec.unschedulable is True


def test_limit_and_continue(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    for i in range(5):
        emu.store.create("pods", b.pod(f"p{i}", None))
    names, token, pages = [], None, 0
    while True:
        page = core.list_pod_for_all_namespaces(limit=2, _continue=token)
        pages += 1
        names += [p.metadata.name for p in page.items]
        token = page.metadata.var_continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 5 - len(names)
    assert names == [f"p{i}" for i in range(5)] and pages == 3


# --- selectors -----------------------------------------------------------------------------------------


def test_label_and_field_selectors(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.create(
        "pods", {**b.pod("a", "n1", app="web"), "metadata": {"name": "a", "labels": {"app": "web", "t": "x"}}}
    )
    emu.store.create("pods", b.pod("b", "n2", app="web"))
    emu.store.create("pods", b.pod("c", None, app="db"))
    emu.store.patch("pods", "b", {"status": {"phase": "Running"}}, "default", subresource="status")

    def names(**kw: Any) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod("default", **kw).items]

    assert names(label_selector="app=web") == ["a", "b"]
    assert names(label_selector="app==web,t") == ["a"]
    assert names(label_selector="app!=web") == ["c"]
    assert names(label_selector="app in (db,cache)") == ["c"]
    assert names(label_selector="app notin (db),!t") == ["b"]
    assert names(field_selector="spec.nodeName=n1") == ["a"]
    assert names(field_selector="status.phase=Running") == ["b"]
    assert names(field_selector="metadata.name=c,metadata.namespace=default") == ["c"]
    assert [
        p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n2").items
    ] == ["b"]
    emu.store.create("nodes", b.node("n1"))
    emu.store.create("nodes", b.node("n2", unschedulable=True))
    assert [n.metadata.name for n in core.list_node(field_selector="spec.unschedulable=true").items] == ["n2"]
    with pytest.raises(client.ApiException) as err:
        core.list_namespaced_pod("default", field_selector="spec.hostname=x")
    assert err.value.status == 400
    with pytest.raises(client.ApiException) as err:
        core.list_namespaced_pod("default", label_selector="app in (")
    assert err.value.status == 400


# --- patching ------------------------------------------------------------------------------------------


def test_strategic_merge_patch_follows_the_real_types(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    core.create_node(
        {
            **b.node("n1"),
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
            "metadata": {"name": "n1", "finalizers": ["one"], "labels": {"keep": "me", "drop": "me"}},
        }
    )
    # The client sends dict patches as strategic merge, as kubectl does.
    patched = core.patch_node(
        "n1",
        {
            "metadata": {"finalizers": ["two"], "labels": {"drop": None}},
            "spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
        },
    )
    assert [t.key for t in patched.spec.taints] == ["b"]  # no patch strategy: replaced whole
    assert patched.metadata.finalizers == ["one", "two"]  # merged as a set
    assert patched.metadata.labels == {"keep": "me"}  # null deleted the key
    status = core.patch_node_status(
        "n1", {"status": {"conditions": [{"type": "DiskPressure", "status": "False"}]}}
    )
    assert sorted(c.type for c in status.status.conditions) == ["DiskPressure", "Ready"]  # merged by type

    rs = emu.store.create("replicasets", b.replicaset("web"))
    other = emu.store.create("replicasets", b.replicaset("other"))
    pod = b.pod("p", None, owner=rs)
    pod["spec"]["containers"].append({"name": "side", "image": "busybox"})
    core.create_namespaced_pod("default", pod)
    ref = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other", "uid": other["metadata"]["uid"]}
    patched_pod = core.patch_namespaced_pod(
        "p",
        "default",
        {
            "metadata": {"ownerReferences": [ref]},
            "spec": {"containers": [{"name": "c", "image": "nginx:2"}]},
        },
    )
    assert [(c.name, c.image) for c in patched_pod.spec.containers] == [("c", "nginx:2"), ("side", "busybox")]
    assert [o.name for o in patched_pod.metadata.owner_references] == ["web", "other"]  # merged by uid


def test_strategic_patch_cannot_shrink_tolerations_like_real_pods(
    emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    pod = b.pod("p", None)
    pod["spec"]["tolerations"] = [{"key": "x", "operator": "Exists"}]
    core.create_namespaced_pod("default", pod)
    with pytest.raises(client.ApiException) as err:  # replaced whole, so "x" would be removed: forbidden
        core.patch_namespaced_pod(
            "p", "default", {"spec": {"tolerations": [{"key": "y", "operator": "Exists"}]}}
        )
    assert err.value.status == 422


def test_merge_and_json_patch(emu: EmulatorServer, core: client.CoreV1Api, api: client.ApiClient) -> None:
    core.create_node({**b.node("n1"), "metadata": {"name": "n1", "finalizers": ["one"]}})
    code, body = http(
        emu,
        "PATCH",
        "/api/v1/nodes/n1",
        {"metadata": {"finalizers": ["two"]}},
        **{"Content-Type": "application/merge-patch+json"},
    )
    assert code == 200 and body["metadata"]["finalizers"] == ["two"]  # merge patch replaces lists
    patched = core.patch_node("n1", [{"op": "add", "path": "/metadata/labels", "value": {"x": "y"}}])
    assert patched.metadata.labels["x"] == "y"
    with pytest.raises(client.ApiException) as err:
        core.patch_node("n1", [{"op": "test", "path": "/metadata/labels/x", "value": "z"}])
    assert err.value.status == 422


def test_patch_with_stale_resource_version_conflicts(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    created = core.create_node(b.node("n1"))
    core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(client.ApiException) as err:
        core.patch_node(
            "n1", {"metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"a": "2"}}}
        )
    assert err.value.status == 409


# --- deletion ------------------------------------------------------------------------------------------


def test_finalizers_hold_deletion(core: client.CoreV1Api) -> None:
    core.create_node({**b.node("n1"), "metadata": {"name": "n1", "finalizers": ["karpenter.sh/termination"]}})
    core.delete_node("n1")
    node = core.read_node("n1")
    assert node.metadata.deletion_timestamp is not None
    core.patch_node("n1", [{"op": "remove", "path": "/metadata/finalizers"}])
    with pytest.raises(client.ApiException) as err:
        core.read_node("n1")
    assert err.value.status == 404


def test_delete_preconditions(core: client.CoreV1Api) -> None:
    node = core.create_node(b.node("n1"))
    with pytest.raises(client.ApiException) as err:
        core.delete_node("n1", body={"preconditions": {"uid": "not-the-uid"}})
    assert err.value.status == 409
    with pytest.raises(client.ApiException) as err:
        core.delete_node("n1", body={"preconditions": {"resourceVersion": "1"}})
    assert err.value.status == 409
    core.delete_node("n1", body={"preconditions": {"uid": node.metadata.uid}})
    assert core.list_node().items == []


def test_graceful_pod_deletion(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.timescale.factor = 0.02  # 10 s grace -> 0.2 s
    core.create_namespaced_pod("default", b.pod("on-node", "n1", grace=10))
    core.create_namespaced_pod("default", b.pod("unscheduled", None, grace=10))
    core.create_namespaced_pod("default", b.pod("now", "n1", grace=10))
    terminating = core.delete_namespaced_pod("on-node", "default")
    assert (
        terminating.metadata.deletion_timestamp is not None
        and terminating.metadata.deletion_grace_period_seconds == 10
    )
    assert core.read_namespaced_pod("on-node", "default").metadata.deletion_timestamp is not None
    core.delete_namespaced_pod("unscheduled", "default")
    core.delete_namespaced_pod("now", "default", grace_period_seconds=0)
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["on-node"]
    deadline = time.monotonic() + 5
    while core.list_namespaced_pod("default").items and time.monotonic() < deadline:
        time.sleep(0.05)
    assert core.list_namespaced_pod("default").items == []


def test_propagation_policies(emu: EmulatorServer, apps: client.AppsV1Api, core: client.CoreV1Api) -> None:
    emu.store.timescale.factor = 0
    owned_pods(emu, "bg", 2)
    owned_pods(emu, "orphan", 1)
    apps.delete_namespaced_replica_set("bg", "default")
    apps.delete_namespaced_replica_set("orphan", "default", propagation_policy="Orphan")
    pods = core.list_namespaced_pod("default").items
    assert [p.metadata.name for p in pods] == ["orphan-0"] and pods[0].metadata.owner_references is None


# --- eviction ------------------------------------------------------------------------------------------


def evict(core: client.CoreV1Api, name: str, **options: Any) -> None:
    core.create_namespaced_pod_eviction(name, "default", b.eviction(name, **options))


def test_eviction_without_pdb_deletes_the_pod(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.timescale.factor = 0
    owned_pods(emu, "web", 1)
    code, body = http(emu, "POST", "/api/v1/namespaces/default/pods/web-0/eviction", b.eviction("web-0"))
    assert code == 201 and body["status"] == "Success"
    assert core.list_namespaced_pod("default").items == []
    with pytest.raises(client.ApiException) as err:
        evict(core, "web-0")
    assert err.value.status == 404


def test_eviction_respects_the_budget_at_once(
    emu: EmulatorServer, core: client.CoreV1Api, policy: client.PolicyV1Api
) -> None:
    emu.store.timescale.factor = 1  # evicted pods stay Terminating: the budget must still hold
    owned_pods(emu, "web", 3)
    policy.create_namespaced_pod_disruption_budget("default", b.pdb("web", minAvailable=2))
    evict(core, "web-0")
    with pytest.raises(client.ApiException) as err:
        evict(core, "web-1")  # two quick evictions cannot both pass a budget of 1
    assert err.value.status == 429
    status = status_of(err.value)
    assert status["reason"] == "TooManyRequests"
    assert status["details"]["causes"][0]["reason"] == "DisruptionBudget"
    assert "needs 2 healthy pods and has 2 currently" in status["details"]["causes"][0]["message"]
    pdb = policy.read_namespaced_pod_disruption_budget("web", "default")
    # web-0 is terminating now, so it is neither healthy nor kept in disruptedPods any more.
    assert (pdb.status.disruptions_allowed, pdb.status.current_healthy, pdb.status.desired_healthy) == (
        0,
        2,
        2,
    )
    terminating = core.read_namespaced_pod("web-0", "default")
    assert terminating.metadata.deletion_timestamp is not None
    assert any(c.type == "DisruptionTarget" for c in terminating.status.conditions)
    evict(core, "web-0")  # already terminating: success without budget


def test_eviction_with_two_pdbs_is_a_500(
    emu: EmulatorServer, core: client.CoreV1Api, policy: client.PolicyV1Api
) -> None:
    owned_pods(emu, "web", 2)
    policy.create_namespaced_pod_disruption_budget("default", b.pdb("one", maxUnavailable=1))
    policy.create_namespaced_pod_disruption_budget("default", b.pdb("two", maxUnavailable=1))
    with pytest.raises(client.ApiException) as err:
        evict(core, "web-0")
    assert err.value.status == 500 and "more than one PodDisruptionBudget" in status_of(err.value)["message"]


def test_eviction_uid_precondition(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    owned_pods(emu, "web", 1)
    with pytest.raises(client.ApiException) as err:
        evict(core, "web-0", preconditions={"uid": "someone-else"})
    assert err.value.status == 409
    uid = core.read_namespaced_pod("web-0", "default").metadata.uid
    evict(core, "web-0", preconditions={"uid": uid})


def test_unhealthy_pod_eviction_policies(
    emu: EmulatorServer, core: client.CoreV1Api, policy: client.PolicyV1Api
) -> None:
    emu.store.timescale.factor = 1
    owned_pods(emu, "web", 3, ready=2)  # web-2 is Running but not Ready
    policy.create_namespaced_pod_disruption_budget("default", b.pdb("web", minAvailable=2))
    evict(core, "web-2")  # IfHealthyBudget: 2 healthy >= 2 desired, so the unready pod may go
    owned_pods(emu, "api", 2, ready=1)
    policy.create_namespaced_pod_disruption_budget("default", b.pdb("api", app="api", minAvailable=2))
    with pytest.raises(client.ApiException) as err:
        evict(core, "api-1")  # IfHealthyBudget: 1 healthy < 2 desired
    assert err.value.status == 429
    policy.patch_namespaced_pod_disruption_budget(
        "api", "default", {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}
    )
    evict(core, "api-1")


def test_max_unavailable_percent_rounds_up(
    emu: EmulatorServer, core: client.CoreV1Api, policy: client.PolicyV1Api
) -> None:
    emu.store.timescale.factor = 1
    owned_pods(emu, "web", 3)
    policy.create_namespaced_pod_disruption_budget(
        "default", b.pdb("web", maxUnavailable="34%")
    )  # ceil(1.02) = 2
    evict(core, "web-0")
    evict(core, "web-1")
    with pytest.raises(client.ApiException) as err:
        evict(core, "web-2")
    assert err.value.status == 429


# --- watch ---------------------------------------------------------------------------------------------


def test_watch_streams_changes_and_resumes(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.create("nodes", b.node("n0"))
    start = core.list_node().metadata.resource_version
    emu.store.create("nodes", b.node("n1"))
    emu.store.patch("nodes", "n1", {"spec": {"unschedulable": True}})
    emu.store.delete("nodes", "n1")
    w = watch.Watch()
    events = [
        (e["type"], e["object"].metadata.name)
        for e in w.stream(core.list_node, resource_version=start, timeout_seconds=1)
    ]
    assert events == [("ADDED", "n1"), ("MODIFIED", "n1"), ("DELETED", "n1")]
    # Without a resourceVersion a watch starts with the current state.
    initial = [
        (e["type"], e["object"].metadata.name)
        for e in watch.Watch().stream(core.list_node, timeout_seconds=1)
    ]
    assert initial == [("ADDED", "n0")]


def test_watch_past_the_window_is_410(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.watch_window = 3
    for i in range(6):
        emu.store.create("nodes", b.node(f"n{i}"))
    with pytest.raises(client.ApiException) as err:
        list(watch.Watch().stream(core.list_node, resource_version="1", timeout_seconds=1))
    assert err.value.status == 410


def test_selected_watches_see_objects_enter_and_leave(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.create("nodes", b.node("n1", labels={"x": "1"}))
    emu.store.create("nodes", b.node("n2"))
    emu.store.create("pods", {**b.pod("p", "n1"), "status": b.RUNNING_READY}, keep_status=True)
    start = core.list_node().metadata.resource_version
    emu.store.patch("nodes", "n1", {"metadata": {"labels": {"x": "2"}}})  # leaves x=1
    emu.store.patch("nodes", "n2", {"metadata": {"labels": {"x": "1"}}})  # enters
    emu.store.patch("nodes", "n2", {"metadata": {"labels": {"y": "1"}}})  # stays in
    emu.store.patch("pods", "p", {"status": {"phase": "Succeeded"}}, "default", subresource="status")
    nodes = [
        (e["type"], e["object"].metadata.name, e["object"].metadata.labels.get("x"))
        for e in watch.Watch().stream(
            core.list_node, label_selector="x=1", resource_version=start, timeout_seconds=1
        )
    ]
    # Leaving sends the last matching state (x=1), as kube-apiserver's watch cache does.
    assert nodes == [("DELETED", "n1", "1"), ("ADDED", "n2", "1"), ("MODIFIED", "n2", "1")]
    pods = list(
        watch.Watch().stream(
            core.list_namespaced_pod,
            "default",
            field_selector="status.phase=Running",
            resource_version=start,
            timeout_seconds=1,
        )
    )
    assert [(e["type"], e["object"].status.phase) for e in pods] == [("DELETED", "Running")]
    assert int(pods[0]["object"].metadata.resource_version) > int(start)  # the change's version


def test_reset_and_load_never_move_resource_versions_back(
    emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    emu.store.create("nodes", b.node("n1"))
    listed = core.list_node().metadata.resource_version
    _, state = http(emu, "GET", "/sim/state")
    _, reset = http(emu, "POST", "/sim/reset", b"{}")
    assert int(reset["resourceVersion"]) > int(listed)
    with pytest.raises(client.ApiException) as err:  # what the client listed before is gone
        list(watch.Watch().stream(core.list_node, resource_version=listed, timeout_seconds=1))
    assert err.value.status == 410
    after_reset = core.list_node().metadata.resource_version
    _, loaded = http(emu, "POST", "/sim/state", state)
    assert int(loaded["resourceVersion"]) > int(after_reset)
    with pytest.raises(client.ApiException) as err:
        list(watch.Watch().stream(core.list_node, resource_version=after_reset, timeout_seconds=1))
    assert err.value.status == 410
    assert int(core.create_node(b.node("n2")).metadata.resource_version) > int(loaded["resourceVersion"])


def test_reset_ends_open_watches_with_410(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.create("nodes", b.node("n1"))
    rv = core.list_node().metadata.resource_version
    resp = core.list_node(watch=True, resource_version=rv, timeout_seconds=3, _preload_content=False)
    started = time.monotonic()
    http(emu, "POST", "/sim/reset", b"{}")
    lines = [json.loads(line) for line in resp.data.decode().splitlines()]
    assert [(e["type"], e["object"].get("code")) for e in lines] == [("ERROR", 410)]
    assert time.monotonic() - started < 2  # ended by the reset, not by its timeout


def test_watch_bookmarks_and_single_object(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.store.create("nodes", b.node("n1"))
    emu.store.create("nodes", b.node("n2"))
    rv = core.list_node().metadata.resource_version
    resp = core.list_node(
        watch=True,
        resource_version=rv,
        allow_watch_bookmarks=True,
        timeout_seconds=1,
        field_selector="metadata.name=n2",
        _preload_content=False,
    )
    emu.store.patch("nodes", "n1", {"metadata": {"labels": {"x": "1"}}})
    emu.store.patch("nodes", "n2", {"metadata": {"labels": {"x": "1"}}})
    lines = [json.loads(line) for line in resp.data.decode().splitlines()]
    types = [e["type"] for e in lines]
    assert [e["object"]["metadata"]["name"] for e in lines if e["type"] == "MODIFIED"] == ["n2"]
    assert "BOOKMARK" in types  # interval is 0.2 s in these tests
    bookmark = next(e for e in lines if e["type"] == "BOOKMARK")
    assert bookmark["object"]["kind"] == "Node" and int(
        bookmark["object"]["metadata"]["resourceVersion"]
    ) >= int(rv)


# --- custom resources, discovery, faults ---------------------------------------------------------------


def test_custom_resources_with_status(emu: EmulatorServer, custom: client.CustomObjectsApi) -> None:
    body = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": "c1"},
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [],  # Karpenter's CRD requires them
        },
        "status": {"nodeName": "dropped-on-create"},
    }
    created = custom.create_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", body)
    assert "status" not in created and created["metadata"]["generation"] == 1
    custom.patch_cluster_custom_object_status(
        "karpenter.sh", "v1", "nodeclaims", "c1", {"status": {"nodeName": "n1"}}
    )
    patched = custom.patch_cluster_custom_object(
        "karpenter.sh",
        "v1",
        "nodeclaims",
        "c1",
        {"metadata": {"labels": {"a": "b"}}, "status": {"nodeName": "x"}},
    )
    assert patched["status"] == {"nodeName": "n1"} and patched["metadata"]["labels"] == {"a": "b"}
    code, body = http(
        emu,
        "PATCH",
        "/apis/karpenter.sh/v1/nodeclaims/c1",
        {"metadata": {}},
        **{"Content-Type": "application/strategic-merge-patch+json"},
    )
    assert code == 415
    listed = custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")
    assert listed["kind"] == "NodeClaimList" and [i["metadata"]["name"] for i in listed["items"]] == ["c1"]


def test_discovery_and_health(emu: EmulatorServer, api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().minor == "32"
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {
        "apps",
        "policy",
        "karpenter.sh",
        "karpenter.k8s.aws",
        "coordination.k8s.io",
        "storage.k8s.io",
    } <= groups
    resources = {r.name for r in client.CoreV1Api(api).get_api_resources().resources}
    assert {
        "pods",
        "pods/eviction",
        "pods/status",
        "nodes",
        "nodes/status",
        "namespaces",
        "events",
    } <= resources
    assert http(emu, "GET", "/healthz") == (200, "ok") and http(emu, "GET", "/readyz") == (200, "ok")


def test_fault_injection_and_request_log(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    code, _ = http(
        emu, "POST", "/sim/faults", {"verb": "list", "resource": "pods", "status": 500, "times": 1}
    )
    assert code == 201
    with pytest.raises(client.ApiException) as err:
        core.list_namespaced_pod("default")
    assert err.value.status == 500
    core.list_namespaced_pod("default")  # `times: 1` is spent
    emu.faults.add({"verb": "create", "resource": "pods/eviction", "status": 429})
    emu.faults.add({"verb": "get", "resource": "nodes", "latency_ms": 150})
    emu.store.create("nodes", b.node("n1"))
    with pytest.raises(client.ApiException) as err:
        evict(core, "whatever")
    assert err.value.status == 429
    started = time.monotonic()
    core.read_node("n1")
    assert time.monotonic() - started >= 0.15
    code, log = http(emu, "GET", "/sim/requests?resource=pods&verb=list")
    assert [r["status"] for r in log["items"]] == [500, 200]
    assert log["items"][0]["fault"] is True
    http(emu, "DELETE", "/sim/faults")
    assert emu.faults.rules() == []


def test_watch_disconnect_fault(emu: EmulatorServer, core: client.CoreV1Api) -> None:
    emu.faults.add({"verb": "watch", "resource": "nodes", "watch_disconnect_after_events": 1})
    for i in range(3):
        emu.store.create("nodes", b.node(f"n{i}"))
    resp = core.list_node(watch=True, timeout_seconds=5, _preload_content=False)
    started = time.monotonic()
    lines = resp.data.decode().splitlines()
    assert len(lines) == 1 and time.monotonic() - started < 2


def test_a_410_on_rewatch_comes_as_the_watch_cache_sends_it(
    emu: EmulatorServer, core: client.CoreV1Api
) -> None:
    emu.faults.add({"verb": "watch", "resource": "nodes", "status": 410, "rewatch_only": True})
    emu.store.create("nodes", b.node("n1"))
    version = core.list_node().metadata.resource_version
    # A first watch (no resourceVersion) is not a re-watch: served as usual.
    first = core.list_node(watch=True, timeout_seconds=1, _preload_content=False)
    assert [json.loads(line)["type"] for line in first.data.decode().splitlines()] == ["ADDED"]
    # Resuming from a version: 200 and one ERROR event with the 410 Status, so the client lists again.
    resumed = core.list_node(watch=True, resource_version=version, timeout_seconds=5, _preload_content=False)
    assert resumed.status == 200
    (event,) = [json.loads(line) for line in resumed.data.decode().splitlines()]
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    assert event["object"]["reason"] == "Expired"


def test_sim_state_and_reset(emu: EmulatorServer) -> None:
    emu.store.create("nodes", b.node("n1"))
    code, state = http(emu, "GET", "/sim/state")
    assert code == 200 and [n["metadata"]["name"] for n in state["objects"]["nodes"]] == ["n1"]
    http(emu, "POST", "/sim/reset", b"{}")
    assert emu.store.count("nodes") == 0
    http(emu, "POST", "/sim/state", state)
    assert emu.store.get("nodes", "n1")["metadata"]["uid"] == state["objects"]["nodes"][0]["metadata"]["uid"]
    assert http(emu, "PUT", "/sim/timescale", {"factor": 0.5}) == (200, {"factor": 0.5})
    assert emu.store.timescale.factor == 0.5
