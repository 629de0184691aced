import json
from datetime import timedelta

import pytest
import yaml

from planner.resources import Resources
from planner.snapshot import Snapshot, SnapshotError, load_snapshot, read_objects
from sim.cluster_builder import DEFAULT_NOW, NODECLAIM_SPEC, ClusterBuilder

MI = 1 << 20


def small_cluster() -> ClusterBuilder:
    b = ClusterBuilder()
    b.nodeclass()
    b.nodepool("default")
    b.node("n1")
    b.node("n2", instance_type="c6i.xlarge", zone="us-west-2b")
    b.pod("web-1", "n1", cpu="250m", memory="512Mi")
    b.pod("web-2", "n2")
    b.daemonset_pod("n1")
    b.daemonset()
    b.pdb("web", allowed=1)
    b.add(
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"}}
    )
    return b


def test_loads_every_kind_of_a_kubectl_list(tmp_path):
    path = small_cluster().write(tmp_path / "cluster.yaml")
    snapshot = load_snapshot(path, now=DEFAULT_NOW)
    assert sorted(snapshot.nodes) == ["n1", "n2"]
    assert {p.key for p in snapshot.nodes["n1"].pods} == {"default/web-1", "kube-system/kube-proxy-n1"}
    assert list(snapshot.nodepools) == ["default"] and list(snapshot.nodeclasses) == ["default"]
    assert [d.key for d in snapshot.daemonsets] == ["kube-system/kube-proxy"]
    assert [p.key for p in snapshot.pdbs] == ["default/web"]
    assert snapshot.problems == []  # the Deployment is ignored silently
    node = snapshot.nodes["n2"]
    assert (node.nodepool, node.instance_type, node.zone, node.capacity_type) == (
        "default",
        "c6i.xlarge",
        "us-west-2b",
        "on-demand",
    )
    assert node.initialized and node.ready
    assert node.allocatable.cpu == 3920 and node.allocatable.pods == 58


def test_multi_document_yaml_json_and_several_files_combine(tmp_path):
    b = small_cluster()
    nodes = [o for o in b.objects if o["kind"] == "Node"]
    rest = [o for o in b.objects if o["kind"] != "Node"]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump_all(nodes))
    (tmp_path / "rest.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": rest}))
    snapshot = load_snapshot([tmp_path / "nodes.yaml", tmp_path / "rest.json"], now=DEFAULT_NOW)
    assert len(snapshot.nodes) == 2 and len(snapshot.pods) == 3
    assert snapshot.sources == [str(tmp_path / "nodes.yaml"), str(tmp_path / "rest.json")]


def test_typed_list_items_inherit_the_list_kind(tmp_path):
    pods = [o for o in small_cluster().objects if o["kind"] == "Pod"]
    for pod in pods:
        del pod["kind"]
    (tmp_path / "pods.json").write_text(json.dumps({"kind": "PodList", "items": pods}))
    assert len(load_snapshot(tmp_path / "pods.json").pods) == 3


def test_effective_requests_follow_the_init_container_and_sidecar_rules():
    b = ClusterBuilder()
    b.pod(
        "p",
        None,
        spec={
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "100Mi"}}},
                {"name": "b", "resources": {"limits": {"cpu": "200m", "memory": "50Mi"}}},  # request = limit
            ],
            "initContainers": [
                {"name": "big-init", "resources": {"requests": {"cpu": "1", "memory": "10Mi"}}},
                {
                    "name": "sidecar",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"cpu": "50m", "memory": "20Mi"}},
                },
            ],
            "overhead": {"cpu": "10m", "memory": "1Mi"},
        },
    )
    pod = b.snapshot().pods[0]
    # cpu: max(300m + 50m sidecar, 1000m init) + 10m overhead; memory: max(150+20, 10) + 1 MiB.
    assert pod.requests == Resources(cpu=1010, memory=171 * MI, pods=1)


