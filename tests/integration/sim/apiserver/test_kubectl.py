"""The real kubectl (v1.32) against the emulator: an independent client speaking the real protocol."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable

import pytest

from sim.apiserver import EmulatorServer

from . import builders as b

KUBECTL = shutil.which("kubectl")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        KUBECTL is None, reason="kubectl is not on PATH; these tests need the real kubectl v1.32"
    ),
]


def seed_workload(emu: EmulatorServer, node_name: str = "n1") -> None:
    emu.store.create("nodes", b.node(node_name, labels={"node-role.kubernetes.io/worker": ""}))
    rs = emu.store.create("replicasets", b.replicaset("web", replicas=2))
    for i in range(2):
        pod = {**b.pod(f"web-{i}", node_name, owner=rs, grace=5), "status": b.RUNNING_READY}
        pod["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
        emu.store.create("pods", pod, keep_status=True)
    ds = emu.store.create(
        "daemonsets",
        {
            "metadata": {"name": "agent", "namespace": "kube-system"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {
                    "metadata": {"labels": {"app": "agent"}},
                    "spec": {"containers": [{"name": "a", "image": "a"}]},
                },
            },
        },
    )
    agent = {
        **b.pod("agent-x", node_name, app="agent", owner=ds, namespace="kube-system"),
        "status": b.RUNNING_READY,
    }
    emu.store.create("pods", agent, keep_status=True)
    emu.store.create("pods", b.pod("elsewhere", "n2"))


def test_get_nodes_wide_and_pods_by_node(
    emu: EmulatorServer, kubectl: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    seed_workload(emu)
    out = kubectl("get", "nodes", "-o", "wide").stdout.splitlines()
    assert out[0].split()[:6] == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP"]
    assert out[1].split()[:3] == ["n1", "Ready", "worker"] and "10.0.0.1" in out[1]
    pods = kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=n1", "-o", "name").stdout.split()
    assert sorted(pods) == ["pod/agent-x", "pod/web-0", "pod/web-1"]
    table = kubectl("get", "pods", "-A", "--field-selector", "spec.nodeName=n1").stdout
    assert "kube-system" in table and "Running" in table and "elsewhere" not in table


def test_cordon_taint_label(
    emu: EmulatorServer, kubectl: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    emu.store.create("nodes", {**b.node("n1"), "spec": {"taints": [{"key": "old", "effect": "NoSchedule"}]}})
    kubectl("cordon", "n1")
    kubectl("taint", "nodes", "n1", "karpenter.sh/disrupted=:NoSchedule")
    kubectl("label", "nodes", "n1", "team=a")
    node = emu.store.get("nodes", "n1")
    assert node["spec"]["unschedulable"] is True
    assert {(t["key"], t["effect"]) for t in node["spec"]["taints"]} == {
        ("old", "NoSchedule"),
        ("karpenter.sh/disrupted", "NoSchedule"),
    }
    assert node["metadata"]["labels"]["team"] == "a"
    kubectl("taint", "nodes", "n1", "old:NoSchedule-")
    assert [t["key"] for t in emu.store.get("nodes", "n1")["spec"]["taints"]] == ["karpenter.sh/disrupted"]
    assert "SchedulingDisabled" in kubectl("get", "node", "n1").stdout
    kubectl("uncordon", "n1")
    assert not emu.store.get("nodes", "n1")["spec"].get("unschedulable")


def test_drain_waits_for_the_pdb_then_completes(
    emu: EmulatorServer, kubectl: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    # Slow: kubectl retries a refused eviction every 5 s, fixed in its code.
    seed_workload(emu)
    emu.store.create("poddisruptionbudgets", b.pdb("web", minAvailable=2))
    drain = subprocess.Popen(
        [KUBECTL, "drain", "n1", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"],
        env=kubectl.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,  # type: ignore[attr-defined]
    )
    try:
        deadline = time.monotonic() + 20
        while not emu.requests.query(resource="pods/eviction", status=429) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert emu.requests.query(resource="pods/eviction", status=429), "drain never hit the PDB"
        assert drain.poll() is None and emu.store.count("pods", "default") == 3  # blocked, nothing evicted
        # The budget opens (as if replacements became ready elsewhere): the retry goes through.
        emu.store.patch("poddisruptionbudgets", "web", {"spec": {"minAvailable": 0}}, "default")
        output, _ = drain.communicate(timeout=30)
    finally:
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 0, output
    assert "node/n1 drained" in output and "Cannot evict pod" in output
    assert emu.store.get("nodes", "n1")["spec"]["unschedulable"] is True
    assert [p["metadata"]["name"] for p in emu.store.pods_on_node("n1")] == ["agent-x"]  # DaemonSet pods stay
    assert emu.store.count("pods", "default") == 1  # only the pod on n2


def test_delete_node_waits_for_its_finalizer(
    emu: EmulatorServer, kubectl: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    emu.store.create(
        "nodes", {**b.node("n1"), "metadata": {"name": "n1", "finalizers": ["karpenter.sh/termination"]}}
    )
    delete = subprocess.Popen(
        [KUBECTL, "delete", "node", "n1", "--timeout=30s"],
        env=kubectl.env,  # type: ignore[attr-defined]
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while (
            not emu.store.get("nodes", "n1")["metadata"].get("deletionTimestamp")
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert emu.store.get("nodes", "n1")["metadata"]["deletionTimestamp"]
        time.sleep(0.3)
        assert delete.poll() is None  # kubectl waits: the node is Terminating, held by the finalizer
        emu.store.patch("nodes", "n1", {"metadata": {"finalizers": None}})
        output, _ = delete.communicate(timeout=20)
    finally:
        if delete.poll() is None:
            delete.kill()
    assert delete.returncode == 0 and 'node "n1" deleted' in output
    assert kubectl("get", "nodes", "-o", "name").stdout.strip() == ""
