"""A pass's forceful commands (expiration, repair) get their replacements from one simulation
(planner/forceful_batch.py): each command its own pods' new nodes, room on existing nodes never
promised twice."""

from datetime import timedelta

from planner.candidates import make_candidate
from planner.expiration import expiration_commands
from planner.forceful_batch import batch_replacements
from planner.model import Replacement, SchedulingResult
from planner.repair import repair_commands
from planner.scheduling import adapter
from planner.scheduling.adapter import snapshot_simulation
from sim.cluster_builder import ClusterBuilder

OLD = timedelta(hours=25)  # past the pools' expireAfter of 24h


class Spy:
    """The real simulation, counting its calls and what the context said at each."""

    def __init__(self):
        self.calls = []

    def __call__(self, ctx, candidates, pods=None):
        self.calls.append(([c.name for c in candidates], ctx.claims_per_node))
        return adapter.simulate(ctx, candidates, pods)


def expired_pool(b: ClusterBuilder, full: int = 1) -> None:
    """A pool whose nodes expire after 24h, with `full` young nodes that have no room for 1500m."""
    b.nodepool("default", expire_after="24h")
    for i in range(full):
        b.node(f"young-{i}", age=timedelta(hours=1))
        b.pod(f"busy-{i}", f"young-{i}", cpu="1500m")


def expirations(b: ClusterBuilder, simulate=adapter.simulate):
    return by_node(expiration_commands(b.context(simulate=simulate)))


def by_node(commands):
    return {c.nodes[0]: c for c in commands}


def moved(command):
    return sorted(p.name for r in command.replacements for p in r.pods)


def test_all_expired_nodes_of_a_pass_are_simulated_once():
    b = ClusterBuilder()
    expired_pool(b)
    for name in ("old-a", "old-b", "old-c"):
        b.node(name, age=OLD)
        b.pod(f"{name}-web", name, cpu="1500m")
    spy = Spy()
    commands = expirations(b, spy)
    assert spy.calls == [(["old-a", "old-b", "old-c"], True)]
    # Each command launches a new node for its own pod, none for another command's.
    assert {name: moved(c) for name, c in commands.items()} == {
        "old-a": ["old-a-web"],
        "old-b": ["old-b-web"],
        "old-c": ["old-c-web"],
    }
    assert all("1 replacement(s) for its pods" in c.message for c in commands.values())


def test_room_for_one_pod_is_given_to_one_expired_node_only():
    b = ClusterBuilder()
    b.nodepool("default", expire_after="24h")
    b.node("young", age=timedelta(hours=1))
    b.pod("small", "young", cpu="100m")  # room for one 1500m pod, not two
    for name in ("old-a", "old-b"):
        b.node(name, age=OLD)
        b.pod(f"{name}-web", name, cpu="1500m")
    commands = expirations(b)
    assert sorted(len(c.replacements) for c in commands.values()) == [0, 1]
    (needing,) = [name for name, c in commands.items() if c.replacements]
    assert moved(commands[needing]) == [f"{needing}-web"]


def test_no_pod_is_planned_onto_another_expiring_node():
    b = ClusterBuilder()
    expired_pool(b)
    b.node("old-a", age=OLD)
    b.pod("old-a-web", "old-a", cpu="1500m")
    b.node("old-b", age=OLD)
    b.pod("old-b-small", "old-b", cpu="100m")  # room for old-a's pod, but old-b goes too
    commands = expirations(b)
    assert moved(commands["old-a"]) == ["old-a-web"]


def test_static_and_empty_expired_nodes_stay_out_of_the_simulation():
    b = ClusterBuilder()
    expired_pool(b)
    b.nodepool("static", expire_after="24h", replicas=1)
    b.node("old-static", pool="static", age=OLD)
    b.pod("static-web", "old-static", cpu="1500m")
    b.node("old-empty", age=OLD)
    b.node("old-busy", age=OLD)
    b.pod("busy-web", "old-busy", cpu="1500m")
    spy = Spy()
    commands = expirations(b, spy)
    assert spy.calls == [(["old-busy"], True)]
    assert [r.nodepool for r in commands["old-static"].replacements] == ["static"]
    assert commands["old-empty"].replacements == []
    assert moved(commands["old-busy"]) == ["busy-web"]


