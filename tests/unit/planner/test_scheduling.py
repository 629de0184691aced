"""The scheduling simulation, one rule per test (behaviour notes §2.6)."""

from __future__ import annotations

import pytest

from planner.catalog import catalog_from_dict
from planner.scheduling.results import IGNORE
from tests.unit.planner.sched_fixtures import (
    daemonset,
    from_yaml,
    make_catalog,
    node,
    nodepool,
    pod,
    replicas,
    simulation,
    snapshot,
)

GI = 1 << 30


def run(snap, remove, *, policy="Respect", catalog=None, **kwargs):
    sim = simulation(snap, policy=policy, **({"catalog": catalog} if catalog else {}))
    return sim.run(remove, **kwargs)


# --- resources ------------------------------------------------------------------------------------


def test_moved_pods_land_on_remaining_nodes_with_room():
    snap = snapshot(nodepool(), node("a"), node("b"), replicas("web", [("a", 2), ("b", 2)]))
    result = run(snap, ["b"])
    assert result.all_non_pending_scheduled
    assert set(result.placements.values()) == {"a"}
    assert result.new_claims == []


def test_cpu_requests_beyond_free_room_need_a_new_node():
    # a (4 cpu) already runs 3 cpu; b's 2 x 1 cpu cannot both fit there.
    snap = snapshot(nodepool(), node("a"), node("b"), replicas("web", [("a", 3), ("b", 2)]))
    result = run(snap, ["b"])
    assert sorted(result.placements.values()) == ["a", "new-nodeclaim-0"]
    assert len(result.new_claims) == 1


def test_memory_requests_count_like_cpu():
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        pod("big", "a", cpu="100m", memory="15Gi"),
        pod("mover", "b", cpu="100m", memory="2Gi"),
    )
    assert run(snap, ["b"]).placements["default/mover"] == "new-nodeclaim-0"


def test_pod_count_is_a_resource():
    # 30 pods allocatable on a: 29 tiny pods leave room for one more, not two.
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        replicas("tiny", [("a", 29)], cpu="1m", memory="1Mi"),
        replicas("mover", [("b", 2)], cpu="1m", memory="1Mi"),
    )
    result = run(snap, ["b"])
    assert sorted(result.placements.values()) == ["a", "new-nodeclaim-0"]


