"""CapacityBuffer pods keep a node from counting as empty (Karpenter v1.14), written from Karpenter's
tests (each test names the one it comes from)."""

from __future__ import annotations

from typing import Any

from planner.capacity_buffers import buffer_pods
from planner.emptiness import Emptiness
from planner.model import PlanOptions
from planner.plan import plan
from sim.cluster_builder import ClusterBuilder


def buffer(
    b: ClusterBuilder,
    name: str = "warm",
    *,
    replicas: int = 1,
    ready: bool = True,
    template: str | None = "warm-pods",
    scalable: str | None = None,
) -> dict[str, Any]:
    """A CapacityBuffer as its controller leaves it: status.replicas and ReadyForProvisioning."""
    spec: dict[str, Any] = {"provisioningStrategy": "buffer.x-k8s.io/active-capacity", "replicas": replicas}
    if template is not None:
        spec["podTemplateRef"] = {"name": template}
    if scalable is not None:
        spec["scalableRef"] = {"apiGroup": "apps", "kind": "Deployment", "name": scalable}
    return b.add(
        {
            "apiVersion": "autoscaling.x-k8s.io/v1beta1",
            "kind": "CapacityBuffer",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": spec,
            "status": {
                "replicas": replicas,
                "conditions": [{"type": "ReadyForProvisioning", "status": "True" if ready else "False"}],
            },
        }
    )