def test_repairs_are_simulated_once_with_the_expired_nodes_gone():
    b = ClusterBuilder()
    expired_pool(b, full=9)  # 2 unhealthy of 12 nodes: under the 20 % that stops repair
    b.node("old", age=OLD)
    b.pod("old-web", "old", cpu="1500m")
    for name in ("sick-a", "sick-b"):
        b.node(name, age=timedelta(hours=1), ready=False, ready_for=timedelta(minutes=31))
        b.pod(f"{name}-web", name, cpu="1500m")
    spy = Spy()
    ctx = b.context(simulate=spy)
    commands = by_node([*expiration_commands(ctx), *repair_commands(ctx)])
    assert spy.calls == [(["old"], True), (["sick-a", "sick-b"], True)]
    assert {name: moved(c) for name, c in commands.items()} == {
        "old": ["old-web"],
        "sick-a": ["sick-a-web"],
        "sick-b": ["sick-b-web"],
    }


def test_the_simulation_keeps_each_removed_nodes_new_nodes_apart_only_when_asked():
    b = ClusterBuilder()
    expired_pool(b)
    for name in ("old-a", "old-b"):
        b.node(name, age=OLD)
        b.pod(f"{name}-web", name, cpu="500m")  # both fit one new node
    ctx = b.context()
    prepared = snapshot_simulation(ctx)
    shared = prepared.run(["old-a", "old-b"])
    assert [sorted(c.pods) for c in shared.replacements] == [["default/old-a-web", "default/old-b-web"]]
    apart = prepared.run(["old-a", "old-b"], claims_per_node=True)
    assert sorted((c.group, c.pods) for c in apart.replacements) == [
        ("old-a", ["default/old-a-web"]),
        ("old-b", ["default/old-b-web"]),
    ]


class SharingSimulation:
    """A simulation that puts every moved pod on one new node, whatever it is asked."""

    def __init__(self):
        self.calls = []

    def __call__(self, ctx, candidates, pods=None):
        self.calls.append(([c.name for c in candidates], set(ctx.marked_for_deletion), set(ctx.closed_nodes)))
        moving = [p for c in candidates for p in c.reschedulable_pods]
        types = [ctx.catalog.get("m5.large")]
        return SchedulingResult(
            new_nodes=[Replacement("default", types, "on-demand", ["us-west-2a"], moving)]
        )


def test_nodes_whose_pods_share_a_new_node_fall_back_to_one_simulation_each():
    b = ClusterBuilder()
    expired_pool(b)
    for name in ("old-a", "old-b", "old-c"):
        b.node(name, age=OLD)
        b.pod(f"{name}-web", name, cpu="500m")
    sharing = SharingSimulation()
    ctx = b.context(simulate=sharing)
    candidates = [ctx_candidate(ctx, n) for n in ("old-a", "old-b", "old-c")]
    ctx.marked_for_deletion.update(["old-a", "old-b", "old-c", "other"])
    found = batch_replacements(ctx, candidates)
    assert {name: moved_pods(r) for name, r in found.items()} == {
        "old-a": ["old-a-web"],
        "old-b": ["old-b-web"],
        "old-c": ["old-c-web"],
    }
    # Then node by node: those before gone, those after closed, as a drift batch does.
    assert sharing.calls[1:] == [
        (["old-a"], {"other"}, {"old-b", "old-c"}),
        (["old-b"], {"other", "old-a"}, {"old-c"}),
        (["old-c"], {"other", "old-a", "old-b"}, set()),
    ]
    assert ctx.marked_for_deletion == {"old-a", "old-b", "old-c", "other"} and not ctx.closed_nodes


def ctx_candidate(ctx, name):
    node = ctx.snapshot.nodes[name]
    return make_candidate(ctx, node, ctx.snapshot.nodepools[node.nodepool])


def moved_pods(replacements):
    return sorted(p.name for r in replacements for p in r.pods)
