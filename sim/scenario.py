"""Scenarios: seed the simulated cluster from what `kubectl get ... -o yaml` prints.

A scenario file is a Kubernetes `List` (`kind: List` or any `*List` with `items`), a stream of
YAML documents, or JSON — for example the output of

    kubectl get nodes,pods,pdb,deploy,rs,ds,nodepools,ec2nodeclasses -A -o yaml

Loading (`seed`) makes the cluster consistent with EC2 (moto):

- **The cluster gets a VPC of its own** in moto (tag `karpflow.io/cluster: <cluster name>`, laid
  out like a default VPC: 172.31.0.0/16, one /20 per zone), created on first seed.
- **EC2NodeClass status** is resolved against moto the way Karpenter's nodeclass controller
  resolves selectors: subnets and security groups of the cluster's VPC matching
  `subnetSelectorTerms` / `securityGroupSelectorTerms` (by `id`, `tags` or `name`; when none carries
  the tags yet, the VPC's subnets in the scenario's zones and its default group are tagged with
  them), the instance profile (created in moto's IAM with its role, and given to the seeded
  instances), AMIs
  from `amiSelectorTerms` (`id`, `name`, or an `alias` such as `al2023@latest`, matched by name
  among moto's images, one per architecture). Whatever status the file had is replaced.
- **Each Node gets a new instance** of the same type, zone and capacity type (spot through
  `InstanceMarketOptions`), tagged as karpflow would tag it (cluster ownership, nodepool,
  nodeclass, `Name` = node name). The Node keeps its name; when its InternalIP lies in the chosen
  subnet the instance gets that private IP, so the name is also the one a kubelet on that instance
  would register. `spec.providerID` is rewritten to `aws:///<zone>/<new-instance-id>`.
- **Server-set metadata is dropped** (resourceVersion, managedFields, generation); uids are
  reassigned by the store, and every ownerReference is rewritten to the new uid of its owner.
  A pod owned by a ReplicaSet the file lacks gets that ReplicaSet synthesised from the Deployment
  that selects it (what `kubectl get deploy,pods` leaves out), so owner chains stay intact.
- Namespaces the objects use are created; pods with `spec.nodeName` stay bound.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from api import constants as k
from sim.apiserver.selectors import selector_from_label_selector
from sim.controllers.workloads import TEMPLATE_HASH_LABEL, template_hash

Obj = dict[str, Any]

# The order objects are created in: owners before dependents, nodes before the pods bound to them.
KIND_ORDER = (
    "Namespace",
    "PriorityClass",
    "EC2NodeClass",
    "NodePool",
    "Node",
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "PodDisruptionBudget",
    "Pod",
)

# libyaml's loader when present: the demo scenario parses in ~50 ms instead of ~500 ms.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# Set by the API server, never by a client: dropped on load.
SERVER_FIELDS = ("resourceVersion", "managedFields", "generation", "selfLink")


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file, the document and the object."""


@dataclass
class Scenario:
    objects: list[Obj]
    source: str = "<scenario>"
    # When the objects were captured (annotation `karpflow.io/captured-at` on the List): seeding
    # shifts every timestamp by now - captured_at so ages are kept. None: timestamps are kept as is.
    captured_at: datetime | None = None

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o.get("kind") == kind]

    @property
    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for obj in self.objects:
            counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
        return counts

    def ordered(self) -> list[Obj]:
        rank = {kind: i for i, kind in enumerate(KIND_ORDER)}
        return sorted(self.objects, key=lambda o: rank.get(o["kind"], len(rank)))