def pod_template(b: ClusterBuilder, name: str = "warm-pods", cpu: str = "1500m") -> dict[str, Any]:
    return b.add(
        {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "template": {
                "metadata": {"labels": {"app": "warm"}},
                "spec": {
                    "nodeName": "somewhere",
                    "containers": [
                        {"name": "pause", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
                    ],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                },
            },
        }
    )


def run(b: ClusterBuilder):
    return plan(b.snapshot(), b.catalog, PlanOptions(all_methods=True))


def emptied(b: ClusterBuilder) -> list[str]:
    return sorted(n for c in run(b).commands if c.method == "emptiness" for n in c.nodes)


def reason_for(result: Any, node: str) -> str:
    return next(x.reason for x in result.blocked if x.node == node)


def test_the_buffer_pods_are_built_as_karpenter_builds_them():
    """pkg/state/virtualpods/utilities_test.go: It("should include podTemplateRef buffers with
    Status.PodTemplateRef set"), It("should exclude buffers with zero replicas"), It("should exclude
    buffers without ReadyForProvisioning condition"); names, labels and the fake-pod annotation as
    BuildVirtualPods writes them, no nodeName, the PVC volume dropped."""
    b = ClusterBuilder()
    b.nodepool("default")
    pod_template(b)
    buffer(b, replicas=2)
    buffer(b, "none", replicas=0)
    buffer(b, "unready", ready=False)
    pods, unresolved = buffer_pods(b.snapshot())
    assert unresolved == []
    assert [p.key for p in pods] == ["default/capacity-buffer-warm-1", "default/capacity-buffer-warm-2"]
    first = pods[0]
    assert first.node_name is None and first.is_pending and first.pvc_names == ()
    assert first.labels == {"app": "warm"} and first.priority == -(1 << 31)
    assert first.annotations["karpenter.sh/capacity-buffer-fake-pod"] == "true"
    assert first.annotations["karpenter.sh/capacity-buffer-name"] == "warm"


def test_a_node_hosting_buffer_pods_is_not_emptied():
    """pkg/controllers/disruption/emptiness_test.go: It("should not disrupt a node that hosts virtual
    buffer pods") and It("should only protect the specific node with buffer pods, not others"): of two
    empty nodes the buffer's one pod lands on the first, which stays; the other is emptied."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("empty-a")
    b.node("empty-b")
    pod_template(b)
    buffer(b)
    result = run(b)
    assert sorted(n for c in result.commands if c.method == "emptiness" for n in c.nodes) == ["empty-b"]
    assert "has buffer pods (1 of a CapacityBuffer)" in reason_for(result, "empty-a")


def test_a_node_is_emptied_once_its_buffer_is_gone_or_not_ready():
    """pkg/controllers/disruption/emptiness_test.go: It("should disrupt a node once buffer pods are
    cleared") and It("should not protect a node with zero buffer pod count")."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("empty-a")
    pod_template(b)
    buffer(b, ready=False)
    assert emptied(b) == ["empty-a"]
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("empty-a")
    pod_template(b)
    buffer(b, replicas=0)
    assert emptied(b) == ["empty-a"]


def test_buffer_pods_that_fill_several_nodes_protect_each():
    """pkg/controllers/disruption/emptiness_test.go: It("should protect multiple nodes that each host
    buffer pods"): an m5.large holds one 1.5-CPU buffer pod, so two pods keep two nodes."""
    b = ClusterBuilder()
    b.nodepool("default")
    for name in ("empty-a", "empty-b", "empty-c"):
        b.node(name)
    pod_template(b)
    buffer(b, replicas=2)
    assert emptied(b) == ["empty-c"]


def test_a_buffer_only_node_is_left_by_consolidation_to_emptiness_which_keeps_it():
    """pkg/controllers/disruption/consolidation_test.go, Context "Buffer Pods": It("should not
    empty-consolidate a node with only buffer pods") and It("should skip buffer-only nodes in
    single-node consolidation but protect via emptiness")."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("buffer-only", instance_type="m5.xlarge")
    pod_template(b)
    buffer(b)
    result = run(b)
    assert result.commands == []
    reasons = " | ".join(x.reason for x in result.blocked if x.node == "buffer-only")
    assert "has buffer pods" in reasons


def test_consolidating_a_node_with_buffer_pods_must_make_room_for_them():
    """pkg/controllers/disruption/consolidation_test.go, Context "Buffer Pods": It("should allow
    consolidation of a node with real pods and buffer pods to a cheaper instance"): the consolidation
    simulation holds the buffer pods among the pending pods, so the replacement is sized for the
    real pod and the buffer pod both (without the buffer a smaller one would do)."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("big", instance_type="m5.2xlarge")
    b.pod("web-1", "big", cpu="200m", memory="256Mi")
    without = [c for c in run(b).commands if c.method == "single-node-consolidation"]
    pod_template(b, cpu="3")
    buffer(b)
    with_buffer = [c for c in run(b).commands if c.method == "single-node-consolidation"]
    assert without and with_buffer
    small = without[0].replacements[0].instance_types[0]
    sized = with_buffer[0].replacements[0].instance_types[0]
    assert small != sized
    assert b.catalog is not None
    assert b.catalog.types[sized].cpu >= 3200 > b.catalog.types[small].cpu


def test_a_ready_buffer_whose_pods_cannot_be_built_keeps_every_empty_node():
    """Fails closed (karpflow; Karpenter resolves a scalableRef's Deployment, which karpflow does not
    read): the buffer's pods could be on any node, so none is emptied, and the reason names it.
    Karpenter's pkg/state/virtualpods/virtualpods_test.go It("should skip buffers whose pod spec
    cannot be resolved") skips a buffer it cannot resolve; karpflow cannot tell that from one it
    does not read."""
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("empty-a")
    buffer(b, template=None, scalable="web")
    result = plan(b.snapshot(), b.catalog, PlanOptions(), methods=[Emptiness()])
    assert result.commands == []
    assert "scalableRef Deployment/web is not read by karpflow yet" in reason_for(result, "empty-a")


def test_an_emptiness_command_carries_the_buffers_it_accounted_for_to_the_taint():
    """The taint re-checks them (activities/buffer_guard.py): the command's input says which ready
    buffers, with their replicas, the decision saw."""
    from api.workflow_io import disruption_input

    b = ClusterBuilder()
    b.nodepool("default")
    b.node("empty-a")
    b.node("empty-b")
    pod_template(b)
    buffer(b)
    buffer(b, "later", ready=False)
    (command,) = [c for c in plan(b.snapshot(), b.catalog, PlanOptions(), methods=[Emptiness()]).commands]
    assert command.nodes == ["empty-b"]
    ctx = b.context(PlanOptions())
    (planned,) = Emptiness().compute(ctx, [c for c in _candidates(ctx) if c.name == "empty-b"], _budgets(ctx))
    assert planned.capacity_buffers == {"default/warm": 1}
    assert disruption_input(planned).capacity_buffers == {"default/warm": 1}


def test_the_taint_check_refuses_only_a_new_or_bigger_ready_buffer():
    from activities.buffer_guard import capacity_buffers_grown

    def listed(name: str, replicas: int, ready: bool = True) -> dict[str, Any]:
        b = ClusterBuilder()
        return buffer(b, name, replicas=replicas, ready=ready)

    planned = {"default/warm": 2}
    assert capacity_buffers_grown(planned, [listed("warm", 2)]) is None
    assert capacity_buffers_grown(planned, [listed("warm", 1)]) is None  # smaller frees room
    assert capacity_buffers_grown(planned, [listed("new", 3, ready=False)]) is None
    why = capacity_buffers_grown(planned, [listed("warm", 3), listed("new", 1)])
    assert why is not None and "default/new (0 -> 1 replicas), default/warm (2 -> 3 replicas)" in why


def _candidates(ctx):
    from planner.candidates import build_candidates

    return build_candidates(ctx)[0]


def _budgets(ctx):
    from planner.budgets import build_budget_map

    return build_budget_map(ctx, "Empty")
