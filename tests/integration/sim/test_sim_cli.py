"""`karpflow sim ...` against a running simulator, over its HTTP endpoints."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client as k8s

from api import constants as k
from planner.snapshot import Snapshot
from sim.cli import sim
from sim.testing import DEMO, kubectl

pytestmark = pytest.mark.integration


def run(stack, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        sim, ["--url", stack.kube_url, *args], catch_exceptions=False, env={"COLUMNS": "200"}
    )
    return result.exit_code, result.output


def test_status_and_a_clean_invariant_report(sim_stack):
    code, out = run(sim_stack, "status")
    assert code == 0 and json.loads(out)["scenario"]["created"]["Node"] == 3
    code, out = run(sim_stack, "invariants")
    assert code == 0 and "No invariant violations" in out
    code, out = run(sim_stack, "invariants", "--json")
    assert code == 0 and json.loads(out)["ok"] is True


# No ReplicaSet controller: a replacement pod must not restore the budget between the deletes.
@pytest.mark.sim_stack(controllers=["nodes", "scheduler", "kubelet", "pdb"])
def test_a_violation_makes_invariants_exit_1(sim_stack):
    core = k8s.CoreV1Api(sim_stack.api_client())
    for pod in core.list_namespaced_pod("shop", label_selector="app=web").items[:2]:
        core.delete_namespaced_pod(pod.metadata.name, "shop")
    code, out = run(sim_stack, "invariants")
    assert code == 1 and "pdb-violation" in out


def test_a_taint_is_not_judged_without_in_flight_nodes(sim_stack):
    node = sim_stack.store.list("nodes").items[0]["metadata"]["name"]
    kubectl(sim_stack, "taint", "node", node, f"{k.DISRUPTED_TAINT_KEY}:NoSchedule")
    code, out = run(sim_stack, "invariants")  # a disruption may own it: say so, record nothing
    assert code == 0 and "stale-disrupted-taint not judged" in out and node in out
    code, out = run(sim_stack, "invariants", "--in-flight", node)
    assert code == 0 and "not judged" not in out


def test_faults_reach_the_simulator(sim_stack):
    code, _ = run(sim_stack, "faults", "ice", "m5.large", "--zone", "us-west-2a", "--capacity-type", "spot")
    assert code == 0 and sim_stack.faults.exhausted("m5.large", "us-west-2a", "spot")
    assert not sim_stack.faults.exhausted("m5.large", "us-west-2b", "spot")
    run(sim_stack, "faults", "throttle", "--probability", "1", "--action", "RunInstances")
    assert sim_stack.faults.should_throttle("RunInstances") and not sim_stack.faults.should_throttle(
        "DescribeInstances"
    )
    run(sim_stack, "faults", "never-ready", "--instance-type", "c5.large")
    assert sim_stack.faults.is_never_ready({"InstanceId": "i-1", "InstanceType": "c5.large"})
    run(sim_stack, "faults", "bad-ami", "ami-0bad")
    run(sim_stack, "faults", "bad-ami", "ami-0crash", "--pods-crash")
    assert sim_stack.faults.is_never_ready({"InstanceId": "i-2", "ImageId": "ami-0bad"})
    assert sim_stack.faults.is_crash_looping({"InstanceId": "i-3", "ImageId": "ami-0crash"})
    assert not sim_stack.faults.is_never_ready({"InstanceId": "i-3", "ImageId": "ami-0crash"})
    run(sim_stack, "faults", "bad-ami", "ami-0crash", "--pods-crash", "--remove")
    assert not sim_stack.faults.is_crash_looping({"InstanceId": "i-3", "ImageId": "ami-0crash"})
    code, _ = run(sim_stack, "faults", "bad-ami", "not-an-ami")
    assert code == 2
    code, _ = run(
        sim_stack, "faults", "api", "--verb", "create", "--resource", "pods/eviction", "--status", "429"
    )
    assert code == 0 and [r.status for r in sim_stack.api_faults.rules()] == [429]
    code, out = run(sim_stack, "faults", "show")
    shown = json.loads(out)
    assert shown["ec2"]["spec"]["insufficient_capacity"][0]["instance_type"] == "m5.large"
    assert shown["api"]["items"][0]["resource"] == "pods/eviction"
    # The API fault is live: kubectl drain's evictions would now be refused.
    assert "429" in kubectl(sim_stack, "get", "--raw", "/sim/faults")
    code, _ = run(
        sim_stack, "faults", "ice", "m5.large", "--zone", "us-west-2a", "--capacity-type", "spot", "--remove"
    )
    assert not sim_stack.faults.exhausted("m5.large", "us-west-2a", "spot")
    run(sim_stack, "faults", "clear")
    assert not sim_stack.api_faults.rules() and not sim_stack.faults.should_throttle("RunInstances")


def test_dump_is_a_snapshot_and_load_replaces_the_cluster(sim_stack, tmp_path):
    code, out = run(sim_stack, "dump")
    assert code == 0
    snapshot = Snapshot.from_objects(yaml.safe_load(out)["items"])
    assert len(snapshot.nodes) == 3 and not snapshot.problems
    code, out = run(sim_stack, "load", str(DEMO))
    assert code == 0 and "13 Node" in out
    assert len(kubectl(sim_stack, "get", "nodes", "-o", "name").split()) == 13
    code, out = run(sim_stack, "instances")
    assert code == 0 and out.count("running") == 13 and out.count("terminated") == 3
    dumped = tmp_path / "cluster.json"
    assert run(sim_stack, "dump", "--json", "-o", str(dumped))[0] == 0
    assert len([o for o in json.loads(dumped.read_text())["items"] if o["kind"] == "Node"]) == 13


def test_an_absent_simulator_is_a_clear_error():
    result = CliRunner().invoke(sim, ["--url", "http://127.0.0.1:9", "status"])
    assert result.exit_code == 1 and "no simulator answers at http://127.0.0.1:9" in result.output