def name_of(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{obj.get('kind')} {namespace + '/' if namespace else ''}{meta.get('name', '?')}"


def _flatten(document: Any, where: str) -> Iterable[Obj]:
    if document is None:
        return
    if not isinstance(document, dict):
        raise ScenarioError(f"{where}: expected a Kubernetes object or List, got {type(document).__name__}")
    kind = document.get("kind")
    if isinstance(kind, str) and kind.endswith("List") and "items" in document:
        for i, item in enumerate(document.get("items") or []):
            yield from _flatten(item, f"{where}, item {i}")
        return
    if not kind or not document.get("apiVersion"):
        raise ScenarioError(f"{where}: object without apiVersion/kind ({str(document)[:80]})")
    meta = document.get("metadata")
    if not isinstance(meta, dict) or not meta.get("name"):
        raise ScenarioError(f"{where}: {kind} without metadata.name")
    yield _stringify_times(document)


def _stringify_times(value: Any) -> Any:
    """YAML reads an unquoted `2026-01-15T12:00:00Z` as a datetime; the API wants the RFC3339 text."""
    if isinstance(value, dict):
        return {key: _stringify_times(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_stringify_times(v) for v in value]
    if isinstance(value, datetime):
        return _format_time(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, date):
        return value.isoformat()
    return value


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Parse YAML (one List, or many documents) or JSON into a Scenario. Raises ScenarioError."""
    try:
        if text.lstrip().startswith(("{", "[")):
            documents = [json.loads(text)]
        else:
            documents = list(yaml.load_all(text, Loader=_YAML_LOADER))
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        raise ScenarioError(f"{source}: not valid YAML or JSON: {err}") from err
    return scenario_from_documents(documents, source)


def scenario_from_documents(documents: list[Any], source: str = "<scenario>") -> Scenario:
    """What `parse_scenario` makes of the documents it read, for documents already in memory (a
    generator's List): no YAML round trip, which cost the test suite's collection seconds."""
    objects: list[Obj] = []
    captured: datetime | None = None
    for index, document in enumerate(documents):
        items = document if isinstance(document, list) else [document]
        for item in items:
            captured = captured or captured_at(item)
            objects.extend(_flatten(item, f"{source}, document {index}"))
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace") or "", meta["name"])
        if key in seen:
            raise ScenarioError(f"{source}: {name_of(obj)} appears twice")
        seen.add(key)
    return Scenario(objects=objects, source=source, captured_at=captured)


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ScenarioError(f"cannot read scenario {path}: {err.strerror}") from err
    return parse_scenario(text, str(path))


# ----------------------------------------------------------------------------------------------
# Seeding


CAPTURED_AT_ANNOTATION = "karpflow.io/captured-at"
# Fields holding times that move with the capture time (RFC3339 strings).
TIME_FIELDS = frozenset(
    {
        "creationTimestamp",
        "deletionTimestamp",
        "lastTransitionTime",
        "lastHeartbeatTime",
        "lastProbeTime",
        "lastUpdateTime",
        "startTime",
        "startedAt",
        "finishedAt",
    }
)
EC2_ASSUME_ROLE = (
    '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},'
    '"Action":"sts:AssumeRole"}]}'
)
# Tag naming the cluster a simulated VPC belongs to.
CLUSTER_VPC_TAG = "karpflow.io/cluster"
# amiSelectorTerms aliases → name patterns of moto's bundled images ({arch}: x86_64 / arm64).
AMI_ALIAS_PATTERNS = {
    "al2023": "al2023-ami-2023.*-kernel-6.1-{arch}",
    "al2": "amzn2-ami-hvm-2.0.*-{arch}-gp2",
}
EC2_ARCH = {"amd64": "x86_64", "arm64": "arm64"}
KUBE_ARCH = {"x86_64": "amd64", "arm64": "arm64"}


@dataclass
class SeedReport:
    created: dict[str, int]  # kind -> count
    instances: dict[str, str]  # node name -> instance id
    warnings: list[str] = field(default_factory=list)


def captured_at(scenario_text_objects: Any) -> datetime | None:
    """The capture time a List may carry in annotation `karpflow.io/captured-at`."""
    if not isinstance(scenario_text_objects, dict):
        return None
    annotations = (scenario_text_objects.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(CAPTURED_AT_ANNOTATION)
    return _parse_time(value) if isinstance(value, str) else None


def _parse_time(text: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _format_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def shift_times(obj: Any, delta: timedelta) -> Any:
    """Move every timestamp field (and the termination deadline annotation) by `delta`, in place."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, str) and (key in TIME_FIELDS or key == k.TERMINATION_TIMESTAMP_ANNOTATION):
                parsed = _parse_time(value)
                if parsed is not None:
                    obj[key] = _format_time(parsed + delta)
            else:
                shift_times(value, delta)
    elif isinstance(obj, list):
        for item in obj:
            shift_times(item, delta)
    return obj


class _Ec2:
    """What the loader needs from moto, through boto3: the cluster's VPC, resolving selectors,
    launching. Each cluster gets a VPC of its own (tag `karpflow.io/cluster`), laid out like a
    default VPC (172.31.0.0/16, one /20 per zone), so clusters sharing one moto never collide on
    private addresses."""

    def __init__(self, ec2: Any, cluster_name: str, zones: set[str]) -> None:
        self.ec2 = ec2
        self.cluster_name = cluster_name
        self.zones = zones
        self._vpc: str | None = None
        self._iam: Any = None
        self._images: dict[str, list[Obj]] = {}  # name pattern -> images
        self.new_vpc = False
        self.new_subnets: list[Obj] = []  # created with a new VPC
        self.ips_in_use: set[str] = set()

    def vpc(self) -> str:
        if self._vpc is None:
            found = self.ec2.describe_vpcs(
                Filters=[{"Name": f"tag:{CLUSTER_VPC_TAG}", "Values": [self.cluster_name]}]
            )
            if found["Vpcs"]:
                self._vpc = found["Vpcs"][0]["VpcId"]
            else:
                self._vpc = self._create_vpc()
                self.new_vpc = True
        return self._vpc

    def _create_vpc(self) -> str:
        tags = [
            {"Key": CLUSTER_VPC_TAG, "Value": self.cluster_name},
            {"Key": "Name", "Value": self.cluster_name},
        ]
        vpc = self.ec2.create_vpc(
            CidrBlock="172.31.0.0/16", TagSpecifications=[{"ResourceType": "vpc", "Tags": tags}]
        )["Vpc"]["VpcId"]
        # Subnets in the scenario's zones (every zone of the region for an empty scenario).
        zones = self.zones or {
            z["ZoneName"] for z in self.ec2.describe_availability_zones()["AvailabilityZones"]
        }
        for zone in sorted(zones):
            index = ord(zone[-1]) - ord("a")
            if not 0 <= index < 16:
                continue
            subnet = self.ec2.create_subnet(
                VpcId=vpc,
                CidrBlock=f"172.31.{16 * index}.0/20",
                AvailabilityZone=zone,
                TagSpecifications=[
                    {
                        "ResourceType": "subnet",
                        "Tags": [*tags[:1], {"Key": "Name", "Value": f"{self.cluster_name}-{zone}"}],
                    }
                ],
            )["Subnet"]
            self.new_subnets.append(subnet)
        return vpc

    def _in_vpc(self) -> dict[str, Any]:
        return {"Name": "vpc-id", "Values": [self.vpc()]}

    @staticmethod
    def _tag_filters(tags: dict[str, str]) -> list[dict[str, Any]]:
        return [
            {"Name": f"tag:{key}", "Values": [value]}
            if value != "*"
            else {"Name": "tag-key", "Values": [key]}
            for key, value in tags.items()
        ]

    @staticmethod
    def _tags(tags: dict[str, str]) -> list[dict[str, str]]:
        return [{"Key": key, "Value": "" if v == "*" else str(v)} for key, v in tags.items()]

    def subnets(self, terms: list[Obj], where: str) -> list[Obj]:
        found: dict[str, Obj] = {}
        for term in terms or []:
            if term.get("id"):
                subnets = self._describe("describe_subnets", "Subnets", SubnetIds=[term["id"]])
            elif term.get("tags"):
                filters = [self._in_vpc(), *self._tag_filters(term["tags"])]
                # A VPC made just now has no tagged subnet: skip asking.
                subnets = [] if self.new_vpc else self.ec2.describe_subnets(Filters=filters)["Subnets"]
                if not subnets:
                    # Tag the cluster's subnets in the scenario's zones, as the cluster's owner would have.
                    candidates = (
                        self.new_subnets or self.ec2.describe_subnets(Filters=[self._in_vpc()])["Subnets"]
                    )
                    subnets = [c for c in candidates if not self.zones or c["AvailabilityZone"] in self.zones]
                    self.ec2.create_tags(
                        Resources=[c["SubnetId"] for c in subnets], Tags=self._tags(term["tags"])
                    )
            else:
                subnets = []
            for subnet in subnets:
                found[subnet["SubnetId"]] = subnet
        if not found:
            raise ScenarioError(f"{where}: no subnet matches subnetSelectorTerms {terms}")
        return sorted(found.values(), key=lambda s: s["AvailabilityZone"])

    def security_groups(self, terms: list[Obj], where: str) -> list[Obj]:
        found: dict[str, Obj] = {}
        for term in terms or []:
            if term.get("id"):
                groups = self._describe("describe_security_groups", "SecurityGroups", GroupIds=[term["id"]])
            elif term.get("tags"):
                filters = [self._in_vpc(), *self._tag_filters(term["tags"])]
                groups = (
                    []
                    if self.new_vpc
                    else self.ec2.describe_security_groups(Filters=filters)["SecurityGroups"]
                )
                if not groups:
                    groups = self.ec2.describe_security_groups(
                        Filters=[self._in_vpc(), {"Name": "group-name", "Values": ["default"]}]
                    )["SecurityGroups"]
                    self.ec2.create_tags(
                        Resources=[g["GroupId"] for g in groups], Tags=self._tags(term["tags"])
                    )
            elif term.get("name"):
                groups = self.ec2.describe_security_groups(
                    Filters=[self._in_vpc(), {"Name": "group-name", "Values": [term["name"]]}]
                )["SecurityGroups"]
            else:
                groups = []
            for group in groups:
                found[group["GroupId"]] = group
        if not found:
            raise ScenarioError(f"{where}: no security group matches securityGroupSelectorTerms {terms}")
        return sorted(found.values(), key=lambda g: g["GroupId"])

    def instance_profile(self, nodeclass: Obj) -> str | None:
        """The EC2NodeClass's instance profile, made to exist in moto's IAM (moto checks it at
        launch). As Karpenter does, a class with only `spec.role` gets a profile of its own."""
        spec, status = nodeclass.get("spec") or {}, nodeclass.get("status") or {}
        role = spec.get("role")
        name = status.get("instanceProfile") or spec.get("instanceProfile")
        if not name and role:
            digest = hashlib.sha256(f"{self.cluster_name}/{role}".encode()).hexdigest()[:16]
            name = f"{self.cluster_name}_{digest}"
        if not name:
            return None
        iam = self.iam()
        with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
            iam.create_instance_profile(InstanceProfileName=name)
        if role:
            with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
                iam.create_role(RoleName=role, AssumeRolePolicyDocument=EC2_ASSUME_ROLE)
            with contextlib.suppress(
                iam.exceptions.LimitExceededException, iam.exceptions.EntityAlreadyExistsException
            ):
                iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=role)
        return name

    def iam(self) -> Any:
        if self._iam is None:
            import boto3

            self._iam = boto3.client(
                "iam",
                endpoint_url=self.ec2.meta.endpoint_url,
                region_name=self.ec2.meta.region_name,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        return self._iam

    def _describe(self, call: str, key: str, **kwargs: Any) -> list[Obj]:
        try:
            return getattr(self.ec2, call)(**kwargs)[key]
        except Exception:  # an id from a real account: moto does not know it
            return []

    def amis(self, terms: list[Obj], where: str, warnings: list[str]) -> list[Obj]:
        """One image per architecture (the newest by name), as `status.amis` lists them."""
        images: list[Obj] = []
        for term in terms or []:
            if term.get("id"):
                try:
                    images += self.ec2.describe_images(ImageIds=[term["id"]])["Images"]
                except Exception:
                    warnings.append(f"{where}: AMI {term['id']} is not in moto; ignored")
            elif term.get("alias"):
                family = str(term["alias"]).split("@", 1)[0].lower()
                pattern = AMI_ALIAS_PATTERNS.get(family)
                if pattern is None:
                    warnings.append(f"{where}: moto has no {family} images; using al2023 images instead")
                    pattern = AMI_ALIAS_PATTERNS["al2023"]
                for arch in ("x86_64", "arm64"):
                    matches = self._images_named(pattern.format(arch=arch))
                    if matches:
                        images.append(max(matches, key=lambda i: i.get("Name", "")))
            elif term.get("name"):
                images += self.ec2.describe_images(Filters=[{"Name": "name", "Values": [term["name"]]}])[
                    "Images"
                ]
        newest: dict[str, Obj] = {}
        for image in images:
            arch = image.get("Architecture", "x86_64")
            if arch not in newest or image.get("Name", "") > newest[arch].get("Name", ""):
                newest[arch] = image
        if not newest:
            raise ScenarioError(f"{where}: no AMI matches amiSelectorTerms {terms}")
        return [
            {
                "id": image["ImageId"],
                "name": image.get("Name", ""),
                "requirements": [
                    {"key": k.ARCH_LABEL, "operator": "In", "values": [KUBE_ARCH.get(arch, arch)]}
                ],
            }
            for arch, image in sorted(newest.items())
        ]

    def launch(self, node: Obj, nodeclass_status: Obj | None, subnets_by_zone: dict[str, Obj]) -> Obj:
        """Run one instance for `node` and return its description."""
        meta = node["metadata"]
        labels = meta.get("labels") or {}
        where = f"Node {meta['name']}"
        instance_type = labels.get(k.INSTANCE_TYPE_LABEL) or labels.get("beta.kubernetes.io/instance-type")
        zone = labels.get(k.ZONE_LABEL) or labels.get("failure-domain.beta.kubernetes.io/zone")
        if not instance_type or not zone:
            raise ScenarioError(f"{where}: labels {k.INSTANCE_TYPE_LABEL} and {k.ZONE_LABEL} are required")
        arch = EC2_ARCH.get(labels.get(k.ARCH_LABEL, "amd64"), "x86_64")
        amis = (nodeclass_status or {}).get("amis") or []
        kube_arch = KUBE_ARCH.get(arch, arch)
        matching = [a for a in amis if kube_arch in str(a.get("requirements"))] or amis
        image_id = matching[0]["id"] if matching else self._any_image(arch)
        subnet = subnets_by_zone.get(zone) or self._default_subnet(zone, where)
        groups = [g["id"] for g in (nodeclass_status or {}).get("securityGroups") or []]
        tags = {
            k.cluster_tag(self.cluster_name): k.CLUSTER_TAG_VALUE,
            k.TAG_NODE_NAME: meta["name"],
        }
        if labels.get(k.NODEPOOL_LABEL):
            tags[k.TAG_NODEPOOL] = labels[k.NODEPOOL_LABEL]
        if labels.get(k.EC2NODECLASS_LABEL):
            tags[k.TAG_NODECLASS] = labels[k.EC2NODECLASS_LABEL]
        request: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "SubnetId": subnet["SubnetId"],
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": key, "Value": v} for key, v in tags.items()]}
            ],
        }
        if groups:
            request["SecurityGroupIds"] = groups
        if (nodeclass_status or {}).get("instanceProfile"):
            request["IamInstanceProfile"] = {"Name": nodeclass_status["instanceProfile"]}
        if labels.get(k.CAPACITY_TYPE_LABEL) == k.CAPACITY_SPOT:
            request["InstanceMarketOptions"] = {"MarketType": "spot"}
        ip = next(
            (
                a.get("address")
                for a in (node.get("status") or {}).get("addresses") or []
                if a.get("type") == "InternalIP"
            ),
            None,
        )
        if ip and ip not in self.ips_in_use and _in_cidr(ip, subnet.get("CidrBlock", "")):
            # So the node's name is the one its kubelet would register. A taken address (another
            # cluster in the same moto) is left to EC2 to choose: the node keeps its name anyway.
            request["PrivateIpAddress"] = ip
        try:
            return self.ec2.run_instances(**request)["Instances"][0]
        except Exception as err:
            raise ScenarioError(f"{where}: launching its instance failed: {err}") from err

    def find_ips_in_use(self, ips: Iterable[str]) -> None:
        wanted = sorted(set(ips))
        if not wanted or (self.vpc() and self.new_vpc):
            return  # a new VPC has no address in use
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=[self._in_vpc(), {"Name": "private-ip-address", "Values": wanted}]
        )
        for page in pages:
            for reservation in page.get("Reservations", ()):
                for instance in reservation.get("Instances", ()):
                    if instance.get("PrivateIpAddress"):
                        self.ips_in_use.add(instance["PrivateIpAddress"])

    def _images_named(self, pattern: str) -> list[Obj]:
        if pattern not in self._images:
            self._images[pattern] = self.ec2.describe_images(Filters=[{"Name": "name", "Values": [pattern]}])[
                "Images"
            ]
        return self._images[pattern]

    def _any_image(self, arch: str) -> str:
        pattern = AMI_ALIAS_PATTERNS["al2023"].format(arch=arch)
        images = self.ec2.describe_images(Filters=[{"Name": "name", "Values": [pattern]}])["Images"]
        if not images:
            raise ScenarioError(f"moto has no {arch} image to launch")
        return max(images, key=lambda i: i.get("Name", ""))["ImageId"]

    def _default_subnet(self, zone: str, where: str) -> Obj:
        subnets = self.ec2.describe_subnets(
            Filters=[self._in_vpc(), {"Name": "availability-zone", "Values": [zone]}]
        )["Subnets"]
        if not subnets:
            raise ScenarioError(f"{where}: zone {zone} has no subnet in EC2 (is the region right?)")
        return subnets[0]


