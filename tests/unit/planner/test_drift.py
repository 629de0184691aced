from datetime import timedelta

import pytest

from api.nodepool import EC2NodeClass, NodePool
from planner.candidates import build_candidates
from planner.drift import (
    NODEPOOL_HASH_VERSION,
    Drift,
    drift_status,
    hash_stamps,
    nodeclass_hash,
    nodepool_hash,
)
from planner.model import PlanOptions, Replacement, SchedulingResult
from planner.plan import plan
from sim.cluster_builder import NODECLAIM_SPEC, ClusterBuilder

POOL = {
    "metadata": {"name": "default"},
    "spec": {
        "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}],
                "taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}],
                "expireAfter": "720h",
            },
        },
        "disruption": {"consolidateAfter": "1m"},
    },
}


def pool(**changes) -> NodePool:
    raw = NodePool.model_validate(POOL).to_wire()
    for path, value in changes.items():
        target = raw
        *parents, leaf = path.split(".")
        for key in parents:
            target = target[key]
        target[leaf] = value
    return NodePool.model_validate(raw)


def test_nodepool_hash_is_stable_and_ignores_requirements_disruption_limits_and_weight():
    base = nodepool_hash(pool())
    assert base == nodepool_hash(pool())
    assert base == nodepool_hash(pool(**{"spec.template.spec.requirements": []}))
    assert base == nodepool_hash(pool(**{"spec.disruption.consolidateAfter": "5m", "spec.weight": 10}))
    assert base == nodepool_hash(pool(**{"spec.limits": {"cpu": "10"}}))
    # Taints are a set; an equivalent duration spelling is the same value.
    assert base == nodepool_hash(
        pool(
            **{
                "spec.template.spec.taints": [
                    {"key": "b", "effect": "NoSchedule"},
                    {"key": "a", "effect": "NoSchedule"},
                ]
            }
        )
    )
    assert base == nodepool_hash(pool(**{"spec.template.spec.expireAfter": "719h60m"}))


@pytest.mark.parametrize(
    "change",
    [
        {"spec.template.metadata.labels": {"team": "b"}},
        {"spec.template.metadata.annotations": {"x": "y"}},
        {"spec.template.spec.taints": []},
        {"spec.template.spec.startupTaints": [{"key": "agent", "effect": "NoExecute"}]},
        {"spec.template.spec.expireAfter": "24h"},
        {"spec.template.spec.terminationGracePeriod": "1h"},
        {
            "spec.template.spec.nodeClassRef": {
                "group": "karpenter.k8s.aws",
                "kind": "EC2NodeClass",
                "name": "b",
            }
        },
    ],
)
def test_nodepool_hash_changes_with_the_fields_that_replace_nodes(change):
    assert nodepool_hash(pool(**change)) != nodepool_hash(pool())


def cluster(**pool_kwargs) -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodeclass(amis=["ami-new"], security_groups=["sg-1", "sg-2"])
    b.nodepool("default", **pool_kwargs)
    return b


def status_of(b: ClusterBuilder, node: str = "n1", **options):
    ctx = b.context(PlanOptions(**options))
    n = ctx.snapshot.nodes[node]
    return drift_status(ctx, n, ctx.snapshot.nodepools[n.nodepool])


def test_a_changed_template_drifts_nodes_stamped_with_our_hash_version():
    b = cluster(labels={"team": "a"})
    b.node("n1", ami="ami-new", security_groups="sg-1,sg-2")
    assert status_of(b) is None
    b.objects[1]["spec"]["template"]["metadata"]["labels"] = {"team": "b"}
    drift = status_of(b)
    assert drift is not None and drift.reason == "NodePoolDrifted"


