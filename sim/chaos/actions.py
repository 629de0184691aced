"""The discrete faults of a chaos run, each one function of the live world and the event's own random
generator: what EC2, AWS's event bus, the platform and the users do to the cluster while karpflow
works. The harness acts as they do: through the simulator's store (a user's `kubectl`, not through
the faulty API) and its own EC2 client (never throttled), never through karpflow.

- `vanish_instance`: EC2 takes an instance without notice (a replacement still booting, or a node
  whose pods fit elsewhere: the simulator has no provisioner);
- `spot_interruption`: the EventBridge messages of a spot reclaim on the interruption queue, the
  rebalance recommendation before and/or after the warning, some duplicated, sometimes reordered;
  two minutes after the warning EC2 takes the instance if karpflow has not terminated it;
- `churn`: workloads scale, pods are deleted (a rollout, a crash), small Deployments come and go;
- `drift_nodepool`: an edit of the batch NodePool's template, which drifts its nodes.

Instances EC2 takes are reported to the invariant checker as involuntary losses
(`InvariantChecker.instance_lost`): a PDB does not protect pods from them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from api import constants as k
from api.quantity import millicores, to_int
from sim.apiserver.errors import ApiError
from sim.chaos.faults import COMMAND_TAG
from sim.stack import SimStack

log = logging.getLogger(__name__)
Obj = dict[str, Any]
SPOT_RECLAIM_AFTER = 120.0  # EC2 takes a spot instance two minutes after its warning
CHURNED = (("shop", "web"), ("shop", "api"), ("shop", "cart"))
CHURN_NAMESPACE = "churn"
ACCOUNT = "123456789012"


@dataclass
class Effects:
    """What the actions did, by kind, and a line per action for the run's log."""

    counts: Counter[str] = field(default_factory=Counter)
    lines: list[str] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)  # instances a spot warning named
    pending: list[asyncio.Task[Any]] = field(default_factory=list)

    def note(self, kind: str, text: str, count: int = 1) -> None:
        self.counts[kind] += count
        self.lines.append(text)
        log.info("chaos: %s", text)


# -- reading the cluster ----------------------------------------------------------------------------


def _instance_of(node: Obj) -> str | None:
    provider = (node.get("spec") or {}).get("providerID") or ""
    return provider.rsplit("/", 1)[-1] if provider.startswith("aws://") else None


def _ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _tainted(node: Obj) -> bool:
    return any(t.get("key") == k.DISRUPTED_TAINT_KEY for t in (node.get("spec") or {}).get("taints") or ())


def _requests(pod: Obj) -> tuple[int, int]:
    cpu = memory = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        requests = (container.get("resources") or {}).get("requests") or {}
        cpu += millicores(requests.get("cpu"))
        memory += to_int(requests.get("memory"))
    return cpu, memory


def _daemon(pod: Obj) -> bool:
    return any(ref.get("kind") == "DaemonSet" for ref in pod["metadata"].get("ownerReferences") or ())