def _in_cidr(ip: str, cidr: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)
    except ValueError:
        return False


def _clean(obj: Obj) -> Obj:
    """A copy without what the API server sets itself."""
    obj = copy.deepcopy(obj)
    meta = obj.setdefault("metadata", {})
    for name in SERVER_FIELDS:
        meta.pop(name, None)
    return obj


def _controller_ref(obj: Obj) -> Obj | None:
    return next(
        (r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")), None
    )


def _selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    if not selector:
        return False
    try:
        return selector_from_label_selector(selector).matches(labels)
    except ValueError:
        return False


def _synthesise_replicasets(scenario: Scenario, warnings: list[str]) -> list[Obj]:
    """ReplicaSets that pods name as their controller but the file lacks, rebuilt from Deployments."""
    have = {
        (o["metadata"].get("namespace") or "default", o["metadata"]["name"])
        for o in scenario.of_kind("ReplicaSet")
    }
    deployments = scenario.of_kind("Deployment")
    made: dict[tuple[str, str], Obj] = {}
    for pod in scenario.of_kind("Pod"):
        ref = _controller_ref(pod)
        namespace = pod["metadata"].get("namespace") or "default"
        if (
            ref is None
            or ref.get("kind") != "ReplicaSet"
            or (namespace, ref.get("name")) in have | made.keys()
        ):
            continue
        labels = pod["metadata"].get("labels") or {}
        owner = next(
            (
                d
                for d in deployments
                if (d["metadata"].get("namespace") or "default") == namespace
                and _selects((d.get("spec") or {}).get("selector"), labels)
            ),
            None,
        )
        if owner is None:
            continue
        spec = copy.deepcopy(owner.get("spec") or {})
        template = spec.get("template") or {}
        pod_hash = labels.get("pod-template-hash")
        selector = copy.deepcopy(spec.get("selector") or {})
        if pod_hash:
            template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = pod_hash
            selector.setdefault("matchLabels", {})["pod-template-hash"] = pod_hash
        made[(namespace, ref["name"])] = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": ref["name"],
                "namespace": namespace,
                "uid": ref.get("uid"),
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "annotations": {"deployment.kubernetes.io/revision": "1"},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"].get("uid"),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"replicas": spec.get("replicas", 1), "selector": selector, "template": template},
        }
        warnings.append(
            f"ReplicaSet {namespace}/{ref['name']} was not in the file; rebuilt from its Deployment"
        )
    return list(made.values())