def test_nodes_with_another_hash_version_never_drift_by_hash():
    b = cluster(labels={"team": "a"})
    b.node(
        "n1",
        stamp_hash=False,
        ami="ami-new",
        security_groups="sg-1,sg-2",
        annotations={"karpenter.sh/nodepool-hash": "123456", "karpenter.sh/nodepool-hash-version": "v3"},
    )
    b.node("n2", stamp_hash=False, ami="ami-new", security_groups="sg-1,sg-2")
    assert status_of(b, "n1") is None and status_of(b, "n2") is None
    ctx = b.context()
    stamps = hash_stamps(ctx)
    assert sorted(stamps) == ["n1", "n2"]
    assert stamps["n1"]["karpenter.sh/nodepool-hash-version"] == NODEPOOL_HASH_VERSION
    assert stamps["n1"]["karpenter.sh/nodepool-hash"] == nodepool_hash(ctx.snapshot.nodepools["default"])
    assert stamps["n1"]["karpenter.k8s.aws/ec2nodeclass-hash"] == nodeclass_hash(
        ctx.snapshot.nodeclasses["default"]
    )


def test_narrowing_a_requirement_drifts_and_widening_does_not():
    narrow = [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}]
    b = cluster(requirements=narrow)
    b.node("n1", instance_type="m5.large", ami="ami-new", security_groups="sg-1,sg-2")
    assert status_of(b) is None
    b.objects[1]["spec"]["template"]["spec"]["requirements"] = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "m5.xlarge"]}
    ]
    assert status_of(b) is None  # widened
    b.objects[1]["spec"]["template"]["spec"]["requirements"] = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m6i.large"]}
    ]
    drift = status_of(b)
    assert drift.reason == "RequirementsDrifted" and "m5.large" in drift.detail


def test_requirement_drift_reads_well_known_labels_from_the_catalog_and_ignores_unknowns():
    b = cluster(requirements=[{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["4"]}])
    b.node("n1", instance_type="m5.large", ami="ami-new", security_groups="sg-1,sg-2")
    del b.objects[-1]["metadata"]["labels"]["karpenter.k8s.aws/instance-cpu"]
    assert status_of(b).reason == "RequirementsDrifted"  # 2 vCPU from the catalog, not > 4
    b.objects[1]["spec"]["template"]["spec"]["requirements"] = [
        {"key": "karpenter.k8s.aws/instance-gpu-count", "operator": "Gt", "values": ["0"]}
    ]
    assert status_of(b) is None  # a well-known label nobody knows: not drift
    b.objects[1]["spec"]["template"]["spec"]["requirements"] = [
        {"key": "team", "operator": "In", "values": ["a"]}
    ]
    assert status_of(b).reason == "RequirementsDrifted"  # a custom label the node lacks


@pytest.mark.parametrize(
    ("node_kwargs", "reason"),
    [
        ({"ami": "ami-old", "security_groups": "sg-1,sg-2"}, "AMIDrift"),
        ({"ami": "ami-new", "subnet": "subnet-gone", "security_groups": "sg-1,sg-2"}, "SubnetDrift"),
        ({"ami": "ami-new", "security_groups": "sg-1"}, "SecurityGroupDrift"),
        ({"ami": "ami-new", "security_groups": "sg-2, sg-1"}, None),
        ({"ami": None, "security_groups": None}, None),  # nothing recorded: never drift
    ],
)
def test_ec2nodeclass_drift_compares_the_resolved_status(node_kwargs, reason):
    b = cluster()
    b.node("n1", **node_kwargs)
    drift = status_of(b)
    assert (drift.reason if drift else None) == reason


def test_a_changed_nodeclass_spec_drifts_nodes_stamped_with_its_hash():
    b = cluster()
    b.node("n1", ami="ami-new", security_groups="sg-1,sg-2")
    ctx = b.context()
    b.objects[-1]["metadata"]["annotations"].update(
        {
            "karpenter.k8s.aws/ec2nodeclass-hash": nodeclass_hash(ctx.snapshot.nodeclasses["default"]),
            "karpenter.k8s.aws/ec2nodeclass-hash-version": NODEPOOL_HASH_VERSION,
        }
    )
    assert status_of(b) is None
    b.objects[0]["spec"]["role"] = "AnotherRole"
    assert status_of(b).reason == "NodeClassDrifted"


