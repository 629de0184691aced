"""The simulated kube-scheduler's filters, each with the kube-scheduler behaviour it reproduces
(kubernetes/kubernetes pkg/scheduler/framework/plugins/...; the files are named in each test)."""

from .scheduler_helpers import (
    HOSTNAME,
    ZONE,
    affinity,
    anti_affinity,
    make_namespace,
    make_node,
    make_pod,
    new_store,
    placement,
    scheduled_condition,
    scheduler_for,
    zone_spread,
)

# --- InterPodAffinity (interpodaffinity/filtering.go) ---------------------------------------------


async def test_required_anti_affinity_keeps_two_replicas_off_one_node():
    """satisfyPodAntiAffinity + satisfyExistingPodsAntiAffinity: a replica with hostname
    anti-affinity against its own label never joins another on the same node; restricted to one
    node, the second waits with kube-scheduler's counted reasons."""
    store = new_store()
    make_node(store, "a", labels={"pool": "x"})
    make_node(store, "b", labels={"pool": "y"})
    for name in ("web-1", "web-2"):
        make_pod(
            store, name, labels={"app": "web"}, nodeSelector={"pool": "x"}, affinity=anti_affinity("web")
        )
    scheduler = scheduler_for(store)
    assert await scheduler.schedule_pass() == 1
    assert placement(store) == {"web-1": "a", "web-2": None}
    cond = scheduled_condition(store, "web-2")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert cond["message"] == (
        "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) didn't match pod anti-affinity rules."
    )


async def test_an_existing_pods_anti_affinity_keeps_the_incoming_pod_out_of_its_zone():
    """satisfyExistingPodsAntiAffinity: the existing pod's required term selects the incoming pod
    (which has no affinity of its own): every node of that zone is refused."""
    store = new_store()
    make_node(store, "a1", zone="a")
    make_node(store, "a2", zone="a")
    make_node(store, "b1", zone="b", cpu="1")  # the fullest node: the last LeastAllocated would pick
    make_pod(store, "loner", labels={"app": "loner"}, nodeName="a1", affinity=anti_affinity("web", key=ZONE))
    make_pod(store, "web", labels={"app": "web"})
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["web"] == "b1"


async def test_existing_anti_affinity_reason_in_the_message():
    store = new_store()
    make_node(store, "a1", zone="a")
    make_pod(store, "loner", labels={"app": "loner"}, nodeName="a1", affinity=anti_affinity("web", key=ZONE))
    make_pod(store, "web", labels={"app": "web"})
    assert await scheduler_for(store).schedule_pass() == 0
    assert scheduled_condition(store, "web")["message"] == (
        "0/1 nodes are available: 1 node(s) didn't satisfy existing pods anti-affinity rules."
    )


async def test_required_affinity_follows_the_target_into_its_zone():
    """satisfyPodAffinity: only nodes in a zone where a pod matching the term runs pass."""
    store = new_store()
    make_node(store, "a1", zone="a")
    make_node(store, "b1", zone="b")
    make_node(store, "b2", zone="b", cpu="16")  # emptiest: LeastAllocated's choice without the rule
    make_pod(store, "db", labels={"app": "db"}, nodeName="a1")
    make_pod(store, "api", labels={"app": "api"}, affinity=affinity("db"))
    assert await scheduler_for(store).schedule_pass() == 1
    assert placement(store)["api"] == "a1"


async def test_required_affinity_without_a_target_waits_unless_it_attracts_itself():
    """satisfyPodAffinity: with no matching pod anywhere a pod waits ("didn't match pod affinity
    rules"), except the first of a group whose terms match its own labels."""
    store = new_store()
    make_node(store, "a1", zone="a")
    make_node(store, "nozone")  # no zone label: refused whatever the counts
    make_pod(store, "api", labels={"app": "api"}, affinity=affinity("db"))
    make_pod(store, "self-1", labels={"app": "self"}, affinity=affinity("self"))
    make_pod(store, "self-2", labels={"app": "self"}, affinity=affinity("self"))
    assert await scheduler_for(store).schedule_pass() == 2
    where = placement(store)
    assert where["api"] is None
    assert where["self-1"] == where["self-2"] == "a1"
    assert scheduled_condition(store, "api")["message"] == (
        "0/2 nodes are available: 2 node(s) didn't match pod affinity rules."
    )