def seed(
    scenario: Scenario,
    store: Any,
    ec2: Any,
    *,
    cluster_name: str,
    now: datetime | None = None,
) -> SeedReport:
    """Create the scenario's objects in `store` and an EC2 instance in moto for each Node.

    `store` is a `sim.apiserver.Store`; `ec2` a boto3 EC2 client for moto. See the module
    docstring for what is rewritten. Raises ScenarioError naming the object that cannot be seeded.
    """
    from sim.apiserver.errors import AlreadyExists, ApiError

    now = now or datetime.now(UTC)
    warnings: list[str] = []
    objects = [_clean(o) for o in scenario.objects]
    if scenario.captured_at is not None:
        delta = now - scenario.captured_at
        for obj in objects:
            shift_times(obj, delta)
    working = Scenario(objects=objects, source=scenario.source)
    objects = objects + _synthesise_replicasets(working, warnings)
    working = Scenario(objects=objects, source=scenario.source)

    # EC2: resolve every EC2NodeClass, then launch one instance per Node.
    zones = {(n["metadata"].get("labels") or {}).get(k.ZONE_LABEL) for n in working.of_kind("Node")} - {None}
    ec2_side = _Ec2(ec2, cluster_name, zones)  # type: ignore[arg-type]
    ec2_side.find_ips_in_use(
        a["address"]
        for n in working.of_kind("Node")
        for a in (n.get("status") or {}).get("addresses") or []
        if a.get("type") == "InternalIP" and a.get("address")
    )
    statuses: dict[str, Obj] = {}
    zone_subnets: dict[str, dict[str, Obj]] = {}  # nodeclass -> zone -> subnet
    for nodeclass in working.of_kind("EC2NodeClass"):
        name, spec = nodeclass["metadata"]["name"], nodeclass.get("spec") or {}
        where = f"EC2NodeClass {name}"
        subnets = ec2_side.subnets(spec.get("subnetSelectorTerms") or [], where)
        groups = ec2_side.security_groups(spec.get("securityGroupSelectorTerms") or [], where)
        status = dict(nodeclass.get("status") or {})
        status["subnets"] = [
            {"id": s["SubnetId"], "zone": s["AvailabilityZone"], "zoneID": s.get("AvailabilityZoneId", "")}
            for s in subnets
        ]
        status["securityGroups"] = [{"id": g["GroupId"], "name": g.get("GroupName", "")} for g in groups]
        status["amis"] = ec2_side.amis(spec.get("amiSelectorTerms") or [], where, warnings)
        profile = ec2_side.instance_profile(nodeclass)
        if profile:
            status["instanceProfile"] = profile
        nodeclass["status"] = statuses[name] = status
        for subnet in subnets:
            zone_subnets.setdefault(name, {}).setdefault(subnet["AvailabilityZone"], subnet)
    pools = {p["metadata"]["name"]: p for p in working.of_kind("NodePool")}
    instances: dict[str, str] = {}
    for node in working.of_kind("Node"):
        labels = node["metadata"].setdefault("labels", {})
        class_name = labels.get(k.EC2NODECLASS_LABEL) or (
            ((pools.get(labels.get(k.NODEPOOL_LABEL, "")) or {}).get("spec") or {})
            .get("template", {})
            .get("spec", {})
            .get("nodeClassRef", {})
            .get("name")
        )
        status = statuses.get(class_name or "")
        instance = ec2_side.launch(node, status, zone_subnets.get(class_name or "", {}))
        zone = instance["Placement"]["AvailabilityZone"]
        # Only the providerID ties the Node to its instance: its AMI, subnet and security groups are
        # EC2's to say (DescribeInstances), as for any real node.
        node.setdefault("spec", {})["providerID"] = k.aws_provider_id(zone, instance["InstanceId"])
        instances[node["metadata"]["name"]] = instance["InstanceId"]

    # Kubernetes: namespaces first, then owners before dependents, rewriting owner uids.
    created: dict[str, int] = {}
    namespaces = {o["metadata"].get("namespace") for o in objects if o["metadata"].get("namespace")}
    namespaces -= {o["metadata"]["name"] for o in working.of_kind("Namespace")}
    for namespace in sorted(namespaces):
        try:
            store.create("namespaces", {"metadata": {"name": namespace}})
            created["Namespace"] = created.get("Namespace", 0) + 1
        except AlreadyExists:
            pass
    new_uids: dict[str, str] = {}
    ages: dict[tuple[str, str, str, str], str] = {}
    current_rs = _current_replicasets(working)  # Deployment uid (file) -> its current ReplicaSet uid
    rehash: dict[str, str] = {}  # ReplicaSet uid (file) -> the pod-template-hash the simulator expects
    for obj in working.ordered():
        meta = obj["metadata"]
        old_uid = meta.pop("uid", None)
        _apply_template_hash(obj, old_uid, rehash)
        refs = []
        for ref in meta.get("ownerReferences") or []:
            if ref.get("uid") in new_uids:
                refs.append({**ref, "uid": new_uids[ref["uid"]]})
            else:
                warnings.append(
                    f"{name_of(obj)}: owner {ref.get('kind')} {ref.get('name')} is not in the file; dropped"
                )
        if refs:
            meta["ownerReferences"] = refs
        else:
            meta.pop("ownerReferences", None)
        resource = _resource_for(obj)
        if resource is None:
            warnings.append(
                f"{name_of(obj)}: the emulator does not serve {obj['apiVersion']} {obj['kind']}; skipped"
            )
            continue
        if meta.get("creationTimestamp"):
            ages[_identity(obj)] = meta["creationTimestamp"]
        try:
            stored = store.create(resource, obj, meta.get("namespace"), keep_status=True)
        except AlreadyExists:
            if obj["kind"] == "Namespace":
                continue
            raise ScenarioError(f"{scenario.source}: {name_of(obj)} already exists in the cluster") from None
        except ApiError as err:
            raise ScenarioError(f"{scenario.source}: {name_of(obj)} was refused: {err}") from err
        if old_uid:
            new_uids[old_uid] = stored["metadata"]["uid"]
            if obj["kind"] == "Deployment" and old_uid in current_rs:
                # Hashed from the template as stored (with the API server's defaults), like the controller.
                rehash[current_rs[old_uid]] = template_hash((stored.get("spec") or {}).get("template") or {})
        created[obj["kind"]] = created.get(obj["kind"], 0) + 1
    _restore_creation_timestamps(store, ages)
    return SeedReport(created=created, instances=instances, warnings=warnings)