def test_a_nodeclaim_drifted_condition_is_trusted():
    b = cluster()
    node = b.node("n1", ami="ami-new", security_groups="sg-1,sg-2")
    b.add(
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "claim-1"},
            "spec": NODECLAIM_SPEC,
            "status": {
                "nodeName": node["metadata"]["name"],
                "conditions": [
                    {
                        "type": "Drifted",
                        "status": "True",
                        "reason": "NodeClassDrifted",
                        "lastTransitionTime": "2026-11-20T00:00:00Z",
                    }
                ],
            },
        }
    )
    drift = status_of(b)
    assert drift.reason == "NodeClassDrifted" and drift.since.day == 20


def test_instance_type_drift_only_when_enabled_and_after_an_hour():
    b = cluster()
    b.node("n1", instance_type="x9.gone", ami="ami-new", security_groups="sg-1,sg-2")
    b.node(
        "n2", instance_type="x9.gone", ami="ami-new", security_groups="sg-1,sg-2", age=timedelta(minutes=30)
    )
    assert status_of(b, "n1") is None
    assert status_of(b, "n1", instance_type_drift=True).reason == "InstanceTypeNotFound"
    assert status_of(b, "n2", instance_type_drift=True) is None


# --- The Drift method with a fake scheduling simulation ----------------------------------------


class FakeSimulation:
    """Every pod goes to one new node of the candidate's pool, except pods labelled stuck=true."""

    def __init__(self):
        self.calls = []

    def __call__(self, ctx, candidates, pods=None):
        self.calls.append([c.name for c in candidates])
        moving = [p for c in candidates for p in c.reschedulable_pods]
        stuck = {p.key: "no node fits" for p in moving if p.labels.get("stuck") == "true"}
        placed = [p for p in moving if p.key not in stuck]
        new_nodes = []
        if placed:
            types = [ctx.catalog.get("m5.large"), ctx.catalog.get("m6i.large")]
            new_nodes = [Replacement(candidates[0].pool_name, types, "on-demand", ["us-west-2a"], placed)]
        return SchedulingResult(new_nodes=new_nodes, unschedulable=stuck)


def drift_plan(b: ClusterBuilder, simulate=None, **options):
    return plan(
        b.snapshot(),
        b.catalog,
        PlanOptions(**options),
        methods=[Drift()],
        simulate=simulate or FakeSimulation(),
    )


# Karpenter's pace: one drift command per pass (the batch of planner/drift_batch.py is the default).
ONE_PER_PASS = {"drift_commands_per_pass": 1}


def drifted_cluster(budgets=None, **pool_kwargs) -> ClusterBuilder:
    b = cluster(budgets=budgets or [{"nodes": "100%"}], **pool_kwargs)
    return b


def test_a_drifted_node_is_replaced_by_what_the_simulation_needs():
    b = drifted_cluster()
    b.node("n1", ami="ami-old", security_groups="sg-1,sg-2")
    b.pod("web-1", "n1")
    simulation = FakeSimulation()
    result = drift_plan(b, simulation)
    (command,) = result.commands
    assert (command.method, command.reason, command.decision, command.nodes) == (
        "drift",
        "Drifted",
        "replace",
        ["n1"],
    )
    assert command.disruption_class == "eventual"
    (replacement,) = command.replacements
    assert replacement.instance_types == ["m5.large", "m6i.large"] and replacement.price == 0.096
    assert simulation.calls == [["n1"]]


def test_empty_drifted_nodes_go_first_and_are_deleted_without_simulation():
    b = drifted_cluster()
    b.node("busy", ami="ami-old", security_groups="sg-1,sg-2", age=timedelta(days=20))
    b.pod("web-1", "busy")
    b.node("idle", ami="ami-old", security_groups="sg-1,sg-2", age=timedelta(days=1))
    simulation = FakeSimulation()
    (command,) = drift_plan(b, simulation, **ONE_PER_PASS).commands
    assert command.nodes == ["idle"] and command.decision == "delete" and simulation.calls == []
    # In a batch too the empty node comes first, deleted without a simulation.
    simulation = FakeSimulation()
    commands = drift_plan(b, simulation).commands
    assert [(c.nodes, c.decision) for c in commands] == [(["idle"], "delete"), (["busy"], "replace")]
    assert simulation.calls == [["busy"]]


