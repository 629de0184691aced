"""Realistic cluster objects for tests, property tests and benchmarks.

`ClusterBuilder` writes the dicts `kubectl get ... -o yaml` would print (labels, capacity and
allocatable from the catalog, Ready conditions, owner references, pod status) so tests exercise the
same loader as real snapshots. A node's AMI, subnet and security groups are not Kubernetes state:
they are kept as the EC2 instances `aws ec2 describe-instances` would print, beside the objects.
`generate_cluster` builds a random but reproducible cluster of any size from a seed (used by the
hypothesis properties and by bench/gen_cluster.py).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from api.constants import (
    CAPACITY_TYPE_LABEL,
    DEFAULT_POD_TOLERATIONS,
    DO_NOT_DISRUPT_ANNOTATION,
    EC2NODECLASS_LABEL,
    HOSTNAME_LABEL,
    INITIALIZED_LABEL,
    NODEPOOL_HASH_ANNOTATION,
    NODEPOOL_HASH_VERSION_ANNOTATION,
    NODEPOOL_LABEL,
    REGION_LABEL,
    REGISTERED_LABEL,
    ZONE_LABEL,
)
from api.nodepool import NodePool
from api.quantity import millicores, to_int
from planner.catalog import Catalog, bundled_catalog
from planner.drift import NODEPOOL_HASH_VERSION, nodepool_hash_annotations
from planner.model import PlanContext, PlanOptions, Simulate
from planner.snapshot import Snapshot, parse_nodepool

DEFAULT_NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
_YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# What Karpenter's NodeClaim CRD requires of every spec (tests add their own fields to it).
NODECLAIM_SPEC: dict[str, Any] = {
    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
    "requirements": [],
}


def ts(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ClusterBuilder:
    """Accumulates Kubernetes objects; every method returns the dict it added (tweak it freely)."""

    now: datetime = DEFAULT_NOW
    region: str = "us-west-2"
    catalog: Catalog | None = None
    objects: list[dict[str, Any]] = field(default_factory=list)
    # The nodes' EC2 instances, as DescribeInstances prints them (what EC2NodeClass drift reads).
    instances: list[dict[str, Any]] = field(default_factory=list)
    _uid: int = 0

    def __post_init__(self) -> None:
        if self.catalog is None:
            self.catalog = bundled_catalog(self.region)

    def _next_uid(self) -> str:
        self._uid += 1
        return f"00000000-0000-4000-8000-{self._uid:012d}"

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.objects.append(obj)
        return obj

    # -- Karpenter objects -------------------------------------------------------------------------
    def nodepool(
        self,
        name: str = "default",
        *,
        policy: str = "WhenEmptyOrUnderutilized",
        consolidate_after: str = "0s",
        budgets: list[dict[str, Any]] | None = None,
        expire_after: str = "720h",
        termination_grace_period: str | None = None,
        requirements: list[dict[str, Any]] | None = None,
        labels: Mapping[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
        nodeclass: str = "default",
        weight: int | None = None,
        replicas: int | None = None,
        limits: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        template_spec: dict[str, Any] = {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": nodeclass},
            "requirements": requirements
            if requirements is not None
            else [
                {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand", "spot"]},
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            ],
            "expireAfter": expire_after,
        }
        if termination_grace_period is not None:
            template_spec["terminationGracePeriod"] = termination_grace_period
        if taints:
            template_spec["taints"] = taints
        spec: dict[str, Any] = {
            "template": {"metadata": {"labels": dict(labels or {})}, "spec": template_spec},
            "disruption": {"consolidationPolicy": policy, "consolidateAfter": consolidate_after},
        }
        if budgets is not None:
            spec["disruption"]["budgets"] = budgets
        if weight is not None:
            spec["weight"] = weight
        if replicas is not None:  # a static NodePool (Karpenter v1.8)
            spec["replicas"] = replicas
        if limits is not None:
            spec["limits"] = dict(limits)
        return self.add(
            {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodePool",
                "metadata": {
                    "name": name,
                    "uid": self._next_uid(),
                    "creationTimestamp": ts(self.now - timedelta(days=60)),
                },
                "spec": spec,
            }
        )

    def nodeclass(
        self,
        name: str = "default",
        *,
        amis: Sequence[str] = ("ami-0new000000000000a",),
        subnets: Mapping[str, str] | None = None,
        security_groups: Sequence[str] = ("sg-0aaa",),
    ) -> dict[str, Any]:
        subnets = subnets or {f"subnet-{z[-1]}": z for z in self.catalog.zones}  # type: ignore[union-attr]
        return self.add(
            {
                "apiVersion": "karpenter.k8s.aws/v1",
                "kind": "EC2NodeClass",
                "metadata": {"name": name, "uid": self._next_uid()},
                "spec": {
                    "role": "KarpenterNodeRole",
                    "amiSelectorTerms": [{"alias": "al2023@latest"}],
                    "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
                    "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
                },
                "status": {
                    # Karpenter's CRD requires each AMI's requirements; none: any node may use them.
                    "amis": [{"id": a, "name": a, "requirements": []} for a in amis],
                    "subnets": [{"id": s, "zone": z} for s, z in subnets.items()],
                    "securityGroups": [{"id": g} for g in security_groups],
                },
            }
        )

    def _pool_model(self, name: str) -> NodePool | None:
        for obj in self.objects:
            if obj.get("kind") == "NodePool" and obj["metadata"]["name"] == name:
                return parse_nodepool(obj)[0]
        return None

    # -- Nodes -------------------------------------------------------------------------------------
    def node(
        self,
        name: str,
        *,
        pool: str | None = "default",
        instance_type: str = "m5.large",
        zone: str | None = None,
        capacity_type: str = "on-demand",
        age: timedelta = timedelta(days=2),
        ready: bool = True,
        ready_for: timedelta | None = None,
        initialized: bool = True,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        taints: list[dict[str, Any]] | None = None,
        stamp_hash: bool = True,
        ami: str | None = "ami-0new000000000000a",
        subnet: str | None = None,
        security_groups: str | None = "sg-0aaa",
        deleting: bool = False,
        nodeclass: str = "default",
    ) -> dict[str, Any]:
        assert self.catalog is not None
        zone = zone or self.catalog.zones[0]
        itype = self.catalog.get(instance_type)
        node_labels: dict[str, str] = (
            dict(itype.labels) if itype else {"node.kubernetes.io/instance-type": instance_type}
        )
        node_labels.update(
            {
                HOSTNAME_LABEL: name,
                ZONE_LABEL: zone,
                REGION_LABEL: self.region,
                CAPACITY_TYPE_LABEL: capacity_type,
            }
        )
        node_annotations: dict[str, str] = {}
        if pool is not None:
            node_labels[NODEPOOL_LABEL] = pool
            node_labels[EC2NODECLASS_LABEL] = nodeclass
            node_labels[REGISTERED_LABEL] = "true"
            if initialized:
                node_labels[INITIALIZED_LABEL] = "true"
            model = self._pool_model(pool)
            if stamp_hash and model is not None:
                node_annotations.update(nodepool_hash_annotations(model))
        node_labels.update(labels or {})
        node_annotations.update(annotations or {})
        created = self.now - age
        ready_since = self.now - (ready_for if ready_for is not None else age - timedelta(minutes=1))
        instance_id = f"i-{self._uid + 1:017x}"
        if pool is not None:
            self.instances.append(
                {
                    "InstanceId": instance_id,
                    "InstanceType": instance_type,
                    "Placement": {"AvailabilityZone": zone},
                    **({"ImageId": ami} if ami else {}),
                    "SubnetId": subnet or f"subnet-{zone[-1]}",
                    "SecurityGroups": [
                        {"GroupId": g.strip()} for g in (security_groups or "").split(",") if g.strip()
                    ],
                }
            )
        capacity = itype.capacity if itype else {"cpu": "2", "memory": "8Gi", "pods": "29"}
        allocatable = itype.allocatable if itype else capacity
        metadata: dict[str, Any] = {
            "name": name,
            "uid": self._next_uid(),
            "creationTimestamp": ts(created),
            "labels": node_labels,
            "annotations": node_annotations,
        }
        if pool is not None:
            metadata["finalizers"] = ["karpenter.sh/termination"]
        if deleting:
            metadata["deletionTimestamp"] = ts(self.now - timedelta(minutes=1))
        return self.add(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": metadata,
                "spec": {
                    "providerID": f"aws:///{zone}/{instance_id}",
                    **({"taints": taints} if taints else {}),
                },
                "status": {
                    "capacity": capacity,
                    "allocatable": allocatable,
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True" if ready else "False",
                            "reason": "KubeletReady" if ready else "KubeletNotReady",
                            "lastTransitionTime": ts(ready_since),
                        }
                    ],
                    "nodeInfo": {
                        "kubeletVersion": "v1.32.0-eks",
                        "architecture": node_labels.get("kubernetes.io/arch", "amd64"),
                    },
                },
            }
        )

    # -- Pods --------------------------------------------------------------------------------------
    def pod(
        self,
        name: str,
        node: str | None,
        *,
        namespace: str = "default",
        cpu: str = "100m",
        memory: str = "128Mi",
        app: str | None = None,
        owner: tuple[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        age: timedelta = timedelta(hours=1),
        ready: bool = True,
        phase: str | None = None,
        priority: int | None = None,
        deleting: bool = False,
        spec: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        app = app or name.rsplit("-", 1)[0]
        owner = owner or ("ReplicaSet", f"{app}-5d8f7c")
        started = self.now - age
        phase = phase or ("Running" if node else "Pending")
        pod_labels = {"app": app, **(labels or {})}
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": self._next_uid(),
            "creationTimestamp": ts(started),
            "labels": pod_labels,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "controller": True,
                    "uid": "o-" + owner[1],
                }
            ],
        }
        if annotations:
            metadata["annotations"] = dict(annotations)
        if deleting:
            # Deleted 5 s ago with the default 30 s grace: the API server puts deletionTimestamp at
            # the end of the grace period and records the period.
            metadata["deletionTimestamp"] = ts(self.now + timedelta(seconds=25))
            metadata["deletionGracePeriodSeconds"] = 30
        pod_spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "main",
                    "image": "nginx:1.27",
                    "resources": {"requests": {"cpu": cpu, "memory": memory}},
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [dict(t) for t in DEFAULT_POD_TOLERATIONS],
            **(spec or {}),
        }
        if node:
            pod_spec["nodeName"] = node
        if priority is not None:
            pod_spec["priority"] = priority
        status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
        if node:
            status["startTime"] = ts(started)
            status["conditions"] = [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(started)},
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ts(started)},
            ]
        return self.add(
            {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec, "status": status}
        )

    def daemonset_pod(
        self, node: str, ds: str = "kube-proxy", *, cpu: str = "100m", memory: str = "64Mi"
    ) -> dict[str, Any]:
        return self.pod(
            f"{ds}-{node}",
            node,
            namespace="kube-system",
            cpu=cpu,
            memory=memory,
            app=ds,
            owner=("DaemonSet", ds),
            spec={"tolerations": [{"operator": "Exists"}]},
        )

    def daemonset(
        self, name: str = "kube-proxy", *, cpu: str = "100m", memory: str = "64Mi"
    ) -> dict[str, Any]:
        return self.add(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": "kube-system", "uid": self._next_uid()},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {
                            "containers": [
                                {"name": name, "resources": {"requests": {"cpu": cpu, "memory": memory}}}
                            ],
                            "tolerations": [{"operator": "Exists"}],
                        },
                    },
                },
            }
        )

    def pdb(
        self,
        name: str,
        *,
        namespace: str = "default",
        match_labels: Mapping[str, str] | None = None,
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
        allowed: int | None = None,
        unhealthy_pod_eviction_policy: str | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels or {"app": name})}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if unhealthy_pod_eviction_policy:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
        obj: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "uid": self._next_uid()},
            "spec": spec,
        }
        if allowed is not None:
            obj["status"] = {
                "disruptionsAllowed": allowed,
                "currentHealthy": 0,
                "desiredHealthy": 0,
                "expectedPods": 0,
            }
        return self.add(obj)

    # -- karpflow's operator controls (karpflow.dev/v1alpha1) -----------------------------------------
    def maintenance_window(
        self,
        name: str,
        *,
        actions: list[str],
        schedules: list[dict[str, str]] | None = None,
        selector: list[dict[str, Any]] | None = None,
        mode: str | None = None,
        time_zone: str | None = None,
        exclusions: list[dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"actions": actions}
        if schedules:
            spec["schedules"] = schedules
        if selector:
            spec["selector"] = selector
        if mode:
            spec["mode"] = mode
        if time_zone:
            spec["timeZone"] = time_zone
        if exclusions:
            spec["exclusions"] = exclusions
        return self.add(
            {
                "apiVersion": "karpflow.dev/v1alpha1",
                "kind": "MaintenanceWindow",
                "metadata": {"name": name, "uid": self._next_uid(), "generation": 1},
                "spec": spec,
            }
        )

    def node_disruption_budget(
        self,
        name: str,
        *,
        selector: dict[str, Any] | None,
        max_unavailable: int | str | None = None,
        min_available: int | str | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": selector}
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        if min_available is not None:
            spec["minAvailable"] = min_available
        return self.add(
            {
                "apiVersion": "karpflow.dev/v1alpha1",
                "kind": "NodeDisruptionBudget",
                "metadata": {"name": name, "uid": self._next_uid(), "generation": 1},
                "spec": spec,
            }
        )

    # -- Output ------------------------------------------------------------------------------------
    def as_list(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": ""},
            "items": self.objects,
        }

    def describe_instances(self) -> dict[str, Any]:
        """The nodes' instances as `aws ec2 describe-instances --output json` prints them."""
        return {"Reservations": [{"Instances": self.instances}]}

    def to_yaml(self) -> str:
        return yaml.dump(self.as_list(), Dumper=_YAML_DUMPER, sort_keys=False)

    def write(self, path: str | Path, fmt: str | None = None) -> Path:
        """The objects as one file. YAML gets the instances as a second document (one file holds
        what `kubectl get` and `aws ec2 describe-instances` print); JSON stays one streamable List,
        see `write_instances`."""
        path = Path(path)
        fmt = fmt or ("json" if path.suffix == ".json" else "yaml")
        if fmt == "json":
            import json

            path.write_text(json.dumps(self.as_list(), separators=(",", ":")))
        else:
            documents = [self.as_list(), *([self.describe_instances()] if self.instances else [])]
            path.write_text(yaml.dump_all(documents, Dumper=_YAML_DUMPER, sort_keys=False))
        return path

    def write_instances(self, path: str | Path) -> Path:
        """The instances alone, as JSON (a second `--snapshot` file for `karpflow plan`)."""
        import json

        path = Path(path)
        path.write_text(json.dumps(self.describe_instances(), separators=(",", ":")))
        return path

    def snapshot(self, via_yaml: bool = True) -> Snapshot:
        """The Snapshot a loader would build from these objects (through YAML text by default)."""
        objects: Iterable[Mapping[str, Any]] = self.objects
        instances: Iterable[Mapping[str, Any]] = self.instances
        if via_yaml:
            objects = yaml.load(self.to_yaml(), Loader=_YAML_LOADER)["items"]
            instances = yaml.load(yaml.dump(self.instances, Dumper=_YAML_DUMPER), Loader=_YAML_LOADER) or []
        return Snapshot.from_objects(objects, now=self.now, instances=instances)

    def context(self, options: PlanOptions | None = None, simulate: Simulate | None = None) -> PlanContext:
        """A PlanContext over this cluster (for testing one rule at a time)."""
        assert self.catalog is not None
        return PlanContext(self.snapshot(), self.catalog, options or PlanOptions(), simulate)


