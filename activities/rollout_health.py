"""`check_wave_health`: the rollout gate's look at a wave, from Kubernetes itself (issue 35 item 2).

The RolloutWorkflow asks it while a wave replaces nodes and through the soak; it answers Healthy,
Waiting (not decided yet) or Failed with one line per reason (api/rollout_health_io.py). What it
reads, all from the worker's informer cache (cluster/reads.py):

- the wave's nodes: the pool's nodes created at or after `since`, not being deleted, and their Ready
  condition, which the kubelet posts (True "KubeletReady", False "KubeletNotReady": kubernetes/
  kubernetes pkg/kubelet/nodestatus/setters.go `ReadyCondition`, whose lastTransitionTime moves only
  when the status changes) or the node lifecycle controller sets Unknown when the kubelet never posted
  or stopped posting (pkg/controller/nodelifecycle/node_lifecycle_controller.go `tryUpdateNodeHealth`);
- the pods bound to them (DaemonSet pods too), their Ready condition and their containers'
  restartCount: the kubelet starts each new instance of a container with the last one's count plus
  one (pkg/kubelet/kuberuntime/kuberuntime_container.go `startContainer`), so the count is how often
  the container was restarted on this node, and `lastState.terminated` says how the last one ended;
- the pods created since `since` that nothing placed: kube-scheduler marks a pod that fits nowhere
  with PodScheduled False, reason Unschedulable (SchedulerError when it failed itself: pkg/scheduler/
  schedule_one.go `handleSchedulingFailure`); reason SchedulingGated is a pod held back on purpose by
  its schedulingGates, not one the wave displaced into nowhere, and does not count;
- optionally a Prometheus instant query (`<url>/api/v1/query`): a value above `max` fails the gate;
  no answer is never a failure, only Waiting (a Prometheus outage must not halt a rollout).

Read-only, so any retry is safe; Kubernetes errors are classified as everywhere (activities/errors.py).
When Failed, the reasons are the failures only (what the halt says); Waiting lists what is undecided.
A wave with no new node is Waiting until its soak begins, and judged by its displaced pods after.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from temporalio import activity

from activities.errors import classify_kube
from api.constants import NODEPOOL_LABEL
from api.rollout_health_io import Verdict, WaveHealth, WaveHealthRequest
from api.rollout_io import RolloutNode
from api.rollout_policy import PrometheusCheck, RolloutPolicy
from cluster.reads import ClusterReads
from kube.client import Json, KubeApi
from kube.times import parse_time

PROMETHEUS_TIMEOUT = aiohttp.ClientTimeout(total=5)
MAX_REASONS = 20
MAX_PODS_NAMED = 10  # in the one line about displaced pods


def _ago(span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds}s" if seconds else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m" if minutes else f"{hours}h"


def _condition(obj: Json, kind: str) -> Json | None:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            found: Json = condition
            return found
    return None


def _why(condition: Json | None) -> str:
    if condition is None:
        return "no Ready condition yet"
    text = condition.get("reason") or condition.get("status") or ""
    if condition.get("message"):
        text = f"{text}: {condition['message']}"
    return str(text)


def _pod_name(pod: Json) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class _Verdicts:
    """The reasons found so far, by what they mean for the gate."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.waiting: list[str] = []

    def health(self, **fields: Any) -> WaveHealth:
        verdict: Verdict
        if self.failed:
            verdict, reasons = "Failed", self.failed
        elif self.waiting:
            verdict, reasons = "Waiting", self.waiting
        else:
            verdict, reasons = "Healthy", []
        lines = sorted(set(reasons))
        if len(lines) > MAX_REASONS:
            lines = [*lines[: MAX_REASONS - 1], f"and {len(lines) - MAX_REASONS + 1} more"]
        return WaveHealth(verdict=verdict, reasons=lines, **fields)