def test_oldest_drifted_node_goes_first_and_one_command_per_pass():
    b = drifted_cluster()
    for name, days in (("young", 1), ("old", 9), ("middle", 5)):
        b.node(name, ami="ami-old", security_groups="sg-1,sg-2", age=timedelta(days=days))
        b.pod(f"{name}-pod", name)
    result = drift_plan(b, **ONE_PER_PASS)
    assert [c.nodes for c in result.commands] == [["old"]]
    waiting = {x.node: x.reason for x in result.blocked}
    assert waiting["middle"].startswith("drifted (AMIDrift); one drift command per pass")
    # The default: the whole budget (100 %) in one pass, oldest first.
    assert [c.nodes for c in drift_plan(b).commands] == [["old"], ["middle"], ["young"]]


def test_a_drifted_node_whose_pods_cannot_move_is_skipped_for_the_next():
    b = drifted_cluster()
    b.node("stuck", ami="ami-old", security_groups="sg-1,sg-2", age=timedelta(days=9))
    b.pod("db-1", "stuck", labels={"stuck": "true"})
    b.node("fine", ami="ami-old", security_groups="sg-1,sg-2", age=timedelta(days=2))
    b.pod("web-1", "fine")
    result = drift_plan(b)
    assert [c.nodes for c in result.commands] == [["fine"]]
    assert (
        "1 pod(s) cannot be rescheduled (e.g. default/db-1: no node fits)"
        in {x.node: x.reason for x in result.blocked}["stuck"]
    )


def test_drift_respects_the_drifted_budget():
    b = drifted_cluster(budgets=[{"nodes": "0", "reasons": ["Drifted"]}, {"nodes": "100%"}])
    b.node("n1", ami="ami-old", security_groups="sg-1,sg-2")
    result = drift_plan(b)
    assert result.commands == []
    assert "budget allows no Drifted disruptions now" in result.blocked[0].reason


def test_drift_with_a_termination_grace_period_ignores_blocking_pods():
    b = drifted_cluster(termination_grace_period="1h")
    b.node("n1", ami="ami-old", security_groups="sg-1,sg-2")
    b.pod("web-1", "n1", app="web")
    b.pdb("web", match_labels={"app": "web"}, allowed=0)
    assert [c.nodes for c in drift_plan(b).commands] == [["n1"]]


def test_drift_without_a_termination_grace_period_respects_blocking_pods():
    b = drifted_cluster()
    b.node("n1", ami="ami-old", security_groups="sg-1,sg-2")
    b.pod("web-1", "n1", app="web", annotations={"karpenter.sh/do-not-disrupt": "true"})
    result = drift_plan(b)
    assert result.commands == []
    assert result.blocked[0].reason == "pod default/web-1 has karpenter.sh/do-not-disrupt"


def test_drift_candidates_are_only_drifted_nodes():
    b = drifted_cluster()
    b.node("fine", ami="ami-new", security_groups="sg-1,sg-2")
    ctx = b.context()
    (candidate,), _ = build_candidates(ctx)
    assert not Drift().should_disrupt(ctx, candidate)


# --- The seed-era marker --------------------------------------------------------------------------


def _markers(b, **options):
    from planner.model import PlanOptions
    from planner.plan import plan

    result = plan(b.snapshot(), b.catalog, PlanOptions(**options), methods=[], simulate=None)
    return {(a.node, a.key, a.value) for a in result.annotations}


def test_drifted_nodes_are_marked_and_the_mark_goes_when_drift_goes():
    from planner.drift import NODEPOOL_HASH_VERSION

    stale = {"karpenter.sh/nodepool-hash": "0", "karpenter.sh/nodepool-hash-version": NODEPOOL_HASH_VERSION}
    b = ClusterBuilder()
    b.nodepool("default")
    b.node("current")
    b.node("drifted", stamp_hash=False, annotations=stale)
    b.node("fixed", annotations={"karpenter.sh/voluntary-disruption": "drifted"})
    b.node(
        "theirs",
        stamp_hash=False,
        annotations={**stale, "karpenter.sh/voluntary-disruption": "expired"},
    )
    key = "karpenter.sh/voluntary-disruption"
    assert _markers(b) == {("drifted", key, "drifted"), ("fixed", key, None)}
    # Drift turned off: no node is drifted any more, so marks go (and nothing new is marked).
    assert _markers(b, drift=False) == {("fixed", key, None)}