def test_malformed_objects_are_reported_with_kind_and_name_and_skipped():
    b = small_cluster()
    b.pod("broken", "n1", cpu="lots")
    b.add({"apiVersion": "v1", "kind": "Node", "metadata": {"labels": {}}})
    b.add(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"minAvailable": "ten"},
        }
    )
    b.add(
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": "bad"},
            "spec": {"disruption": {"consolidationPolicy": "Sometimes"}},
        }
    )
    b.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "t", "namespace": "d"},
            "spec": {"containers": [], "tolerations": [{"operator": "Maybe"}]},
        }
    )
    snapshot = b.snapshot()
    problems = "\n".join(snapshot.problems)
    assert "Pod default/broken: invalid quantity 'lots'" in problems
    assert "Node <no name>: metadata.name is required" in problems
    assert "PodDisruptionBudget ns/x: spec.minAvailable" in problems
    assert "NodePool bad: spec.disruption.consolidationPolicy" in problems
    assert "Pod d/t: tolerations[0]: unknown operator 'Maybe'" in problems
    assert "default/broken" not in {p.key for p in snapshot.pods}
    assert "bad" not in snapshot.nodepools and len(snapshot.nodes) == 2


MALFORMED_MAPS = """
apiVersion: v1
kind: PodList
items:
- just-a-string
- metadata: {name: listed-labels, namespace: shop, labels: [app, web]}
  spec: {containers: [{name: c}]}
- metadata: {name: listed-annotations, namespace: shop, annotations: [note]}
  spec: {containers: [{name: c}]}
- metadata: {name: listed-selector, namespace: shop}
  spec: {nodeSelector: [zone-a], containers: [{name: c}]}
- metadata: {name: fine, namespace: shop}
  spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: NodeList
items:
- metadata: {name: listed-node-labels, labels: [karpenter.sh/nodepool]}
  status: {capacity: {cpu: "2", memory: 8Gi, pods: "30"}}
- metadata: {name: listed-node-annotations, annotations: [note]}
  status: {capacity: {cpu: "2", memory: 8Gi, pods: "30"}}
"""


def test_malformed_items_are_reported_by_kind_and_name_and_skipped(tmp_path):
    path = tmp_path / "malformed.yaml"
    path.write_text(MALFORMED_MAPS)
    snapshot = load_snapshot(path, now=DEFAULT_NOW)
    assert snapshot.problems == [
        "PodList items[0]: not an object: 'just-a-string' (skipped)",
        "Pod shop/listed-labels: metadata.labels: expected a map of strings, got list",
        "Pod shop/listed-annotations: metadata.annotations: expected a map of strings, got list",
        "Pod shop/listed-selector: spec.nodeSelector: expected a map of strings, got list",
        "Node listed-node-labels: metadata.labels: expected a map of strings, got list",
        "Node listed-node-annotations: metadata.annotations: expected a map of strings, got list",
    ]
    assert [p.key for p in snapshot.pods] == ["shop/fine"] and snapshot.nodes == {}
    assert snapshot.region() is None


def test_a_streamed_json_list_reports_items_that_are_not_objects(tmp_path):
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"apiVersion": "v1", "items": [7], "kind": "PodList"}))
    assert load_snapshot(path, now=DEFAULT_NOW).problems == ["List items[0]: not an object: 7 (skipped)"]


@pytest.mark.parametrize("kind", ["NodePool", "Provisioner", "AWSNodeTemplate"])
def test_a_pool_whose_metadata_or_spec_is_not_an_object_is_a_problem_not_a_crash(tmp_path, kind):
    """Found by the fuzz tests: the seed-era migration warning read metadata.name first and raised
    AttributeError out of the whole load (`karpflow plan`, the controller's pass)."""
    path = tmp_path / "pools.json"
    path.write_text(json.dumps({"kind": "List", "items": [{"kind": kind, "metadata": 1.0, "spec": 7}]}))
    snapshot = load_snapshot(path, now=DEFAULT_NOW)
    assert snapshot.nodepools == {} and snapshot.problems


def test_scalar_label_values_of_hand_written_yaml_become_text():
    pod = {"kind": "Pod", "metadata": {"name": "p", "labels": {"tier": 1, "canary": True}}, "spec": {}}
    snapshot = Snapshot.from_objects([pod], now=DEFAULT_NOW)
    assert snapshot.pods[0].labels == {"tier": "1", "canary": "true"}