def test_extended_resources_need_allocatable_of_that_resource():
    gpu_pod = pod("trainer", "b", cpu="100m", memory="100Mi")
    gpu_pod["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    snap = snapshot(nodepool(), node("a"), node("b"), gpu_pod)
    result = run(snap, ["b"])
    assert not result.all_non_pending_scheduled
    assert "nvidia.com/gpu" in result.unschedulable["default/trainer"]


EPHEMERAL_STORAGE_NODE = """
kind: Node
metadata:
  name: {name}
  labels:
    karpenter.sh/nodepool: default
    karpenter.sh/initialized: "true"
    karpenter.sh/capacity-type: on-demand
    topology.kubernetes.io/zone: test-1a
    node.kubernetes.io/instance-type: m5.xlarge
    kubernetes.io/arch: amd64
status:
  allocatable: {cpu: "4", memory: 16Gi, pods: "30", ephemeral-storage: 20Gi}
  conditions: [{type: Ready, status: "True"}]
"""
EPHEMERAL_STORAGE_POD = """
kind: Pod
metadata: {name: {name}, namespace: default}
spec:
  nodeName: {node}
  containers: [{name: c, resources: {requests: {cpu: 100m, ephemeral-storage: {storage}}}}]
status: {phase: Running}
"""


def _yaml(template: str, **values: str) -> list[dict]:
    for key, value in values.items():
        template = template.replace("{" + key + "}", value)
    return from_yaml(template)


@pytest.mark.parametrize(
    ("request_", "lands_on"),
    [("4Gi", "a"), ("10Gi", "new-nodeclaim-0"), ("18Gi", None)],  # a has 5Gi left; new nodes 17Gi
)
def test_ephemeral_storage_requests_limit_where_moved_pods_fit(request_, lands_on):
    # New nodes: the bundled table's 20Gi root volume, 17Gi of it allocatable.
    catalog = catalog_from_dict(
        {
            "region": "test-1",
            "instanceTypes": [
                {
                    "name": "m5.xlarge",
                    "cpu": "4",
                    "memory": "16Gi",
                    "pods": 30,
                    "allocatable": {"cpu": "4", "memory": "16Gi", "pods": "30", "ephemeral-storage": "17Gi"},
                    "offerings": [{"zone": "test-1a", "capacityType": "on-demand", "price": 0.192}],
                }
            ],
        }
    )
    snap = snapshot(
        nodepool(),
        _yaml(EPHEMERAL_STORAGE_NODE, name="a"),
        _yaml(EPHEMERAL_STORAGE_NODE, name="b"),
        _yaml(EPHEMERAL_STORAGE_POD, name="scratch", node="a", storage="15Gi"),
        _yaml(EPHEMERAL_STORAGE_POD, name="mover", node="b", storage=request_),
    )
    result = run(snap, ["b"], catalog=catalog)
    assert result.placements.get("default/mover") == lands_on
    assert result.all_non_pending_scheduled == (lands_on is not None)


def test_daemonset_overhead_shrinks_new_nodes():
    # 3.5 cpu of pods fit a 4-cpu type only without the 1-cpu daemon: the claim must skip 4-cpu types.
    snap = snapshot(
        nodepool(),
        node("a"),
        daemonset("agent", cpu="1", memory="128Mi"),
        replicas("web", [("a", 1)], cpu="3500m", memory="1Gi"),
    )
    result = run(snap, ["a"])
    options = result.new_claims[0].instance_types
    assert options and all(t in ("m5.2xlarge", "m5.4xlarge") for t in options)


def test_daemonset_overhead_counts_only_daemons_that_would_run_on_the_node():
    arm_only = daemonset("arm-agent", cpu="1", nodeSelector={"kubernetes.io/arch": "arm64"})
    tainted_only = daemonset("gpu-agent", cpu="1", tolerations=[])
    pool = nodepool(
        requirements=[
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ],
        taints=[{"key": "dedicated", "value": "web", "effect": "NoSchedule"}],
    )
    web = replicas(
        "web", [("a", 1)], cpu="3500m", memory="1Gi", tolerations=[{"key": "dedicated", "operator": "Exists"}]
    )
    snap = snapshot(pool, node("a"), arm_only, tainted_only, web)
    result = run(snap, ["a"])
    assert "c5.xlarge" in result.new_claims[0].instance_types  # 4 cpu, no daemon overhead


# --- node selection -------------------------------------------------------------------------------


def test_node_selector_restricts_existing_nodes():
    snap = snapshot(
        nodepool(),
        node("a", labels={"disk": "hdd"}),
        node("c", labels={"disk": "ssd"}),
        node("b"),
        pod("db", "b", nodeSelector={"disk": "ssd"}),
    )
    assert run(snap, ["b"]).placements["default/db"] == "c"


def test_required_node_affinity_terms_are_ored_and_expressions_anded():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "disk", "operator": "In", "values": ["ssd"]},
                            {"key": "tier", "operator": "NotIn", "values": ["batch"]},
                        ]
                    },
                    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                ]
            }
        }
    }
    snap = snapshot(
        nodepool(),
        node("a", labels={"disk": "ssd", "tier": "batch"}),  # first term fails on tier, second on gpu
        node("c", labels={"gpu": "t4"}),  # second term holds
        node("b"),
        pod("app", "b", affinity=affinity),
    )
    assert run(snap, ["b"]).placements["default/app"] == "c"


def test_gt_and_lt_select_instance_types_by_number():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["2"]},
                            {"key": "karpenter.k8s.aws/instance-cpu", "operator": "Lt", "values": ["16"]},
                        ]
                    }
                ]
            }
        }
    }
    snap = snapshot(nodepool(), node("a"), pod("app", "a", cpu="100m", affinity=affinity))
    options = set(run(snap, ["a"]).new_claims[0].instance_types)
    assert options == {"c5.xlarge", "m5.xlarge", "m5.2xlarge"}


def test_nodepool_requirements_restrict_instance_types():
    pool = nodepool(
        requirements=[
            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]},
            {"key": "node.kubernetes.io/instance-type", "operator": "NotIn", "values": ["m5.large"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ]
    )
    snap = snapshot(pool, node("a"), pod("app", "a", cpu="100m"))
    assert run(snap, ["a"]).new_claims[0].instance_types == ("m5.xlarge", "m5.2xlarge", "m5.4xlarge")