def judge_node(node: Json, request: WaveHealthRequest, now: datetime, verdicts: _Verdicts) -> bool:
    """Whether the node is Ready; adds why not, if that fails the gate or keeps it waiting."""
    meta = node["metadata"]
    name = meta["name"]
    ready = _condition(node, "Ready")
    if ready is not None and ready.get("status") == "True":
        return True
    created = parse_time(meta.get("creationTimestamp")) or now
    changed = parse_time((ready or {}).get("lastTransitionTime"))
    timeout = request.policy.ready_timeout
    soak = request.soak_started
    if soak is not None and created < soak and changed is not None and changed >= soak:
        # The status moved during the soak and is not True: the node left Ready (its kubelet said
        # so, or stopped posting), which is what the soak is there to catch.
        verdicts.failed.append(
            f"node {name} went NotReady during the soak, {_ago(now - changed)} ago: {_why(ready)}"
        )
    elif now - created >= timeout:
        verdicts.failed.append(
            f"node {name} is not Ready {_ago(now - created)} after its creation"
            f" (readyTimeout {_ago(timeout)}): {_why(ready)}"
        )
    else:
        verdicts.waiting.append(f"node {name} is not Ready yet ({_ago(now - created)} old): {_why(ready)}")
    return False


def judge_restarts(pod: Json, node: str, policy: RolloutPolicy, verdicts: _Verdicts) -> None:
    status = pod.get("status") or {}
    for kind, key in (("container", "containerStatuses"), ("init container", "initContainerStatuses")):
        for container in status.get(key) or ():
            count = int(container.get("restartCount") or 0)
            if count <= policy.max_restarts:
                continue
            last = ((container.get("lastState") or {}).get("terminated")) or {}
            how = f"last exit: {last.get('reason') or 'unknown'}"
            if last.get("exitCode") is not None:
                how += f" (exit code {last['exitCode']})"
            verdicts.failed.append(
                f"pod {_pod_name(pod)} on node {node}: {kind} {container.get('name', '')} restarted"
                f" {count} times (maxRestarts {policy.max_restarts}), {how}"
            )


def judge_pod_ready(
    pod: Json, node: str, node_created: datetime, policy: RolloutPolicy, now: datetime, verdicts: _Verdicts
) -> None:
    ready = _condition(pod, "Ready")
    if ready is not None and ready.get("status") == "True":
        return
    # Counted from when the kubelet took the pod (startTime), else from when it could have: a pod
    # created before the node (a pending pod placed on it) cannot have started before the node did.
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    created = parse_time(meta.get("creationTimestamp")) or now
    since = parse_time(status.get("startTime")) or max(created, node_created)
    if now - since >= policy.ready_timeout:
        verdicts.failed.append(
            f"pod {_pod_name(pod)} on node {node} is not Ready {_ago(now - since)} after it started"
            f" (readyTimeout {_ago(policy.ready_timeout)}): {_why(ready)}"
        )
    else:
        verdicts.waiting.append(f"pod {_pod_name(pod)} on node {node} is not Ready yet: {_why(ready)}")


def judge_unplaced(pods: list[Json], request: WaveHealthRequest, now: datetime, verdicts: _Verdicts) -> None:
    """Pods created since the wave began that the scheduler found no place for, past readyTimeout."""
    stuck: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        created = parse_time(meta.get("creationTimestamp"))
        if created is None or created < request.since or meta.get("deletionTimestamp"):
            continue
        if (pod.get("spec") or {}).get("nodeName") or (pod.get("status") or {}).get("phase") != "Pending":
            continue
        scheduled = _condition(pod, "PodScheduled")
        if (
            scheduled is None
            or scheduled.get("status") != "False"
            or scheduled.get("reason") == "SchedulingGated"
        ):
            continue
        if now - created >= request.policy.ready_timeout:
            stuck.append(_pod_name(pod))
    if stuck:
        stuck.sort()
        named = " ".join(stuck[:MAX_PODS_NAMED]) + (" ..." if len(stuck) > MAX_PODS_NAMED else "")
        verdicts.failed.append(
            f"{len(stuck)} pods displaced by the wave are still unschedulable"
            f" after readyTimeout {_ago(request.policy.ready_timeout)}: {named}"
        )