# --- Random clusters ------------------------------------------------------------------------------

_POOL_TYPES = {
    "general": ["m5.large", "m5.xlarge", "m6i.xlarge", "m6i.2xlarge", "m7i.xlarge", "t3.large"],
    "compute": ["c5.xlarge", "c6i.2xlarge", "c7i.xlarge", "c6i.4xlarge"],
    "memory": ["r5.large", "r6i.xlarge", "r7i.2xlarge"],
    "arm": ["m6g.xlarge", "c6g.2xlarge", "m7g.large", "r6g.xlarge"],
}
_REQUESTS = [
    ("50m", "64Mi"),
    ("100m", "128Mi"),
    ("250m", "256Mi"),
    ("250m", "512Mi"),
    ("500m", "1Gi"),
    ("1", "2Gi"),
]


@dataclass
class ClusterSpec:
    """Knobs of a generated cluster (fractions are of nodes or of workloads)."""

    nodes: int = 50
    pods: int = 500
    pools: int = 3
    empty_fraction: float = 0.08
    drifted_fraction: float = 0.05
    do_not_disrupt_fraction: float = 0.03
    pdb_fraction: float = 0.3  # of workloads
    blocking_pdb_fraction: float = 0.3  # of PDBs: disruptionsAllowed 0
    not_ready_fraction: float = 0.02
    expired_fraction: float = 0.02
    deployment_size: int = 10
    seed: int = 0
    budgets: list[list[dict[str, Any]]] | None = None  # per pool, cycled
    # Instance types per pool kind (general, compute, memory, arm) and (cpu, memory) request choices.
    pool_types: dict[str, list[str]] | None = None
    requests: list[tuple[str, str]] | None = None