def test_arch_requirement_of_the_pod_narrows_the_new_node():
    pool = nodepool(requirements=[])
    snap = snapshot(
        pool, node("a"), pod("app", "a", cpu="100m", nodeSelector={"kubernetes.io/arch": "arm64"})
    )
    claim = run(snap, ["a"]).new_claims[0]
    assert claim.instance_types == ("m6g.large",)


def test_capacity_type_and_zone_requirements_choose_offerings():
    pool = nodepool(
        requirements=[
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["test-1b"]},
        ]
    )
    snap = snapshot(pool, node("a"), pod("app", "a", cpu="100m", memory="1Gi"))
    claim = run(snap, ["a"]).new_claims[0]
    assert claim.capacity_types == ("spot",) and claim.zones == ("test-1b",)
    assert claim.options[0].instance_type == "m6g.large" and claim.cheapest_price == pytest.approx(0.032)


def test_unavailable_offerings_are_not_launched():
    catalog = make_catalog(
        unavailable=[("m6g.large", z, ct) for z in ("test-1a", "test-1b") for ct in ("spot", "on-demand")]
    )
    snap = snapshot(nodepool(requirements=[]), node("a"), pod("app", "a", cpu="100m"))
    assert "m6g.large" not in run(snap, ["a"], catalog=catalog).new_claims[0].instance_types


def test_custom_label_required_by_a_pod_must_be_defined_by_the_nodepool():
    selector = {"team": "payments"}
    without = snapshot(nodepool(), node("a"), pod("app", "a", nodeSelector=selector))
    assert not run(without, ["a"]).all_non_pending_scheduled
    with_label = snapshot(
        nodepool(labels={"team": "payments"}), node("a"), pod("app", "a", nodeSelector=selector)
    )
    assert run(with_label, ["a"]).new_claims[0].nodepool == "default"