async def judge_prometheus(check: PrometheusCheck, verdicts: _Verdicts) -> None:
    url = check.url.rstrip("/") + "/api/v1/query"
    try:
        async with (
            aiohttp.ClientSession(timeout=PROMETHEUS_TIMEOUT) as session,
            session.get(url, params={"query": check.query}) as response,
        ):
            status = response.status
            body = await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError) as err:
        verdicts.waiting.append(f"Prometheus at {check.url} did not answer: {str(err) or type(err).__name__}")
        return
    if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        verdicts.waiting.append(f"Prometheus answered {status}: {error or 'no result'}")
        return
    data = body.get("data") or {}
    result = data.get("result")
    # A vector holds samples {"metric", "value": [time, "text"]}; a scalar is [time, "text"] itself.
    sample = result if data.get("resultType") == "scalar" else (result[0].get("value") if result else None)
    try:
        value = float(sample[1]) if isinstance(sample, list) and len(sample) == 2 else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if math.isnan(value):
        verdicts.waiting.append(f"Prometheus query {check.query!r} returned no sample")
    elif value > check.max:
        verdicts.failed.append(f"Prometheus query {check.query!r} = {value:g}, above max {check.max:g}")


class RolloutHealthActivities:
    def __init__(
        self, kube: KubeApi, reads: ClusterReads, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.kube = kube
        self.reads = reads
        self.clock = clock

    @activity.defn(name="check_wave_health")
    async def check_wave_health(self, request: WaveHealthRequest) -> WaveHealth:
        now = self.clock()
        verdicts = _Verdicts()
        try:
            pool = await self.reads.nodes_with_label(NODEPOOL_LABEL, request.nodepool)
        except Exception as err:
            raise classify_kube(err, f"nodes of NodePool {request.nodepool}") from None
        wave = sorted(
            (
                n
                for n in pool
                if not n["metadata"].get("deletionTimestamp")
                and (created := parse_time(n["metadata"].get("creationTimestamp"))) is not None
                and created >= request.since
            ),
            key=lambda n: str(n["metadata"]["name"]),
        )
        ready_nodes = judged_pods = 0
        for node in wave:
            name = node["metadata"]["name"]
            ready = judge_node(node, request, now, verdicts)
            ready_nodes += ready
            try:
                pods = await self.reads.pods_on_node(name)
            except Exception as err:
                raise classify_kube(err, f"pods on node {name}") from None
            node_created = parse_time(node["metadata"].get("creationTimestamp")) or now
            for pod in pods:
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                judged_pods += 1
                judge_restarts(pod, name, request.policy, verdicts)
                if ready:  # on a node that is not Ready, the node's own line says it all
                    judge_pod_ready(pod, name, node_created, request.policy, now, verdicts)
        if not wave and request.soak_started is None:
            # Once the soak began (the wave's old nodes are gone) no new node means none was needed:
            # a drifted node whose pods fit elsewhere is deleted without a replacement, as in
            # Karpenter. Waiting for one then would hold the rollout for ever.
            verdicts.waiting.append("no node of the wave yet")
        try:
            unbound = await self.reads.unbound_pods()
        except Exception as err:
            raise classify_kube(err, "unscheduled pods") from None
        judge_unplaced(unbound, request, now, verdicts)
        if request.policy.prometheus is not None:
            await judge_prometheus(request.policy.prometheus, verdicts)
        return verdicts.health(
            nodes=[
                RolloutNode(name=n["metadata"]["name"], uid=str(n["metadata"].get("uid") or "")) for n in wave
            ],
            ready_nodes=ready_nodes,
            pods=judged_pods,
            checked_at=now,
        )