async def test_affinity_namespaces_default_named_and_selected():
    """getNamespacesFromPodAffinityTerm / mergeAffinityTermNamespacesIfNotEmpty: a term names no
    namespace -> the pod's own; `namespaces` -> those; a namespaceSelector -> the namespaces whose
    labels it matches; an empty namespaceSelector -> every namespace."""
    store = new_store()
    make_namespace(store, "shop", {"team": "t1"})
    make_namespace(store, "other", {"team": "t2"})
    make_node(store, "a1", zone="a")
    make_node(store, "b1", zone="b")
    make_pod(store, "db", labels={"app": "db"}, namespace="shop", nodeName="a1")
    make_pod(store, "own-ns", labels={"app": "x"}, namespace="other", affinity=affinity("db"))
    make_pod(
        store, "named", labels={"app": "y"}, namespace="other", affinity=affinity("db", namespaces=["shop"])
    )
    make_pod(
        store,
        "selected",
        labels={"app": "z"},
        namespace="other",
        affinity=affinity("db", namespaceSelector={"matchLabels": {"team": "t1"}}),
    )
    make_pod(
        store,
        "everywhere",
        labels={"app": "w"},
        namespace="other",
        affinity=affinity("db", namespaceSelector={}),
    )
    assert await scheduler_for(store).schedule_pass() == 3
    where = placement(store)
    assert where["own-ns"] is None  # no db pod in "other"
    assert where["named"] == where["selected"] == where["everywhere"] == "a1"


# --- PodTopologySpread (podtopologyspread/filtering.go) ---------------------------------------------


async def test_zone_spread_with_max_skew_one_alternates_zones():
    """The skew rule `count + self - min <= maxSkew`: with maxSkew 1 over two zones, replicas
    alternate whatever LeastAllocated prefers (zone b has far bigger nodes)."""
    store = new_store()
    make_node(store, "a1", zone="a", cpu="2")
    make_node(store, "b1", zone="b", cpu="32")
    for i in range(4):
        make_pod(store, f"p{i}", labels={"app": "web"}, topologySpreadConstraints=zone_spread("web"))
    assert await scheduler_for(store).schedule_pass() == 4
    assert sorted(placement(store).values()) == ["a1", "a1", "b1", "b1"]


async def test_min_domains_counts_missing_domains_as_empty():
    """minMatchNum: with fewer eligible domains than minDomains the global minimum is 0, so with
    maxSkew 1 each of the two zones takes one replica and the third waits."""
    store = new_store()
    make_node(store, "a1", zone="a")
    make_node(store, "b1", zone="b")
    for i in range(3):
        make_pod(
            store, f"p{i}", labels={"app": "web"}, topologySpreadConstraints=zone_spread("web", minDomains=3)
        )
    assert await scheduler_for(store).schedule_pass() == 2
    assert scheduled_condition(store, "p2")["message"] == (
        "0/2 nodes are available: 2 node(s) didn't match pod topology spread constraints."
    )


async def test_node_affinity_policy_decides_whether_unselected_zones_count():
    """matchNodeInclusionPolicies, nodeAffinityPolicy: Honor (the default) leaves out the domains of
    nodes the pod's nodeSelector refuses; Ignore counts them (an empty zone c: min 0)."""
    for policy, placed in (("Honor", 1), ("Ignore", 0)):
        store = new_store()
        make_node(store, "a1", zone="a", labels={"pool": "web"})
        make_node(store, "b1", zone="b", labels={"pool": "web"})
        make_node(store, "c1", zone="c", labels={"pool": "batch"})
        make_pod(store, "old-a", labels={"app": "web"}, nodeName="a1")
        make_pod(store, "old-b", labels={"app": "web"}, nodeName="b1")
        make_pod(
            store,
            "new",
            labels={"app": "web"},
            nodeSelector={"pool": "web"},
            topologySpreadConstraints=zone_spread("web", nodeAffinityPolicy=policy),
        )
        assert await scheduler_for(store).schedule_pass() == placed, policy


async def test_node_taints_policy_honor_leaves_out_tainted_domains():
    """nodeTaintsPolicy: Ignore (the default) counts a tainted node's zone (empty: min 0, the pod
    can go nowhere else without skew 2); Honor leaves it out."""
    taint = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    for policy, placed in (("Ignore", 0), ("Honor", 1)):
        store = new_store()
        make_node(store, "a1", zone="a")
        make_node(store, "c1", zone="c", taints=taint)
        make_pod(store, "old-a", labels={"app": "web"}, nodeName="a1")
        make_pod(
            store,
            "new",
            labels={"app": "web"},
            topologySpreadConstraints=zone_spread("web", nodeTaintsPolicy=policy),
        )
        assert await scheduler_for(store).schedule_pass() == placed, policy


async def test_a_node_without_the_topology_key_is_refused():
    store = new_store()
    make_node(store, "nozone")
    make_pod(store, "p", labels={"app": "web"}, topologySpreadConstraints=zone_spread("web"))
    assert await scheduler_for(store).schedule_pass() == 0
    assert scheduled_condition(store, "p")["message"] == (
        "0/1 nodes are available: "
        "1 node(s) didn't match pod topology spread constraints (missing required label)."
    )