def test_nodepool_weight_orders_templates():
    heavy = nodepool(
        "heavy",
        weight=50,
        requirements=[
            {"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["r5"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ],
    )
    snap = snapshot(nodepool(), heavy, node("a"), pod("app", "a", cpu="100m"))
    assert run(snap, ["a"]).new_claims[0].nodepool == "heavy"


def test_nodepool_limits_count_existing_nodes():
    # Pool limit 10 cpu; nodes a (4) and c (4) remain: only 2 cpu left, so only 2-cpu types qualify.
    snap = snapshot(
        nodepool(limits={"cpu": "10"}),
        node("a"),
        node("c"),
        node("b"),
        replicas("fill", [("a", 4), ("c", 4)]),
        pod("app", "b", cpu="500m"),
    )
    claim = run(snap, ["b"]).new_claims[0]
    assert set(claim.instance_types) == {"c5.large", "m5.large", "r5.large", "m6g.large"}


def test_nodepool_limits_exhausted_means_no_new_node():
    snap = snapshot(
        nodepool(limits={"cpu": "8"}),
        node("a"),
        node("c"),
        node("b"),
        replicas("fill", [("a", 4), ("c", 4)]),
        pod("app", "b", cpu="500m"),
    )
    result = run(snap, ["b"])
    assert not result.all_non_pending_scheduled
    assert "limits" in result.unschedulable["default/app"]


# --- taints ---------------------------------------------------------------------------------------


def test_untolerated_noschedule_taint_blocks_but_prefernoschedule_does_not():
    snap = snapshot(
        nodepool(),
        node("a", taints=[{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
        node("c", taints=[{"key": "soft", "effect": "PreferNoSchedule"}]),
        node("b"),
        pod("app", "b"),
    )
    assert run(snap, ["b"]).placements["default/app"] == "c"


def test_tolerated_taint_admits_the_pod():
    snap = snapshot(
        nodepool(),
        node("a", taints=[{"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
        node("b"),
        pod("db", "b", tolerations=[{"key": "dedicated", "operator": "Equal", "value": "db"}]),
    )
    assert run(snap, ["b"]).placements["default/db"] == "a"


def test_nodepool_taints_apply_to_new_nodes_but_startup_taints_do_not():
    tainted = nodepool("tainted", weight=10, taints=[{"key": "gpu", "effect": "NoSchedule"}])
    startup = nodepool("startup", startup_taints=[{"key": "cni-not-ready", "effect": "NoSchedule"}])
    snap = snapshot(tainted, startup, node("a"), pod("app", "a"))
    assert run(snap, ["a"]).new_claims[0].nodepool == "startup"


def test_cordoned_and_disrupted_nodes_are_not_destinations():
    snap = snapshot(
        nodepool(),
        node("a", unschedulable=True),
        node("c", taints=[{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]),
        node("b"),
        pod("app", "b"),
    )
    assert run(snap, ["b"]).placements["default/app"] == "new-nodeclaim-0"


# --- host ports -----------------------------------------------------------------------------------


def test_host_ports_conflict_per_node():
    def with_port(name, node_name, ip="0.0.0.0"):
        p = pod(name, node_name, labels={"app": "proxy"})
        p["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080, "hostIP": ip}]
        return p

    snap = snapshot(
        nodepool(), node("a"), node("b"), with_port("p1", "a"), with_port("p2", "b", ip="10.0.0.1")
    )
    assert run(snap, ["b"]).placements["default/p2"] == "new-nodeclaim-0"


# --- pod (anti-)affinity and spreads --------------------------------------------------------------

ANTI_HOST = {
    "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "kubernetes.io/hostname"}
        ]
    }
}


def test_required_anti_affinity_keeps_replicas_apart():
    snap = snapshot(
        nodepool(),
        node("a"),
        node("c"),
        node("b"),
        replicas("cache", [("a", 1), ("b", 1)], affinity=ANTI_HOST),
    )
    assert run(snap, ["b"]).placements["default/cache-1"] == "c"
    both = run(snap, ["b", "c"])
    assert both.placements["default/cache-1"] == "new-nodeclaim-0"


def test_new_nodes_respect_anti_affinity_between_moved_pods():
    snap = snapshot(
        nodepool(), node("a"), node("b"), replicas("cache", [("a", 1), ("b", 1)], affinity=ANTI_HOST)
    )
    result = run(snap, ["a", "b"])
    assert len(result.new_claims) == 2


def test_anti_affinity_of_pods_already_running_repels_newcomers():
    guard = pod(
        "guard",
        "a",
        labels={"app": "guard"},
        affinity={
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {"app": "noisy"}},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
    )
    snap = snapshot(
        nodepool(), node("a"), node("c"), node("b"), guard, pod("noisy", "b", labels={"app": "noisy"})
    )
    assert run(snap, ["b"]).placements["default/noisy"] == "c"


def test_zone_anti_affinity_pins_the_new_node_to_a_free_zone():
    anti_zone = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"app": "cache"}},
                    "topologyKey": "topology.kubernetes.io/zone",
                }
            ]
        }
    }
    snap = snapshot(
        nodepool(),
        node("a", zone="test-1a"),
        node("b", zone="test-1b"),
        replicas("cache", [("a", 1), ("b", 1)], affinity=anti_zone, cpu="3"),
    )
    result = run(snap, ["b"])
    assert result.new_claims[0].zones == ("test-1b",)


def test_required_pod_affinity_follows_the_target():
    affinity = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    snap = snapshot(
        nodepool(),
        node("a"),
        node("c"),
        node("b"),
        pod("db", "c", labels={"app": "db"}),
        pod("app", "b", affinity=affinity),
    )
    assert run(snap, ["b"]).placements["default/app"] == "c"


def test_zone_spread_respects_max_skew():
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    # web: 2 in test-1a (node a), 1 in test-1b (node b). Moving b's pod: 1b would drop to 0 and
    # a third pod in 1a would make a skew of 3 - 0 > 1, so the pod needs a new node in test-1b.
    snap = snapshot(
        nodepool(),
        node("a", zone="test-1a"),
        node("b", zone="test-1b"),
        replicas("web", [("a", 2), ("b", 1)], topologySpreadConstraints=spread, cpu="100m"),
    )
    result = run(snap, ["b"])
    assert result.placements["default/web-2"] == "new-nodeclaim-0"
    assert result.new_claims[0].zones == ("test-1b",)


def test_hostname_spread_caps_pods_per_node():
    spread = [
        {
            "maxSkew": 2,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        replicas("web", [("a", 2), ("b", 1)], topologySpreadConstraints=spread, cpu="100m"),
    )
    assert run(snap, ["b"]).placements["default/web-2"] == "new-nodeclaim-0"


def test_min_domains_forces_zero_minimum_when_too_few_domains():
    def spread(min_domains):
        constraint = {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
        return [{**constraint, "minDomains": min_domains}] if min_domains else [constraint]

    def cluster(min_domains):
        # After b goes: one web pod in each zone. The mover makes a zone hold 2: skew 1 against a
        # minimum of 1, but skew 2 when minDomains (3) exceeds the 2 zones and the minimum counts as 0.
        return snapshot(
            nodepool(
                requirements=[
                    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                    {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["x"]},
                ]
            ),
            node("a", zone="test-1a"),
            node("c", zone="test-1b"),
            node("b", zone="test-1b"),
            replicas(
                "web",
                [("a", 1), ("c", 1), ("b", 1)],
                topologySpreadConstraints=spread(min_domains),
                cpu="100m",
            ),
        )

    assert run(cluster(None), ["b"]).all_non_pending_scheduled
    assert not run(cluster(3), ["b"]).all_non_pending_scheduled


# --- preferences ----------------------------------------------------------------------------------

PREFERRED_ANTI = {
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 100,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app": "web"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    }
}


def test_respect_policy_treats_preferred_anti_affinity_as_required_first():
    snap = snapshot(
        nodepool(), node("a"), node("b"), replicas("web", [("a", 1), ("b", 1)], affinity=PREFERRED_ANTI)
    )
    assert run(snap, ["b"]).placements["default/web-1"] == "new-nodeclaim-0"


def test_respect_policy_relaxes_a_preference_that_cannot_be_met():
    # No NodePool can launch: the preference is relaxed and the pod shares node a.
    snap = snapshot(
        nodepool(
            requirements=[{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["x.none"]}]
        ),
        node("a"),
        node("b"),
        replicas("web", [("a", 1), ("b", 1)], affinity=PREFERRED_ANTI),
    )
    assert run(snap, ["b"]).placements["default/web-1"] == "a"


def test_ignore_policy_drops_preferences():
    snap = snapshot(
        nodepool(), node("a"), node("b"), replicas("web", [("a", 1), ("b", 1)], affinity=PREFERRED_ANTI)
    )
    assert run(snap, ["b"], policy=IGNORE).placements["default/web-1"] == "a"


def test_schedule_anyway_spread_is_a_preference():
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        replicas("web", [("a", 1), ("b", 1)], topologySpreadConstraints=spread, cpu="100m"),
    )
    assert run(snap, ["b"]).placements["default/web-1"] == "new-nodeclaim-0"
    assert run(snap, ["b"], policy=IGNORE).placements["default/web-1"] == "a"


def test_preferred_node_affinity_heaviest_first():
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchExpressions": [{"key": "disk", "operator": "In", "values": ["hdd"]}]
                    },
                },
                {
                    "weight": 90,
                    "preference": {
                        "matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]
                    },
                },
            ]
        }
    }
    snap = snapshot(
        nodepool(),
        node("a", labels={"disk": "hdd"}),
        node("c", labels={"disk": "ssd"}),
        node("b"),
        pod("app", "b", affinity=affinity),
    )
    assert run(snap, ["b"]).placements["default/app"] == "c"


