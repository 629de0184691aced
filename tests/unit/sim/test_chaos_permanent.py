"""The chaos run's permanent faults and coexistence mode, in the parts that need no stack: what each
fault reports as a finding, how the report counts it, and what the workers are told beside Karpenter."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from sim.chaos.actions import Effects
from sim.chaos.permanent import EvictionsDenied, OwnershipRemoved
from sim.chaos.report import INVARIANTS, PERMANENT_INVARIANT, ChaosReport
from sim.chaos.runner import worker_env
from sim.stack import SimStack

REFUSED = (
    "termination/c/ip-1/uid-1: Refused: node ip-1: its instance i-1 is not tagged "
    "kubernetes.io/cluster/c=owned, so this cluster does not own it"
)
DENIED = (
    "termination/c/ip-2/uid-2: Invalid: eviction of pod shop/web-1: Kubernetes API 400: admission webhook"
)


class StubStack:
    cluster_name = "c"
    kube_url = "http://127.0.0.1:1"
    ec2_endpoint = "http://127.0.0.1:2"
    region = "us-west-2"

    def client_env(self) -> dict[str, str]:
        return {"KUBECONFIG": "/dev/null", "KARPFLOW_CLUSTER_NAME": self.cluster_name}


class StubTemporal:
    address = "127.0.0.1:7233"


def _stack() -> SimStack:
    return cast(SimStack, StubStack())


def test_a_termination_that_failed_on_a_denied_eviction_is_a_finding():
    fault = EvictionsDenied(_stack(), Effects())
    assert fault.findings([REFUSED]) == []
    [finding] = fault.findings([DENIED, "disruption/c/x: API 400 elsewhere"])
    assert "instead of waiting" in finding and "ip-2" in finding


def test_a_refusal_to_terminate_the_untagged_instance_is_expected_not_a_finding():
    effects = Effects()
    fault = OwnershipRemoved(_stack(), effects, instance_id="i-1", node="ip-1")
    assert fault.findings([REFUSED, DENIED]) == []
    assert effects.counts["ownership-refused"] == 1
    assert any("refused, as expected" in line for line in fault.notes())
    # The instance terminated while untagged is the finding (recorded when the fault lifts).
    fault.problems.append(
        "ownership-removed: instance i-1 (node ip-1) was terminated while it had no ownership tag"
    )
    assert fault.findings([]) == fault.problems


def test_a_permanent_fault_finding_fails_the_run():
    assert PERMANENT_INVARIANT in INVARIANTS
    report = ChaosReport(seed=1, minutes=1, time_scale=0.05, nodes=16, cluster="c", state_dir=str(Path(".")))
    report.converged = True
    assert report.ok
    report.invariants[PERMANENT_INVARIANT] = 1
    assert not report.ok


def test_beside_karpenter_the_workers_run_in_coexistence_mode_and_the_replay_says_so():
    temporal: Any = StubTemporal()
    alone = worker_env(_stack(), temporal, "q", 0.05)
    beside = worker_env(_stack(), temporal, "q", 0.05, karpenter=True)
    assert "KARPFLOW_KARPENTER_COEXISTENCE" not in alone and "KUBECONFIG" not in alone
    assert beside["KARPFLOW_KARPENTER_COEXISTENCE"] == "true"
    report = ChaosReport(
        seed=7, minutes=2, time_scale=0.05, nodes=16, cluster="c", state_dir=".", karpenter=True
    )
    assert report.replay_command().endswith("--karpenter")
    assert "beside Karpenter" in report.lines()[0]