def test_problems_name_their_file_when_several_files_are_combined(tmp_path):
    good = small_cluster().write(tmp_path / "good.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text(MALFORMED_MAPS)
    snapshot = load_snapshot([good, bad], now=DEFAULT_NOW)
    assert snapshot.problems and all(p.startswith(f"{bad}: ") for p in snapshot.problems)
    assert f"{bad}: Node listed-node-labels: metadata.labels: expected a map of strings, got list" in (
        snapshot.problems
    )


def test_a_list_whose_items_are_not_a_list_is_unusable_input(tmp_path):
    path = tmp_path / "odd.yaml"
    path.write_text("kind: PodList\nitems: {a: 1}\n")
    with pytest.raises(SnapshotError, match=r"odd\.yaml: PodList: items must be a list, got dict"):
        read_objects(path)


def test_unreadable_or_unparseable_files_raise_naming_the_file(tmp_path):
    with pytest.raises(SnapshotError, match=r"nope\.yaml: cannot read"):
        read_objects(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("items: [unclosed\n")
    with pytest.raises(SnapshotError, match=r"bad\.yaml: not valid YAML"):
        read_objects(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just text")
    with pytest.raises(SnapshotError, match=r"scalar\.yaml: expected Kubernetes objects"):
        read_objects(scalar)


def test_pdb_disruptions_allowed_is_computed_from_pod_health_when_status_is_absent():
    b = ClusterBuilder()
    b.nodepool()
    b.node("n1")
    for i in range(4):
        b.pod(f"web-{i}", "n1", app="web", ready=i != 3)  # 3 healthy of 4
    b.pdb("min2", match_labels={"app": "web"}, min_available=2)
    b.pdb("min75", match_labels={"app": "web"}, min_available="75%")  # ceil(3) healthy needed
    b.pdb("maxun1", match_labels={"app": "web"}, max_unavailable=1)  # 4 - 1 = 3 needed
    b.pdb("status", match_labels={"app": "web"}, min_available=1, allowed=0)  # status wins
    allowed = {p.name: p.disruptions_allowed for p in b.snapshot().pdbs}
    assert allowed == {"min2": 1, "min75": 0, "maxun1": 0, "status": 0}


def test_nodeclaims_link_to_their_nodes_by_provider_id_or_node_name():
    b = small_cluster()
    provider = b.objects[2]["spec"]["providerID"]
    b.add(
        {
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "default-abc"},
            "spec": {**NODECLAIM_SPEC, "expireAfter": "24h"},
            "status": {
                "providerID": provider,
                "conditions": [
                    {
                        "type": "Drifted",
                        "status": "True",
                        "reason": "AMIDrift",
                        "lastTransitionTime": "2026-11-22T09:00:00Z",
                    }
                ],
            },
        }
    )
    snapshot = b.snapshot()
    claim = snapshot.nodes["n1"].nodeclaim
    assert claim is not None and claim.name == "default-abc" and claim.condition_true("Drifted")
    assert snapshot.nodes["n2"].nodeclaim is None


PROVISIONER = """
apiVersion: karpenter.sh/v1alpha5
kind: Provisioner
metadata: {name: legacy}
spec:
  ttlSecondsAfterEmpty: 30
  ttlSecondsUntilExpired: 604800
  labels: {team: a}
  taints: [{key: dedicated, value: a, effect: NoSchedule}]
  requirements: [{key: karpenter.sh/capacity-type, operator: In, values: [spot]}]
  providerRef: {name: default}
  limits: {resources: {cpu: "100"}}
---
apiVersion: karpenter.sh/v1alpha5
kind: Provisioner
metadata: {name: consolidating}
spec:
  consolidation: {enabled: true}
---
apiVersion: karpenter.sh/v1alpha5
kind: Provisioner
metadata: {name: static}
spec: {}
---
apiVersion: karpenter.sh/v1beta1
kind: NodePool
metadata: {name: beta}
spec:
  disruption: {consolidationPolicy: WhenUnderutilized, expireAfter: 48h}
---
apiVersion: v1
kind: Node
metadata:
  name: old-node
  labels: {karpenter.sh/provisioner-name: legacy, karpenter.sh/initialized: "true"}
"""


def test_provisioner_era_settings_map_onto_v1_nodepools(tmp_path):
    path = tmp_path / "legacy.yaml"
    path.write_text(PROVISIONER)
    snapshot = load_snapshot(path)
    legacy = snapshot.nodepools["legacy"]
    assert legacy.spec.disruption.consolidation_policy == "WhenEmpty"
    assert legacy.spec.disruption.consolidate_after_delta == timedelta(seconds=30)
    assert legacy.spec.template.spec.expire_after_delta == timedelta(days=7)
    assert legacy.spec.template.metadata.labels == {"team": "a"}
    assert legacy.spec.template.spec.taints[0].key == "dedicated"
    assert legacy.spec.template.spec.node_class_ref.name == "default"
    assert legacy.spec.limits == {"cpu": "100"}
    consolidating = snapshot.nodepools["consolidating"]
    assert consolidating.spec.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"
    assert consolidating.spec.disruption.consolidate_after_delta == timedelta(0)
    assert consolidating.spec.template.spec.expire_after_delta is None  # v1alpha5 never expired by default
    assert snapshot.nodepools["static"].spec.disruption.consolidate_after_delta is None  # Never
    beta = snapshot.nodepools["beta"]
    assert beta.spec.template.spec.expire_after_delta == timedelta(hours=48)
    assert beta.spec.disruption.consolidation_policy == "WhenEmptyOrUnderutilized"
    assert snapshot.nodes["old-node"].nodepool == "legacy"


def test_region_defaults_from_node_labels():
    b = ClusterBuilder(region="us-east-1")
    b.node("n1", pool=None)
    assert b.snapshot().region() == "us-east-1"
    assert Snapshot.from_objects([]).region() is None


def test_snapshot_at_another_time_shares_objects():
    snapshot = small_cluster().snapshot()
    later = snapshot.at(DEFAULT_NOW + timedelta(hours=1))
    assert later.nodes is snapshot.nodes and later.now - snapshot.now == timedelta(hours=1)


def test_json_lists_are_streamed_whatever_the_key_order(tmp_path):
    b = small_cluster()
    pods = [o for o in b.objects if o["kind"] == "Pod"]
    for pod in pods:
        del pod["kind"]
    # kubectl prints keys in this order: the list's kind and metadata come after its items.
    text = json.dumps(
        {
            "apiVersion": "v1",
            "items": pods,
            "kind": "PodList",
            "metadata": {"annotations": {"karpflow.io/captured-at": "2026-11-22T09:00:00Z"}},
        }
    )
    (tmp_path / "pods.json").write_text(text)
    snapshot = load_snapshot(tmp_path / "pods.json")
    assert len(snapshot.pods) == 3 and snapshot.now.hour == 9
    node = next(o for o in b.objects if o["kind"] == "Node")
    (tmp_path / "node.json").write_text(json.dumps(node, indent=2))
    assert list(load_snapshot(tmp_path / "node.json").nodes) == ["n1"]


def test_a_truncated_json_list_is_a_clear_error(tmp_path):
    text = json.dumps(small_cluster().as_list())
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(SnapshotError, match=r"cut\.json: not valid YAML/JSON"):
        load_snapshot(tmp_path / "cut.json")


def test_seed_era_objects_are_read_with_warnings_naming_the_newer_fields():
    from planner.snapshot import Snapshot

    provisioner = {
        "apiVersion": "karpenter.sh/v1alpha5",
        "kind": "Provisioner",
        "metadata": {"name": "legacy"},
        "spec": {
            "ttlSecondsAfterEmpty": 30,
            "ttlSecondsUntilExpired": 2592000,
            "providerRef": {"name": "default"},
        },
    }
    template = {
        "apiVersion": "karpenter.k8s.aws/v1alpha1",
        "kind": "AWSNodeTemplate",
        "metadata": {"name": "default"},
    }
    snapshot = Snapshot.from_objects([provisioner, template])
    pool = snapshot.nodepools["legacy"]
    assert (
        pool.spec.disruption.consolidate_after == "30s" and pool.spec.template.spec.expire_after == "2592000s"
    )
    (provisioner_warning,) = [p for p in snapshot.problems if "Provisioner legacy" in p]
    assert "ttlSecondsAfterEmpty -> NodePool spec.disruption.consolidateAfter" in provisioner_warning
    assert "ttlSecondsUntilExpired -> NodePool spec.template.spec.expireAfter" in provisioner_warning
    assert any("AWSNodeTemplate default" in p and "EC2NodeClass" in p for p in snapshot.problems)


def test_the_pdb_index_finds_exactly_what_checking_every_pdb_finds():
    """pdbs_for looks only at PDBs whose first matchLabels pair the pod carries (and those without
    matchLabels); compared here with every PDB checked, over selectors of every shape."""
    import random

    rng = random.Random(7)
    keys, values = ["app", "tier", "team"], ["a", "b", "c"]
    objects = []
    for i in range(60):
        selector: dict | None
        shape = i % 5
        if shape == 0:
            selector = None  # selects nothing
        elif shape == 1:
            selector = {}  # every pod of the namespace
        elif shape == 2:
            selector = {
                "matchExpressions": [{"key": rng.choice(keys), "operator": "In", "values": ["a", "b"]}]
            }
        else:
            labels = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(1, 2))}
            selector = {"matchLabels": labels}
        spec = {"maxUnavailable": 1} | ({"selector": selector} if selector is not None else {})
        objects.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": f"pdb-{i}", "namespace": f"ns-{i % 2}"},
                "spec": spec,
            }
        )
    for i in range(200):
        labels = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 3))}
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p-{i}", "namespace": f"ns-{i % 2}", "labels": labels},
                "spec": {"containers": [{"name": "c", "image": "i"}]},
            }
        )
    snapshot = Snapshot.from_objects(objects, DEFAULT_NOW)
    assert len(snapshot.pdbs) == 60 and len(snapshot.pods) == 200
    matched = 0
    for pod in snapshot.pods:
        expected = tuple(pdb for pdb in snapshot.pdbs if pdb.selects(pod))
        assert snapshot.pdbs_for(pod) == expected, pod.name
        matched += bool(expected)
    assert matched > 50  # the comparison is not vacuous