# --- node state -----------------------------------------------------------------------------------


def test_pods_may_not_land_on_uninitialized_nodes():
    snap = snapshot(nodepool(), node("a", initialized=False), node("b"), pod("app", "b"))
    result = run(snap, ["b"])
    assert result.placements["default/app"] == "a"  # like Karpenter: placed there, then counted as failed
    assert "uninitialized" in result.unschedulable["default/app"]
    assert not result.all_non_pending_scheduled


def test_pods_of_deleting_nodes_move_too_and_may_use_uninitialized_nodes():
    snap = snapshot(
        nodepool(),
        node("a", initialized=False),
        node("d", deleting=True),
        node("b"),
        pod("leaving", "d", cpu="3"),
        pod("app", "b", cpu="500m"),
    )
    sim = simulation(snap)
    assert {p.name for p in sim.default_pods(["b"])} == {"app", "leaving"}
    result = sim.run(["b"])
    assert result.placements["default/leaving"] == "a"
    assert "default/leaving" not in result.unschedulable


def test_background_pods_go_first_and_their_new_nodes_are_not_replacements():
    # A pending pod needs a new node whatever happens; the moved pod must not count it, nor use it.
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        pod("fill", "a", cpu="3"),
        pod("app", "b", cpu="3500m"),
        pod("waiting", None, cpu="3"),
    )
    result = run(snap, ["b"], max_new_claims=1)
    assert result.all_non_pending_scheduled
    background = [c for c in result.new_claims if c.background]
    assert [c.pods for c in background] == [["default/waiting"]]
    assert [c.pods for c in result.replacements] == [["default/app"]]