@pytest.mark.parametrize(
    ("field", "value"),
    [("associatePublicIPAddress", False), ("detailedMonitoring", True), ("kubelet", {"maxPods": 58})],
)
def test_the_launch_fields_are_in_the_nodeclass_hash_and_absent_ones_change_nothing(field, value):
    base = {"metadata": {"name": "default"}, "spec": {"role": "NodeRole", "amiFamily": "AL2023"}}
    before = nodeclass_hash(EC2NodeClass.model_validate(base))
    # A field that is absent hashes as before (no mass drift when karpflow learns a field) ...
    assert nodeclass_hash(EC2NodeClass.model_validate({**base, "spec": {**base["spec"]}})) == before
    # ... and setting it changes the hash, so the nodes launched without it drift.
    changed = {**base, "spec": {**base["spec"], field: value}}
    assert nodeclass_hash(EC2NodeClass.model_validate(changed)) != before


def test_ec2nodeclass_drift_reads_ec2_not_labels_nobody_writes():
    """A node as karpflow launches it carries no AMI, subnet or security-group label (no kubelet,
    Karpenter or AWS writes one); EC2NodeClass drift reads its instance as EC2 describes it."""
    b = cluster()
    node = b.node("n1", ami="ami-new", security_groups="sg-1,sg-2")
    assert not [k for k in node["metadata"]["labels"] if "-ami-" in k or "subnet" in k]
    assert not [k for k in node["metadata"].get("annotations", {}) if "security-group" in k]
    assert status_of(b) is None
    b.instances[-1]["ImageId"] = "ami-old"  # EC2: the instance runs another image
    assert status_of(b).reason == "AMIDrift"
    # What fake labels say is not read: the old label shortcut cannot hide or cause drift.
    node["metadata"]["labels"]["karpenter.k8s.aws/instance-ami-id"] = "ami-new"
    assert status_of(b).reason == "AMIDrift"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"amis": [{"id": "ami-newer", "name": "ami-newer"}]}, "AMIDrift"),
        ({"subnets": [{"id": "subnet-z", "zone": "us-west-2a"}]}, "SubnetDrift"),
        ({"securityGroups": [{"id": "sg-9"}]}, "SecurityGroupDrift"),
    ],
)
def test_a_node_drifts_when_its_ec2nodeclass_status_moves_away_from_its_instance(change, reason):
    """Karpenter resolves new selector results into the EC2NodeClass status; nodes whose instance
    no longer matches drift."""
    b = cluster()
    b.node("n1", zone="us-west-2a", subnet="subnet-a", ami="ami-new", security_groups="sg-1,sg-2")
    b.objects[0]["status"]["subnets"] = [{"id": "subnet-a", "zone": "us-west-2a"}]
    assert status_of(b) is None
    b.objects[0]["status"].update(change)
    assert status_of(b).reason == reason


def test_the_nodeclaims_image_id_is_karpenters_record_of_the_ami():
    b = cluster()
    node = b.node("n1", ami="ami-new", security_groups="sg-1,sg-2")
    b.add(
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "claim-1", "labels": {"karpenter.sh/nodepool": "default"}},
            "status": {"nodeName": node["metadata"]["name"], "imageID": "ami-old"},
        }
    )
    assert status_of(b).reason == "AMIDrift"


def test_without_ec2s_word_on_the_instance_nothing_drifts_by_ami_subnet_or_groups():
    b = cluster()
    b.node("n1", ami="ami-old", security_groups="sg-9")
    b.instances.clear()  # the planning activity could not describe the instance
    assert status_of(b) is None