async def test_spread_counts_only_the_pods_namespace_and_not_terminating_pods():
    """countPodsMatchSelector: pods of other namespaces and terminating pods do not count (had they
    counted, zone a would hold two and both replicas would go to b)."""
    store = new_store()
    make_node(store, "a1", zone="a")
    make_node(store, "b1", zone="b")
    make_pod(store, "other-ns", labels={"app": "web"}, namespace="kube-system", nodeName="a1")
    make_pod(store, "leaving", labels={"app": "web"}, nodeName="a1")
    store.mutate(
        "pods", "leaving", lambda p: p["metadata"].update(finalizers=["example.com/hold"]), "default"
    )
    store.delete("pods", "leaving", "default")
    assert store.get("pods", "leaving", "default")["metadata"].get("deletionTimestamp")
    for i in range(2):
        make_pod(store, f"p{i}", labels={"app": "web"}, topologySpreadConstraints=zone_spread("web"))
    assert await scheduler_for(store).schedule_pass() == 2
    where = placement(store)
    assert sorted([where["p0"], where["p1"]]) == ["a1", "b1"]


# --- NodePorts (nodeports/node_ports.go) ----------------------------------------------------------------


async def test_host_ports_conflict_on_one_node():
    """HostPortInfo.CheckConflict: 0.0.0.0 takes the port on every address; another protocol or
    two distinct addresses do not conflict."""
    store = new_store()
    make_node(store, "a")
    tcp = {"containerPort": 80, "hostPort": 8080}
    make_pod(store, "first", ports=[tcp])
    make_pod(store, "same", ports=[tcp])
    make_pod(store, "udp", ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}])
    make_pod(store, "ip-1", ports=[{"containerPort": 80, "hostPort": 9090, "hostIP": "10.0.0.1"}])
    make_pod(store, "ip-2", ports=[{"containerPort": 80, "hostPort": 9090, "hostIP": "10.0.0.2"}])
    assert await scheduler_for(store).schedule_pass() == 4
    assert placement(store)["same"] is None
    assert scheduled_condition(store, "same")["message"] == (
        "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports."
    )


async def test_host_network_pods_hold_their_container_ports():
    """API defaulting (pkg/apis/core/v1/defaults.go) gives a hostNetwork pod's ports hostPort =
    containerPort: two such pods do not share a node."""
    store = new_store()
    make_node(store, "a")
    for name in ("agent-1", "agent-2"):
        make_pod(store, name, ports=[{"containerPort": 9100}], hostNetwork=True)
    assert store.get("pods", "agent-1", "default")["spec"]["containers"][0]["ports"] == [
        {"containerPort": 9100, "hostPort": 9100, "protocol": "TCP"}
    ]
    assert await scheduler_for(store).schedule_pass() == 1


# --- the node-local filters' reasons (nodeunschedulable, tainttoleration, nodeaffinity, noderesources) ---


async def test_each_node_counts_under_its_first_failing_filter():
    """FitError.Error(): per node the first failing plugin in the profile's order, reasons sorted."""
    store = new_store()
    make_node(store, "cordoned", labels={"pool": "x"})
    store.mutate("nodes", "cordoned", lambda n: n["spec"].update(unschedulable=True))
    make_node(
        store,
        "tainted",
        labels={"pool": "x"},
        taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}],
    )
    make_node(store, "elsewhere", labels={"pool": "y"})
    make_node(store, "small", cpu="100m", labels={"pool": "x"})
    make_node(store, "full", pods="0", labels={"pool": "x"})
    make_pod(store, "p", cpu="500m", nodeSelector={"pool": "x"})
    assert await scheduler_for(store).schedule_pass() == 0
    assert scheduled_condition(store, "p")["message"] == (
        "0/5 nodes are available: 1 Insufficient cpu, 1 Too many pods, "
        "1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {gpu: yes}, "
        "1 node(s) were unschedulable."
    )


async def test_a_pinned_pod_counts_the_other_nodes_under_node_affinity_prefilter():
    """NodeAffinity PreFilter: a required `matchFields metadata.name In` term (a DaemonSet pod)
    narrows the nodes; the others are "didn't satisfy plugin(s) [NodeAffinity]"."""
    store = new_store()
    make_node(store, "a", cpu="100m")
    make_node(store, "b")
    pin = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
    make_pod(store, "agent", cpu="500m", affinity=pin)
    assert await scheduler_for(store).schedule_pass() == 0
    assert scheduled_condition(store, "agent")["message"] == (
        "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) didn't satisfy plugin(s) [NodeAffinity]."
    )


async def test_a_zero_request_fits_an_overcommitted_node():
    """fitsRequest checks a resource only when the pod requests it."""
    store = new_store()
    make_node(store, "a", cpu="1")
    make_pod(store, "hog", cpu="2", nodeName="a")  # bound past allocatable by someone else
    make_pod(store, "memory-only", cpu=None)
    assert await scheduler_for(store).schedule_pass() == 1