def test_launched_nodeclaims_without_a_node_are_in_flight_capacity():
    claim = {
        "kind": "NodeClaim",
        "metadata": {
            "name": "default-x1",
            "labels": {
                "karpenter.sh/nodepool": "default",
                "node.kubernetes.io/instance-type": "m5.xlarge",
                "topology.kubernetes.io/zone": "test-1a",
                "karpenter.sh/capacity-type": "on-demand",
            },
        },
        "status": {"conditions": [{"type": "Launched", "status": "True"}]},
    }
    snap = snapshot(
        nodepool(),
        claim,
        node("d", deleting=True),
        node("b"),
        pod("leaving", "d", cpu="3"),
        pod("app", "b", cpu="3"),
    )
    result = run(snap, ["b"])
    assert result.placements["default/leaving"] == "default-x1"
    assert result.placements["default/app"] == "new-nodeclaim-0"  # not the uninitialized in-flight node


def test_pending_pods_are_placed_and_their_failure_is_tolerated():
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        pod("app", "b"),
        pod("huge", None, cpu="100"),
        pod("small", None, cpu="100m"),
    )
    result = run(snap, ["b"])
    assert "default/huge" in result.unschedulable
    assert result.all_non_pending_scheduled
    assert result.placements["default/small"] == "a"


def test_do_not_disrupt_pods_and_fully_blocked_pdb_pods_are_not_moved():
    pdb = {
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "db"}}},
    }
    snap = snapshot(
        nodepool(),
        node("b"),
        pod("db", "b", labels={"app": "db"}),
        pdb,
        pod("pinned", "b", annotations={"karpenter.sh/do-not-disrupt": "true"}),
        pod("app", "b"),
        pod("ds", "b", owner="DaemonSet"),
    )
    assert [p.name for p in simulation(snap).default_pods(["b"])] == ["app"]


# --- new nodes ------------------------------------------------------------------------------------


def test_new_node_options_are_in_price_order_and_narrow_as_pods_join():
    snap = snapshot(nodepool(), node("a"), replicas("web", [("a", 3)], cpu="1", memory="3Gi"))
    claim = run(snap, ["a"]).new_claims[0]
    # 3 cpu / 9 GiB: c5.xlarge (8 GiB) and the 2-cpu types are out; cheapest first.
    assert claim.instance_types == ("m5.xlarge", "m5.2xlarge", "m5.4xlarge")
    assert [o.price for o in claim.options] == sorted(o.price for o in claim.options)
    assert claim.requests["cpu"] == 3000 and claim.requests["memory"] == 9 * GI


def test_pods_too_big_for_one_node_open_several_claims_first_fit_decreasing():
    snap = snapshot(nodepool(), node("a", "m5.4xlarge"), replicas("big", [("a", 3)], cpu="10", memory="1Gi"))
    result = run(snap, ["a"])
    assert len(result.new_claims) == 3
    assert all(c.instance_types == ("m5.4xlarge",) for c in result.new_claims)


def test_min_values_needs_enough_distinct_instance_types():
    pool = nodepool(
        requirements=[
            {"key": "node.kubernetes.io/instance-type", "operator": "Exists", "minValues": 4},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
        ]
    )
    fits_many = snapshot(pool, node("a"), pod("small", "a", cpu="100m"))
    assert len(run(fits_many, ["a"]).new_claims[0].instance_types) >= 4
    fits_two = snapshot(pool, node("a"), pod("big", "a", cpu="7", memory="2Gi"))
    assert not run(fits_two, ["a"]).all_non_pending_scheduled


def test_worst_launch_price_uses_spot_when_spot_is_allowed():
    pool = nodepool(
        requirements=[
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}
        ]
    )
    snap = snapshot(pool, node("a"), pod("app", "a", cpu="100m"))
    claim = run(snap, ["a"]).new_claims[0]
    first = claim.options[0]
    assert claim.capacity_types == ("on-demand", "spot")
    assert first.price == pytest.approx(0.032) and first.worst_price == pytest.approx(0.032)