def _live(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return not pod["metadata"].get("deletionTimestamp") and phase not in ("Succeeded", "Failed")


@dataclass
class Room:
    """Free cpu/memory of the nodes a pod could be placed on now (Ready, not leaving)."""

    free: dict[str, list[int]]
    labels: dict[str, dict[str, str]]

    @classmethod
    def of(cls, stack: SimStack, leaving: set[str] = frozenset()) -> Room:  # type: ignore[assignment]
        nodes = {
            n["metadata"]["name"]: n
            for n in stack.store.list("nodes").items
            if _ready(n)
            and not _tainted(n)
            and not n["metadata"].get("deletionTimestamp")
            and n["metadata"]["name"] not in leaving
            and not any(t.get("effect") == "NoSchedule" for t in (n.get("spec") or {}).get("taints") or ())
        }
        free = {}
        for name, node in nodes.items():
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            free[name] = [millicores(allocatable.get("cpu")), to_int(allocatable.get("memory"))]
        for pod in stack.store.list("pods").items:
            where = (pod.get("spec") or {}).get("nodeName")
            if where in free and _live(pod):
                cpu, memory = _requests(pod)
                free[where][0] -= cpu
                free[where][1] -= memory
        labels = {name: dict(node["metadata"].get("labels") or {}) for name, node in nodes.items()}
        return cls(free, labels)

    def place(self, pod: Obj, margin: float = 1.25) -> bool:
        """First fit, with a margin: True (and the room taken) when some node takes the pod."""
        cpu, memory = _requests(pod)
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        for name, (free_cpu, free_memory) in sorted(self.free.items(), key=lambda item: -item[1][0]):
            if any(self.labels[name].get(key) != value for key, value in selector.items()):
                continue
            if free_cpu >= cpu * margin and free_memory >= memory * margin:
                self.free[name][0] -= cpu
                self.free[name][1] -= memory
                return True
        return False


# -- EC2 takes an instance --------------------------------------------------------------------------


def _take(stack: SimStack, instance_id: str) -> None:
    stack.invariants.instance_lost(instance_id)
    stack._sim_ec2.terminate_instances(InstanceIds=[instance_id])


def vanish_instance(stack: SimStack, rng: random.Random, effects: Effects) -> None:
    nodes = {n["metadata"]["name"]: n for n in stack.store.list("nodes").items}
    by_instance = {_instance_of(n): n for n in nodes.values()}
    booting = [
        i["InstanceId"]
        for i in _instances(stack)
        if COMMAND_TAG in _tags(i) and not _ready(by_instance.get(i["InstanceId"]) or {})
    ]
    if booting and rng.random() < 0.5:
        instance_id = rng.choice(sorted(booting))
        _take(stack, instance_id)
        effects.note("instance-vanished", f"EC2 took replacement {instance_id} while it booted")
        return
    pods_by_node: dict[str, list[Obj]] = {}
    for pod in stack.store.list("pods").items:
        where = (pod.get("spec") or {}).get("nodeName")
        if where and _live(pod) and not _daemon(pod):
            pods_by_node.setdefault(where, []).append(pod)
    candidates = sorted(
        name
        for name, node in nodes.items()
        if _ready(node)
        and (node["metadata"].get("labels") or {}).get(k.NODEPOOL_LABEL) == "default"
        and not node["metadata"].get("deletionTimestamp")
        and _instance_of(node)
    )
    rng.shuffle(candidates)
    for name in candidates:
        room = Room.of(stack, leaving={name})
        if all(room.place(pod) for pod in pods_by_node.get(name, [])):
            instance_id = _instance_of(nodes[name])
            assert instance_id is not None
            _take(stack, instance_id)
            effects.note("instance-vanished", f"EC2 took {instance_id} (node {name}) without notice")
            return
    effects.note("skipped", "no instance could vanish: no node's pods fit elsewhere")


def _instances(stack: SimStack) -> list[Obj]:
    filters = [
        {"Name": f"tag:{k.cluster_tag(stack.cluster_name)}", "Values": ["owned"]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]},
    ]
    pages = stack._sim_ec2.get_paginator("describe_instances").paginate(Filters=filters)
    return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]


def _tags(instance: Obj) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags") or ()}


# -- spot interruptions -----------------------------------------------------------------------------


def _envelope(detail_type: str, instance_id: str, region: str, detail: Obj) -> str:
    return json.dumps(
        {
            "version": "0",
            "id": str(uuid.uuid4()),
            "detail-type": detail_type,
            "source": "aws.ec2",
            "account": ACCOUNT,
            "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "region": region,
            "resources": [f"arn:aws:ec2:{region}:{ACCOUNT}:instance/{instance_id}"],
            "detail": detail,
        }
    )


async def spot_interruption(
    stack: SimStack, sqs: Any, queue_url: str, rng: random.Random, effects: Effects, reclaim_after: float
) -> None:
    spot = sorted(
        name
        for name, node in ((n["metadata"]["name"], n) for n in stack.store.list("nodes").items)
        if (node["metadata"].get("labels") or {}).get(k.CAPACITY_TYPE_LABEL) == "spot"
        and not node["metadata"].get("deletionTimestamp")
        and _instance_of(node) not in effects.warned
        and _instance_of(node)
    )
    if not spot:
        effects.note("skipped", "no spot node left to interrupt")
        return
    name = rng.choice(spot)
    node = stack.store.get("nodes", name)
    instance_id = _instance_of(node)
    assert instance_id is not None
    effects.warned.add(instance_id)
    warning = _envelope(
        "EC2 Spot Instance Interruption Warning",
        instance_id,
        stack.region,
        {"instance-id": instance_id, "instance-action": "terminate"},
    )
    rebalance = _envelope(
        "EC2 Instance Rebalance Recommendation", instance_id, stack.region, {"instance-id": instance_id}
    )
    canonical = rng.choice([[rebalance, warning], [warning, rebalance], [rebalance, warning, rebalance]])
    messages = list(canonical)
    duplicates = [m for m in canonical if rng.random() < 0.4]
    messages += duplicates  # an exact copy: SQS delivers at least once
    if rng.random() < 0.5:
        rng.shuffle(messages)
    reordered = messages[: len(canonical)] != canonical
    for body in messages:
        await asyncio.to_thread(sqs.send_message, QueueUrl=queue_url, MessageBody=body)
        await asyncio.sleep(rng.uniform(0.0, 0.3))
    effects.note(
        "sqs-spot-warning",
        f"spot interruption of {name} ({instance_id}): {len(messages)} messages"
        f"{', reordered' if reordered else ''}{f', {len(duplicates)} duplicated' if duplicates else ''}",
    )
    effects.counts["sqs-rebalance"] += sum(1 for m in messages if "Rebalance" in m)
    effects.counts["sqs-duplicate"] += len(duplicates)
    effects.counts["sqs-reordered"] += int(reordered)

    async def reclaim() -> None:
        await asyncio.sleep(reclaim_after)
        live = {i["InstanceId"] for i in await asyncio.to_thread(_instances, stack)}
        if instance_id in live:
            await asyncio.to_thread(_take, stack, instance_id)
            effects.note(
                "spot-reclaimed", f"EC2 reclaimed spot instance {instance_id} two minutes after its warning"
            )

    effects.pending.append(asyncio.create_task(reclaim(), name=f"reclaim-{instance_id}"))