def _current_replicasets(scenario: Scenario) -> dict[str, str]:
    """For each Deployment, the ReplicaSet that carries its current template: the highest revision."""

    def revision(rs: Obj) -> tuple[int, int]:
        annotations = rs["metadata"].get("annotations") or {}
        text = str(annotations.get("deployment.kubernetes.io/revision", "0"))
        return (int(text) if text.isdigit() else 0, int((rs.get("spec") or {}).get("replicas", 0)))

    current: dict[str, Obj] = {}
    for rs in scenario.of_kind("ReplicaSet"):
        ref = _controller_ref(rs)
        if ref is None or ref.get("kind") != "Deployment" or not rs["metadata"].get("uid"):
            continue
        best = current.get(ref.get("uid", ""))
        if best is None or revision(rs) > revision(best):
            current[ref.get("uid", "")] = rs
    return {deploy_uid: rs["metadata"]["uid"] for deploy_uid, rs in current.items()}


def _apply_template_hash(obj: Obj, file_uid: str | None, rehash: dict[str, str]) -> None:
    """Give a Deployment's current ReplicaSet, and its pods, the pod-template-hash the simulated
    Deployment controller computes, so it adopts them instead of replacing every pod at start-up.
    (kube-controller-manager hashes differently, so a capture of a real cluster needs this too.)
    Called before owner references are rewritten: they still hold the file's uids."""
    owner = _controller_ref(obj)
    if obj["kind"] == "ReplicaSet":
        target = rehash.get(file_uid or "")
    elif obj["kind"] == "Pod" and owner is not None and owner.get("kind") == "ReplicaSet":
        target = rehash.get(owner.get("uid", ""))
    else:
        target = None
    if target is None:
        return
    spec = obj.get("spec") or {}
    obj["metadata"].setdefault("labels", {})[TEMPLATE_HASH_LABEL] = target
    if obj["kind"] == "ReplicaSet":
        spec.setdefault("selector", {}).setdefault("matchLabels", {})[TEMPLATE_HASH_LABEL] = target
        spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})[
            TEMPLATE_HASH_LABEL
        ] = target


def _identity(obj: Obj) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return (obj.get("apiVersion", ""), obj["kind"], meta.get("namespace") or "", meta["name"])


def _restore_creation_timestamps(store: Any, ages: dict[tuple[str, str, str, str], str]) -> None:
    """Give seeded objects back their creationTimestamp (node age drives expiration).

    kube-apiserver sets creationTimestamp on create and never lets a client change it, and so does
    the store; a dump/load round trip is its only door to stored metadata. It replaces the state
    without change events, which is why the stack seeds before its controllers start.
    """
    if not ages:
        return
    dump = store.dump()
    for items in dump["objects"].values():
        for obj in items:
            wanted = ages.get(_identity(obj))
            if wanted:
                obj["metadata"]["creationTimestamp"] = wanted
    store.load(dump)


def _resource_for(obj: Obj) -> Any:
    """The emulator's resource type for (group, kind), or None when it does not serve it."""
    from sim.apiserver.resources import all_resources

    api_version = obj.get("apiVersion", "v1")
    group = api_version.split("/", 1)[0] if "/" in api_version else ""
    return next((rt for rt in all_resources() if rt.group == group and rt.kind == obj["kind"]), None)