def test_unschedulable_pods_carry_a_reason_per_nodepool():
    snap = snapshot(
        nodepool(taints=[{"key": "gpu", "effect": "NoSchedule"}]), node("a"), pod("app", "a", cpu="3")
    )
    result = run(snap, ["a"])
    why = result.unschedulable["default/app"]
    assert "no existing node has room" in why and "NodePool default: does not tolerate taint gpu" in why


# --- early stop and determinism -------------------------------------------------------------------


def test_max_new_claims_stops_as_soon_as_a_second_node_is_needed():
    snap = snapshot(nodepool(), node("a", "m5.4xlarge"), replicas("big", [("a", 3)], cpu="10"))
    result = run(snap, ["a"], max_new_claims=1)
    assert result.aborted and "more than 1 new node" in result.aborted
    assert not result.all_non_pending_scheduled


def test_stop_on_failure_reports_the_first_non_pending_failure():
    snap = snapshot(nodepool(), node("a"), pod("huge", "a", cpu="100"))
    result = run(snap, ["a"], stop_on_failure=True)
    assert result.aborted and "default/huge" in result.aborted


def test_probes_do_not_leak_into_each_other():
    snap = snapshot(
        nodepool(), node("a"), node("b"), node("c"), replicas("web", [("a", 3), ("b", 1), ("c", 1)])
    )
    sim = simulation(snap)
    first = sim.run(["b"])
    sim.run(["c"])
    again = sim.run(["b"])
    assert first.placements == again.placements == {"default/web-3": "a"}


def test_yaml_snapshot_round_trip():
    objects = from_yaml("""
kind: Node
metadata:
  name: lone
  labels:
    karpenter.sh/nodepool: default
    karpenter.sh/initialized: "true"
    topology.kubernetes.io/zone: test-1a
    node.kubernetes.io/instance-type: m5.large
    karpenter.sh/capacity-type: on-demand
status: {allocatable: {cpu: "2", memory: 8Gi, pods: "30"}, capacity: {cpu: "2", memory: 8Gi, pods: "30"}}
---
kind: Pod
metadata: {name: api, namespace: shop, labels: {app: api}}
spec:
  nodeName: lone
  containers: [{name: c, resources: {requests: {cpu: 1500m, memory: 2Gi}}}]
status: {phase: Running}
""")
    snap = snapshot(nodepool(), objects)
    claim = run(snap, ["lone"]).new_claims[0]
    assert claim.pods == ["shop/api"] and claim.instance_types[0] == "m6g.large"  # cheapest 2-cpu type


def test_background_pods_on_a_removed_node_are_placed_again():
    # The pending pod lands on b in the background placement; a probe removing b must move it.
    snap = snapshot(
        nodepool(), node("a"), node("b"), pod("fill", "a", cpu="3"), pod("waiting", None, cpu="2")
    )
    sim = simulation(snap)
    assert sim.run([]).placements["default/waiting"] == "b"
    moved = sim.run(["b"])
    assert moved.placements["default/waiting"] == "new-nodeclaim-0"
    assert [c.background for c in moved.new_claims] == [True]
    assert sim.run([]).placements["default/waiting"] == "b"  # the shared background state is intact


def test_spread_counts_background_pods_placed_before_its_group_existed():
    # a (1a) and b (1b) run one web pod each; the pending web pod lands on a, making 1a hold 2.
    # The moved pod spreads web over zones with maxSkew 1, so it must go to b, not a. Its group is
    # new to the simulator when it arrives (the pod is not in the snapshot the simulator was built on).
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    base = [
        nodepool(),
        node("a", zone="test-1a"),
        node("b", zone="test-1b"),
        node("c", zone="test-1b"),
        pod("web-a", "a", labels={"app": "web"}, cpu="100m"),
        pod("web-b", "b", labels={"app": "web"}, cpu="100m"),
        pod("web-pending", None, labels={"app": "web"}, cpu="100m"),
    ]
    spreader = pod("spreader", "c", labels={"app": "web"}, cpu="100m", topologySpreadConstraints=spread)
    sim = simulation(snapshot(*base))
    sim.run(["c"])  # computes and caches the background placement
    [moving] = [p for p in snapshot(*base, spreader).pods if p.name == "spreader"]
    result = sim.run(["c"], [moving])
    assert result.placements["default/web-pending"] == "a"
    assert result.placements["default/spreader"] == "b"
    assert simulation(snapshot(*base, spreader)).run(["c"]).placements["default/spreader"] == "b"