STALE_NODEPOOL_HASH = {
    NODEPOOL_HASH_ANNOTATION: "0000000000000000",
    NODEPOOL_HASH_VERSION_ANNOTATION: NODEPOOL_HASH_VERSION,
}


def generate_cluster(
    spec: ClusterSpec, region: str = "us-west-2", now: datetime = DEFAULT_NOW
) -> ClusterBuilder:
    """A reproducible random cluster: pools across zones and types, Deployments with realistic
    requests spread over the non-empty nodes (never beyond allocatable), DaemonSet pods on every node,
    PDBs (some blocking), do-not-disrupt pods, drifted, expired, NotReady and empty nodes."""
    rng = random.Random(spec.seed)
    b = ClusterBuilder(now=now, region=region)
    catalog = b.catalog
    assert catalog is not None
    b.nodeclass()
    b.daemonset("kube-proxy", cpu="100m", memory="64Mi")
    b.daemonset("aws-node", cpu="25m", memory="64Mi")
    kinds = list(_POOL_TYPES)
    pools = []
    default_budgets = [
        [{"nodes": "10%"}],
        [
            {"nodes": "2"},
            {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h", "reasons": ["Underutilized"]},
        ],
        [{"nodes": "20%", "reasons": ["Empty", "Drifted"]}, {"nodes": "1"}],
        [{"nodes": "50%"}],
    ]
    budget_choices = spec.budgets or default_budgets
    for index in range(spec.pools):
        kind = kinds[index % len(kinds)]
        name = f"{kind}-{index}" if index >= len(kinds) else kind
        arch = "arm64" if kind == "arm" else "amd64"
        b.nodepool(
            name,
            consolidate_after=rng.choice(["0s", "30s", "5m", "1h"]),
            budgets=budget_choices[index % len(budget_choices)],
            termination_grace_period=rng.choice([None, "1h"]),
            requirements=[
                {"key": CAPACITY_TYPE_LABEL, "operator": "In", "values": ["on-demand", "spot"]},
                {"key": "kubernetes.io/arch", "operator": "In", "values": [arch]},
            ],
            labels={"workload": kind},
        )
        pools.append((name, (spec.pool_types or _POOL_TYPES)[kind]))
    zones = catalog.zones
    # Nodes: free room tracked so pods never exceed allocatable.
    free: dict[str, list[int]] = {}
    node_names = []
    ds_cpu, ds_mem = 125, 128 << 20  # the two DaemonSet pods below
    empties = set()
    for index in range(spec.nodes):
        pool, types = pools[index % len(pools)]
        name = f"ip-10-{index // 65536 % 256}-{index // 256 % 256}-{index % 256}.{region}.compute.internal"
        itype = catalog.get(rng.choice(types))
        assert itype is not None
        roll = rng.random()
        drifted = roll < spec.drifted_fraction
        expired = spec.drifted_fraction <= roll < spec.drifted_fraction + spec.expired_fraction
        not_ready = rng.random() < spec.not_ready_fraction
        b.node(
            name,
            pool=pool,
            instance_type=itype.name,
            zone=zones[index % len(zones)],
            capacity_type=rng.choice(["on-demand", "on-demand", "spot"]),
            age=timedelta(days=31) if expired else timedelta(hours=rng.randint(2, 600)),
            ready=not not_ready,
            # Drifted by its NodePool's template, which the node's own annotations say (a JSON file
            # of the cluster, streamed by the loader, carries no EC2 instances to drift by AMI).
            stamp_hash=not drifted,
            annotations=STALE_NODEPOOL_HASH if drifted else None,
        )
        node_names.append(name)
        b.daemonset_pod(name, "kube-proxy", cpu="100m", memory="64Mi")
        b.daemonset_pod(name, "aws-node", cpu="25m", memory="64Mi")
        alloc = itype.allocatable_resources
        free[name] = [alloc.cpu - ds_cpu, alloc.memory - ds_mem, alloc.pods - 2]
        if rng.random() < spec.empty_fraction:
            empties.add(name)
    fillable = [n for n in node_names if n not in empties]
    # Workloads.
    placed = 0
    workload = 0
    pdb_apps: list[str] = []
    while placed < spec.pods and fillable:
        app = f"app-{workload}"
        workload += 1
        namespace = f"team-{workload % 7}"
        cpu, memory = rng.choice(spec.requests or _REQUESTS)
        need_cpu, need_mem = millicores(cpu), to_int(memory)
        replicas = min(
            spec.pods - placed, max(1, int(rng.gauss(spec.deployment_size, spec.deployment_size / 3)))
        )
        protected = rng.random() < spec.do_not_disrupt_fraction
        if rng.random() < spec.pdb_fraction:
            blocking = rng.random() < spec.blocking_pdb_fraction
            b.pdb(
                f"{app}-pdb",
                namespace=namespace,
                match_labels={"app": app},
                max_unavailable=1,
                allowed=0 if blocking else 1,
            )
            pdb_apps.append(app)
        for replica in range(replicas):
            # A few random probes for a node with room; give up on the replica otherwise.
            for _ in range(8):
                target = rng.choice(fillable)
                room = free[target]
                if room[0] >= need_cpu and room[1] >= need_mem and room[2] >= 1:
                    room[0] -= need_cpu
                    room[1] -= need_mem
                    room[2] -= 1
                    b.pod(
                        f"{app}-{replica}",
                        target,
                        namespace=namespace,
                        cpu=cpu,
                        memory=memory,
                        app=app,
                        age=timedelta(minutes=rng.randint(10, 5000)),
                        annotations={DO_NOT_DISRUPT_ANNOTATION: "true"} if protected else None,
                    )
                    placed += 1
                    break
            else:
                placed += 1  # count it anyway so generation terminates on a full cluster
    return b