def test_ec2s_describe_instances_output_gives_the_nodes_instances(tmp_path):
    """A node's AMI, subnet and security groups are EC2's: `aws ec2 describe-instances --output json`
    beside the objects (a second file, or a second YAML document) links them by providerID."""
    b = small_cluster()
    b.instances[0].update(ImageId="ami-1", SubnetId="subnet-a", SecurityGroups=[{"GroupId": "sg-1"}])
    objects = b.write(tmp_path / "cluster.json")
    instances = b.write_instances(tmp_path / "instances.json")
    for snapshot in (load_snapshot([objects, instances]), load_snapshot(b.write(tmp_path / "both.yaml"))):
        n1 = snapshot.nodes["n1"].instance
        assert n1 is not None and (n1.image_id, n1.subnet_id) == ("ami-1", "subnet-a")
        assert n1.security_group_ids == frozenset({"sg-1"})
        assert snapshot.nodes["n2"].instance is not None
        assert snapshot.problems == []
    assert load_snapshot(objects).nodes["n1"].instance is None  # not told: unknown, not empty


def test_a_malformed_describe_instances_document_is_reported(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"Reservations": {"Instances": []}}))
    with pytest.raises(SnapshotError, match="Reservations must be a list"):
        load_snapshot(path)
    instance = {"InstanceId": "i-1", "SecurityGroups": 3}
    path.write_text(json.dumps({"Reservations": [{"Instances": [instance]}]}))
    assert load_snapshot(path).problems == ["EC2 instance i-1: SecurityGroups must be a list"]


def test_either_disruption_taint_key_marks_a_node_as_disrupting():
    """Karpenter's key, karpflow's own beside Karpenter, or v1beta1's: the planner counts each node as
    a disruption in flight (budgets, candidates), whoever holds it."""
    b = ClusterBuilder()
    b.node("karpenter", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}])
    b.node("karpflow", taints=[{"key": "karpflow.dev/disrupted", "effect": "NoSchedule"}])
    b.node("leaving", taints=[{"key": "karpflow.io/leaving", "effect": "PreferNoSchedule"}])
    nodes = b.snapshot().nodes
    assert nodes["karpenter"].disruption_taint == "karpenter.sh/disrupted"
    assert nodes["karpflow"].disruption_taint == "karpflow.dev/disrupted"
    assert nodes["leaving"].disruption_taint is None