def test_region_and_deprecated_labels_do_not_rule_out_instance_types():
    region = snapshot(
        nodepool(requirements=[]),
        node("a"),
        pod("app", "a", cpu="100m", nodeSelector={"topology.kubernetes.io/region": "test-1"}),
    )
    assert run(region, ["a"]).new_claims[0].instance_types
    beta_arch = snapshot(
        nodepool(requirements=[]),
        node("a"),
        pod("app", "a", cpu="100m", nodeSelector={"beta.kubernetes.io/arch": "arm64"}),
    )
    assert run(beta_arch, ["a"]).new_claims[0].instance_types == ("m6g.large",)


def test_selectors_without_match_labels_still_count_pods():
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [{"key": "app", "operator": "In", "values": ["cache"]}]
                    },
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    snap = snapshot(
        nodepool(), node("a"), node("c"), node("b"), replicas("cache", [("a", 1), ("b", 1)], affinity=anti)
    )
    assert run(snap, ["b"]).placements["default/cache-1"] == "c"


# --- cost-aware packing of new nodes (the max_replacements extension) ------------------------------

AMD64_ON_DEMAND = [
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
]


def lopsided_pair(*extra):
    """Two m5.4xlarge: a runs 2 CPU-heavy pods (3.5 cpu, 1Gi), b 2 memory-heavy ones (1 cpu, 14Gi)."""
    return snapshot(
        nodepool(requirements=AMD64_ON_DEMAND),
        node("a", "m5.4xlarge"),
        node("b", "m5.4xlarge"),
        replicas("cpu", [("a", 2)], cpu="3500m", memory="1Gi"),
        replicas("mem", [("b", 2)], cpu="1", memory="14Gi"),
        *extra,
    )


def launch_price(result):
    return sum(claim.options[0].price for claim in result.replacements)


def test_cost_packing_sizes_each_new_node_for_what_it_holds():
    # Karpenter's packing grows one claim to 9 cpu: only an m5.4xlarge ($0.768) holds it. Sized one
    # node at a time, the pods fit an m5.2xlarge and a c5.xlarge ($0.554 together).
    snap = lopsided_pair()
    karpenter = run(snap, ["a", "b"], max_new_claims=5)
    cost = run(snap, ["a", "b"], max_new_claims=5, packing="cost")
    assert [c.options[0].instance_type for c in karpenter.replacements] == ["m5.4xlarge"]
    assert cost.all_non_pending_scheduled
    assert sorted(c.options[0].instance_type for c in cost.replacements) == ["c5.xlarge", "m5.2xlarge"]
    assert launch_price(cost) == pytest.approx(0.554)
    assert launch_price(karpenter) == pytest.approx(0.768)
    placed = {key for claim in cost.replacements for key in claim.pods}
    assert placed == {"default/cpu-0", "default/cpu-1", "default/mem-0", "default/mem-1"}


def test_cost_packing_fills_existing_nodes_before_new_ones():
    snap = lopsided_pair(node("c", "m5.xlarge"))
    result = run(snap, ["a", "b"], max_new_claims=5, packing="cost")
    assert result.placements["default/cpu-0"] == "c"  # 3.5 cpu fit c's 4; the rest go to new nodes
    assert all(key != "default/cpu-0" for claim in result.replacements for key in claim.pods)


def test_cost_packing_keeps_the_claim_rules():
    # Required anti-affinity on the hostname: three replicas need three new nodes in any packing.
    snap = snapshot(
        nodepool(),
        node("a"),
        node("b"),
        replicas("cache", [("a", 2), ("b", 1)], affinity=ANTI_HOST, cpu="100m", memory="128Mi"),
    )
    result = run(snap, ["a", "b"], max_new_claims=5, packing="cost")
    assert result.all_non_pending_scheduled
    assert len({result.placements[f"default/cache-{i}"] for i in range(3)}) == 3


def test_cost_packing_stops_past_the_new_node_limit():
    result = run(lopsided_pair(), ["a", "b"], max_new_claims=1, packing="cost", stop_on_failure=True)
    assert result.aborted and "more than 1 new node" in result.aborted