async def test_the_message_is_rewritten_when_the_reasons_change():
    """The PodScheduled condition follows each attempt (its lastTransitionTime stays)."""
    store = new_store()
    make_node(store, "a", zone="a", cpu="1")
    make_pod(store, "big", cpu="2")
    scheduler = scheduler_for(store)
    await scheduler.schedule_pass()
    first = scheduled_condition(store, "big")
    assert first["message"] == "0/1 nodes are available: 1 Insufficient cpu."
    make_node(store, "b", zone="b", cpu="1", taints=[{"key": "k", "effect": "NoExecute"}])
    await scheduler.schedule_pass()
    second = scheduled_condition(store, "big")
    assert (
        second["message"]
        == "0/2 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint {k: }."
    )
    assert second["lastTransitionTime"] == first["lastTransitionTime"]


async def test_hostname_spread_counts_pods_on_the_node_itself():
    """A hostname-keyed DoNotSchedule constraint, maxSkew 1 over three nodes: one replica per node
    before any takes a second, though LeastAllocated would put all three on the big empty node."""
    store = new_store()
    make_node(store, "a", cpu="16")
    for name in ("b", "c"):
        make_node(store, name, cpu="2")
        make_pod(store, f"filler-{name}", cpu="1", nodeName=name)
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": "web"}},
        }
    ]
    for i in range(3):
        make_pod(store, f"p{i}", labels={"app": "web"}, topologySpreadConstraints=spread)
    assert await scheduler_for(store).schedule_pass() == 3
    where = placement(store)
    assert sorted(where[f"p{i}"] for i in range(3)) == ["a", "b", "c"]


async def test_many_constrained_pods_keep_every_rule_and_leftovers_fit_nowhere():
    """The pass's incremental counts against a recount from scratch: with random workloads under
    hostname anti-affinity and zone spread (maxSkew 1) on random nodes, no two anti-affinity replicas
    share a node, no spread workload ends more than 1 apart between zones, and a pod left Pending
    fits no node by a brute-force check of resources and both rules."""
    import random

    from planner.resources import ZERO
    from sim.controllers.predicates import node_allocatable, pod_requests

    rng = random.Random(11)
    store = new_store()
    zones = ["a", "b", "c"]
    for i in range(9):
        make_node(store, f"n{i:02d}", cpu=str(rng.choice([1, 2, 4])), zone=zones[i % 3])
    kinds = {}
    for w in range(30):
        kind = rng.choice(["anti", "spread", "plain"])
        kinds[f"w{w}"] = kind
        extra = {}
        if kind == "anti":
            extra["affinity"] = anti_affinity(f"w{w}")
        elif kind == "spread":
            extra["topologySpreadConstraints"] = zone_spread(f"w{w}")
        for r in range(rng.randint(1, 8)):
            make_pod(
                store, f"w{w}-{r}", cpu=f"{rng.choice([100, 250, 500])}m", labels={"app": f"w{w}"}, **extra
            )
    await scheduler_for(store).schedule_pass()

    nodes = {n["metadata"]["name"]: n for n in store.list("nodes").items}
    zone_of = {name: n["metadata"]["labels"][ZONE] for name, n in nodes.items()}
    pods = store.list("pods").items
    used = {name: ZERO for name in nodes}
    on_node: dict[tuple[str, str], int] = {}
    in_zone: dict[tuple[str, str], int] = {}
    for pod in pods:
        where, app = pod["spec"].get("nodeName"), pod["metadata"]["labels"]["app"]
        if where:
            used[where] = used[where] + pod_requests(pod["spec"])
            on_node[(app, where)] = on_node.get((app, where), 0) + 1
            in_zone[(app, zone_of[where])] = in_zone.get((app, zone_of[where]), 0) + 1
    assert all(count == 1 for (app, _), count in on_node.items() if kinds[app] == "anti")
    for app, kind in kinds.items():
        if kind == "spread":
            counts = [in_zone.get((app, z), 0) for z in zones]
            assert max(counts) - min(counts) <= 1, (app, counts)
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    for pod in pending:
        app, request = pod["metadata"]["labels"]["app"], pod_requests(pod["spec"])
        for name, node in nodes.items():
            fits = (used[name] + request).fits(node_allocatable(node))
            if kinds[app] == "anti":
                fits = fits and not on_node.get((app, name))
            if kinds[app] == "spread":
                counts = {z: in_zone.get((app, z), 0) for z in zones}
                fits = fits and counts[zone_of[name]] + 1 - min(counts.values()) <= 1
            assert not fits, (pod["metadata"]["name"], name)
    assert len(pending) > 10  # the cluster is small enough that some wait
