"""Node lifecycle tied to EC2: what kubelets, CNI agents and the cloud node lifecycle controller do.

Every poll lists the cluster's instances once (those with the ownership tag
`kubernetes.io/cluster/<name>=owned`, terminated ones excluded; see `ec2_view.py` for the two ways
of listing) and diffs the result against what it tracks: one listing per period whatever the node
count, never a call per node.

An instance's life as a Node (all delays are base seconds scaled by the TimeScale):

    launched ──register──▶ Node (NotReady, tainted not-ready, the taints its user data registers)
                           (never, when the user data would not bootstrap a kubelet here:
                           sim/controllers/bootstrap.py)
             ──ready─────▶ Ready=True, not-ready taint removed        (never, for never-ready faults)
             ──startup───▶ startup taints removed (their agents are up)
    stopped / terminated / gone from EC2
             ──not_ready─▶ Ready=Unknown, unreachable:NoSchedule        (the kubelet went silent)
             ──delete────▶ Node deleted; finalizers keep it Terminating until they are removed

The NoExecute taints that follow the Ready condition (not-ready while False, unreachable while
Unknown) are the node lifecycle controller's, written by noexecute_taints.py; the taint manager
(taint_eviction.py) acts on them.

moto makes instances `running` at once, so the pending phase is simulated from LaunchTime. A Node
deleted by someone else while its instance runs is not registered again (a running kubelet does
not re-register). Nodes whose instance this controller has never seen (seeded by hand) are left
alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from api.constants import NODEPOOL_LABEL, TAG_NODEPOOL, UNREACHABLE_TAINT_KEY
from sim import ec2_faults
from sim.apiserver.errors import AlreadyExists, NotFound
from sim.apiserver.store import Store
from sim.controllers.bootstrap import BootError
from sim.controllers.bootstrap import read as read_boot
from sim.controllers.ec2_view import InstanceSource
from sim.controllers.informer import Informer
from sim.controllers.instance_types import InstanceTypes
from sim.controllers.node_objects import (
    NOT_READY_TAINT,
    LaunchedNodeSpec,
    instance_id_from_provider_id,
    node_name,
    now_rfc3339,
    ready_condition,
    registered_node,
    tags_of,
)
from sim.controllers.predicates import node_condition
from sim.controllers.timers import Timers
from sim.ec2_faults import Ec2Faults
from sim.timescale import TimeScale

log = logging.getLogger(__name__)

LIVE_STATES = ("pending", "running")
# The NoSchedule half of the condition's taints; the NoExecute half is noexecute_taints.py's.
UNREACHABLE_TAINTS = ({"key": UNREACHABLE_TAINT_KEY, "effect": "NoSchedule"},)


@dataclass
class NodeTimings:
    """Base seconds (scaled by the TimeScale) of each step; defaults are what EKS nodes look like."""

    register: float = 30.0  # launch → Node object
    ready: float = 15.0  # Node → Ready
    startup_taints: float = 10.0  # Ready → startup taints removed
    not_ready: float = 40.0  # instance gone → NotReady (node-monitor-grace-period)
    delete: float = 30.0  # NotReady → Node deleted (cloud node lifecycle controller)
    poll: float = 2.0  # DescribeInstances period
    heartbeat: float = 300.0  # Ready condition heartbeat refresh (nodeStatusReportFrequency)
    min_poll_real: float = 0.05  # floor in real seconds, so a zero time scale does not spin


@dataclass
class _Tracked:
    instance_id: str
    node: str
    phase: str  # pending | registered | ready | gone | released
    instance: dict[str, Any] = field(default_factory=dict)  # the latest listing of it
    launch: LaunchedNodeSpec | None = None
    held: bool = False  # registered, kept NotReady (never-ready fault, or adopted mid-boot)
    last_heartbeat: float = 0.0


def _launch_epoch(instance: dict[str, Any]) -> float:
    launched = instance.get("LaunchTime")
    if isinstance(launched, datetime):
        return launched.timestamp()
    if isinstance(launched, str):
        try:
            return datetime.fromisoformat(launched.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return time.time()


def _remove_taints(taints: list[dict[str, Any]], drop: list[dict[str, Any]]) -> list[dict[str, Any]]:
    gone = {(t.get("key"), t.get("effect")) for t in drop}
    return [t for t in taints if (t.get("key"), t.get("effect")) not in gone]


class NodeLifecycleController:
    name = "nodes"

    def __init__(
        self,
        store: Store,
        informer: Informer,
        source: InstanceSource,
        *,
        cluster_name: str,
        region: str,
        timescale: TimeScale,
        instance_types: InstanceTypes,
        faults: Ec2Faults | None = None,
        timings: NodeTimings | None = None,
        api_endpoint: str | None = None,
        api_ca_pem: bytes | None = None,
    ) -> None:
        self.store = store
        self.informer = informer
        self.source = source
        self.cluster_name = cluster_name
        self.api_endpoint = api_endpoint  # what a kubelet must be told to reach (None: not checked)
        self.api_ca_pem = api_ca_pem  # the CA a kubelet must be given to trust it (None: not checked)
        self.region = region
        self.scale = timescale
        self.types = instance_types
        self.faults = faults
        self.t = timings or NodeTimings()
        self.timers = Timers()
        self.tracked: dict[str, _Tracked] = {}
        self.boot_failures: dict[str, str] = {}  # instance id -> why its node never registered
        self.polls = 0
        self.last_poll_seconds = 0.0
        self._poll_now = asyncio.Event()
        informer.add_handler(self._on_event)

    # --- EC2 side -------------------------------------------------------------------------------

    def _list(self) -> list[dict[str, Any]]:
        """All listed instances of this cluster (blocking: runs in a worker thread)."""
        instances = self.source.list_instances()
        self.types.fill({i.get("InstanceType", "") for i in instances if i.get("InstanceType")})
        return instances

    async def run(self) -> None:
        self._adopt_existing_nodes()
        while True:
            started = time.monotonic()
            try:
                instances = await asyncio.to_thread(self._list)
            except Exception as err:  # moto restarting, a throttle storm: keep the last view
                log.warning("DescribeInstances failed (%s); retrying next period", err)
            else:
                self.informer.sync()
                self.observe(instances)
                self.polls += 1
                self.last_poll_seconds = time.monotonic() - started
            self._heartbeat()
            period = max(self.t.min_poll_real, self.scale.seconds(self.t.poll))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poll_now.wait(), period)
            self._poll_now.clear()

    def poll_now(self) -> None:
        """Skip the rest of the current poll period (tests, and the HTTP fault endpoints)."""
        self._poll_now.set()

    def stop(self) -> None:
        self.timers.cancel_all()

    # --- diffing ---------------------------------------------------------------------------------

    def _adopt_existing_nodes(self) -> None:
        """After a restart, nodes already in the store keep their state instead of registering twice."""
        self.informer.sync()
        for node in self.informer.items("nodes"):
            instance_id = instance_id_from_provider_id((node.get("spec") or {}).get("providerID"))
            if instance_id and instance_id not in self.tracked:
                ready = node_condition(node, "Ready") == "True"
                self.tracked[instance_id] = _Tracked(
                    instance_id, node["metadata"]["name"], "ready" if ready else "registered", held=not ready
                )

    def observe(self, instances: list[dict[str, Any]]) -> None:
        """Diff one DescribeInstances listing against the tracked instances."""
        live: set[str] = set()
        for instance in instances:
            instance_id = instance["InstanceId"]
            state = (instance.get("State") or {}).get("Name")
            if state not in LIVE_STATES:
                continue
            live.add(instance_id)
            tracked = self.tracked.get(instance_id)
            if tracked is None:
                self._track(instance)
                continue
            tracked.instance = instance
            if tracked.held and tracked.phase == "registered" and not self._never_ready(instance):
                self._release_hold(tracked)
        for tracked in list(self.tracked.values()):
            if tracked.instance_id not in live and tracked.phase not in ("gone", "released"):
                self._instance_gone(tracked)

    def crash_looping(self, node: str) -> bool:
        """Whether the pods of node `node` crash-loop: its instance was booted from a crash-loop AMI
        (what the kubelet of that node would find, running them)."""
        faults = self.faults or ec2_faults.active()
        if faults is None:
            return False
        return any(t.node == node and faults.is_crash_looping(t.instance) for t in self.tracked.values())

    def _never_ready(self, instance: dict[str, Any]) -> bool:
        faults = self.faults or ec2_faults.active()
        return bool(instance) and faults is not None and faults.is_never_ready(instance)

    def _release_hold(self, tracked: _Tracked) -> None:
        """The fault was lifted (or a restart found the node booting): carry on towards Ready."""
        tracked.held = False
        if tracked.launch is None:
            try:
                tracked.launch = self._boot(tracked.instance)
            except BootError:
                tracked.launch = LaunchedNodeSpec({}, [], [])
        self.timers.after(
            self.scale.seconds(self.t.ready), lambda: self._ready(tracked), f"ready {tracked.node}"
        )

    def _track(self, instance: dict[str, Any]) -> None:
        name = node_name(instance, self.region)
        tracked = _Tracked(instance["InstanceId"], name, "pending", instance=instance)
        self.tracked[tracked.instance_id] = tracked
        delay = _launch_epoch(instance) + self.scale.seconds(self.t.register) - time.time()
        self.timers.after(delay, lambda: self._register(tracked), f"register {name}")

    def _instance_gone(self, tracked: _Tracked) -> None:
        previous = tracked.phase
        tracked.phase = "gone"
        if previous == "pending":
            return  # never registered: nothing to clean up
        self.timers.after(self.scale.seconds(self.t.not_ready), lambda: self._not_ready(tracked), "not-ready")

    # --- node steps --------------------------------------------------------------------------------

    def _register(self, tracked: _Tracked) -> None:
        if tracked.phase != "pending":
            return
        instance = tracked.instance
        try:
            launch = self._boot(instance)
        except BootError as err:
            # What a real instance does with such user data: it runs, and no node ever joins.
            log.error("instance %s: %s; its node will never register", tracked.instance_id, err)
            self.boot_failures[tracked.instance_id] = str(err)
            tracked.phase = "released"
            return
        itype = self.types.get(instance.get("InstanceType", ""))
        if itype is None:
            self.types.fill([instance.get("InstanceType", "")])  # not reached after a poll; safety net
            itype = self.types.get(instance.get("InstanceType", ""))
        try:
            node = registered_node(instance, self.region, itype, launch)  # type: ignore[arg-type]
        except ValueError as err:  # reservations the kubelet cannot parse: it exits, no node
            log.error("instance %s: %s; its node will never register", tracked.instance_id, err)
            self.boot_failures[tracked.instance_id] = str(err)
            tracked.phase = "released"
            return
        try:
            self.store.create("nodes", node, keep_status=True)
        except AlreadyExists:
            existing = self.store.get("nodes", tracked.node)
            if (existing.get("spec") or {}).get("providerID") != node["spec"]["providerID"]:
                log.error(
                    "node %s already exists for another instance; %s not registered",
                    tracked.node,
                    tracked.instance_id,
                )
                tracked.phase = "released"
                return
        tracked.phase = "registered"
        tracked.launch = launch
        self.timers.after(
            self.scale.seconds(self.t.ready), lambda: self._ready(tracked), f"ready {tracked.node}"
        )

    def _boot(self, instance: dict[str, Any]) -> LaunchedNodeSpec:
        boot = read_boot(
            instance.get("UserData"),
            cluster=self.cluster_name,
            endpoint=self.api_endpoint,
            ca_pem=self.api_ca_pem,
        )
        nodepool = boot.labels.get(NODEPOOL_LABEL) or tags_of(instance).get(TAG_NODEPOOL)
        return LaunchedNodeSpec.from_boot(boot, self._startup_taints(nodepool))

    def _startup_taints(self, nodepool: str | None) -> list[dict[str, Any]]:
        """The taints the node's agents remove once they run: its NodePool's startupTaints."""
        if not nodepool:
            return []
        try:
            pool = self.store.get("nodepools", nodepool)
        except NotFound:
            return []
        return list(
            (((pool.get("spec") or {}).get("template") or {}).get("spec") or {}).get("startupTaints") or []
        )

    def _mutate(self, tracked: _Tracked, fn: Callable[[dict[str, Any]], None], status: bool = False) -> bool:
        try:
            self.store.mutate("nodes", tracked.node, fn, subresource="status" if status else None)
        except NotFound:
            return False
        return True

    def _ready(self, tracked: _Tracked) -> None:
        if tracked.phase != "registered" or tracked.held:
            return
        if self._never_ready(tracked.instance):
            # Fault: the kubelet never reports Ready. Re-checked each poll, so lifting it recovers.
            log.info("node %s (%s) stays NotReady (never-ready fault)", tracked.node, tracked.instance_id)
            tracked.held = True
            return
        launch = tracked.launch or LaunchedNodeSpec({}, [], [])
        at = now_rfc3339()

        def set_ready(node: dict[str, Any]) -> None:
            status = node.setdefault("status", {})
            conditions = [
                {
                    "type": kind,
                    "status": "False",
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": at,
                    "lastTransitionTime": at,
                }
                for kind, reason, message in (
                    (
                        "MemoryPressure",
                        "KubeletHasSufficientMemory",
                        "kubelet has sufficient memory available",
                    ),
                    ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                )
            ]
            conditions.append(ready_condition("True", "KubeletReady", "kubelet is posting ready status", at))
            status["conditions"] = conditions

        def drop_not_ready(node: dict[str, Any]) -> None:
            spec = node.setdefault("spec", {})
            spec["taints"] = _remove_taints(spec.get("taints") or [], [NOT_READY_TAINT])

        if not self._mutate(tracked, set_ready, status=True) or not self._mutate(tracked, drop_not_ready):
            tracked.phase = "released"
            return
        tracked.phase = "ready"
        tracked.last_heartbeat = time.monotonic()
        if launch.startup_taints:
            self.timers.after(
                self.scale.seconds(self.t.startup_taints),
                lambda: self._drop_startup_taints(tracked, launch.startup_taints),
                f"startup taints {tracked.node}",
            )

    def _drop_startup_taints(self, tracked: _Tracked, startup: list[dict[str, str]]) -> None:
        if tracked.phase != "ready":
            return

        def drop(node: dict[str, Any]) -> None:
            spec = node.setdefault("spec", {})
            spec["taints"] = _remove_taints(spec.get("taints") or [], startup)

        self._mutate(tracked, drop)

    def _not_ready(self, tracked: _Tracked) -> None:
        if tracked.phase != "gone":
            return
        at = now_rfc3339()

        def set_unknown(node: dict[str, Any]) -> None:
            status = node.setdefault("status", {})
            conditions = [c for c in status.get("conditions") or () if c.get("type") != "Ready"]
            for c in conditions:
                c.update(
                    status="Unknown",
                    reason="NodeStatusUnknown",
                    lastTransitionTime=at,
                    message="Kubelet stopped posting node status.",
                )
            conditions.append(
                ready_condition("Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status.", at)
            )
            status["conditions"] = conditions

        def taint_unreachable(node: dict[str, Any]) -> None:
            spec = node.setdefault("spec", {})
            taints = _remove_taints(spec.get("taints") or [], [NOT_READY_TAINT])
            spec["taints"] = _remove_taints(taints, list(UNREACHABLE_TAINTS)) + [
                dict(t) for t in UNREACHABLE_TAINTS
            ]

        if not self._mutate(tracked, set_unknown, status=True):
            return
        self._mutate(tracked, taint_unreachable)
        self.timers.after(self.scale.seconds(self.t.delete), lambda: self._delete(tracked), "delete node")

    def _delete(self, tracked: _Tracked) -> None:
        if tracked.phase != "gone":
            return
        tracked.phase = "released"
        with contextlib.suppress(NotFound):
            self.store.delete("nodes", tracked.node)

    def _heartbeat(self) -> None:
        period = max(5.0, self.scale.seconds(self.t.heartbeat))
        now = time.monotonic()
        at = None
        for tracked in self.tracked.values():
            if tracked.phase != "ready" or now - tracked.last_heartbeat < period:
                continue
            at = at or now_rfc3339()
            tracked.last_heartbeat = now

            def beat(node: dict[str, Any], at: str = at) -> None:
                for c in (node.get("status") or {}).get("conditions") or ():
                    c["lastHeartbeatTime"] = at

            if not self._mutate(tracked, beat, status=True):
                tracked.phase = "released"

    # --- informer ----------------------------------------------------------------------------------

    def _on_event(
        self, plural: str, kind: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        if plural != "nodes" or new is not None or old is None:
            return
        instance_id = instance_id_from_provider_id((old.get("spec") or {}).get("providerID"))
        tracked = self.tracked.get(instance_id or "")
        if tracked is not None and tracked.node == old["metadata"]["name"] and tracked.phase != "pending":
            tracked.phase = "released"  # deleted: a running kubelet does not register again

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for tracked in self.tracked.values():
            counts[tracked.phase] = counts.get(tracked.phase, 0) + 1
        return counts