# -- workload churn --------------------------------------------------------------------------------


def _deployment(name: str, replicas: int, cpu: str, memory: str) -> Obj:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": CHURN_NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": name,
                            "image": f"public.ecr.aws/karpflow/{name}:1.0",
                            "resources": {"requests": {"cpu": cpu, "memory": memory}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 30,
                },
            },
        },
    }


def _pod_like(deployment: Obj) -> Obj:
    return {"spec": deployment["spec"]["template"]["spec"], "metadata": {}}


def churn(stack: SimStack, rng: random.Random, effects: Effects) -> None:
    store = stack.store
    action = rng.choice(["scale", "scale", "delete-pod", "create", "delete"])
    try:
        if action == "scale":
            namespace, name = rng.choice(CHURNED + tuple(_churn_deployments(stack)))
            deployment = store.get("deployments", name, namespace)
            replicas = int(deployment["spec"].get("replicas", 1))
            up = rng.random() < 0.5 or replicas <= 1
            if up and (replicas >= 10 or not Room.of(stack).place(_pod_like(deployment), margin=1.5)):
                up = False
            if not up and replicas <= 1:
                return
            store.patch("deployments", name, {"spec": {"replicas": replicas + (1 if up else -1)}}, namespace)
            effects.note(
                f"churn-scale-{'up' if up else 'down'}",
                f"scaled {namespace}/{name} to {replicas + (1 if up else -1)}",
            )
        elif action == "delete-pod":
            pods = [
                p
                for p in store.list("pods").items
                if (p["metadata"].get("namespace"), (p["metadata"].get("labels") or {}).get("app")) in CHURNED
                and _live(p)
            ]
            if pods:
                pod = rng.choice(sorted(pods, key=lambda p: p["metadata"]["name"]))
                store.delete("pods", pod["metadata"]["name"], pod["metadata"]["namespace"])
                effects.note(
                    "churn-pod-deleted",
                    f"deleted pod {pod['metadata']['namespace']}/{pod['metadata']['name']}",
                )
        elif action == "create":
            if len(_churn_deployments(stack)) >= 4:
                return
            name = f"job-{rng.randrange(16**6):06x}"
            deployment = _deployment(name, rng.randint(1, 3), rng.choice(("50m", "100m")), "64Mi")
            room = Room.of(stack)
            if all(
                room.place(_pod_like(deployment), margin=1.5) for _ in range(deployment["spec"]["replicas"])
            ):
                _ensure_namespace(stack)
                store.create("deployments", deployment, CHURN_NAMESPACE)
                effects.note("churn-deployment-created", f"created deployment {CHURN_NAMESPACE}/{name}")
        else:
            existing = _churn_deployments(stack)
            if existing:
                namespace, name = rng.choice(existing)
                store.delete("deployments", name, namespace)
                effects.note("churn-deployment-deleted", f"deleted deployment {namespace}/{name}")
    except ApiError as err:  # the object changed under us (karpflow drains, controllers scale)
        effects.note("skipped", f"churn {action}: {err}")


def _churn_deployments(stack: SimStack) -> list[tuple[str, str]]:
    try:
        items = stack.store.list("deployments", CHURN_NAMESPACE).items
    except ApiError:
        return []
    return sorted(
        (CHURN_NAMESPACE, d["metadata"]["name"]) for d in items if not d["metadata"].get("deletionTimestamp")
    )


def _ensure_namespace(stack: SimStack) -> None:
    try:
        stack.store.get("namespaces", CHURN_NAMESPACE)
    except ApiError:
        stack.store.create(
            "namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CHURN_NAMESPACE}}
        )


def drift_nodepool(stack: SimStack, rng: random.Random, effects: Effects, pool: str = "batch") -> None:
    """A new label in the template: a new NodePool hash, so every node of the pool drifts."""
    revision = f"r{rng.randrange(1000)}"

    def edit(obj: Obj) -> None:
        template = obj["spec"]["template"].setdefault("metadata", {})
        template.setdefault("labels", {})["chaos-revision"] = revision

    stack.store.mutate("nodepools", pool, edit)
    effects.note(
        "drift-nodepool", f"NodePool {pool}: template label chaos-revision={revision} (its nodes drift)"
    )
