"""What the simulated Karpenter launches for a NodeClaim: Karpenter's AWS `CloudProvider.Create`, in the
simulator's words.

- The offerings: every instance type of the catalog (the simulator's data, as the neighbour's
  "DescribeInstanceTypes and pricing") whose labels and available offerings satisfy the NodeClaim's
  requirements, in a zone where the EC2NodeClass resolved a subnet, cheapest first (Karpenter asks
  CreateFleet for the lowest price on-demand and price-capacity-optimized spot; the cheapest is what
  the simulator's EC2 would give). A requirement on a key no instance label describes (the NodePool's
  name, a user's own label) says nothing about the instance and is not checked here.
- The instance: the class's AMI for the type's architecture (`status.amis`), the zone's subnet, the
  class's security groups and instance profile, IMDSv2 only, spot through InstanceMarketOptions, the
  tags Karpenter's AWS provider writes (`utils.GetTags`: the class's `spec.tags`, then
  `kubernetes.io/cluster/<name>: owned`, `karpenter.sh/nodepool`, `eks:eks-cluster-name`,
  `karpenter.k8s.aws/ec2nodeclass`) on the instance, its volumes and network interfaces, and the
  user data of the class's AMI family (userdata.py).
- The NodeClaim afterwards: the instance's labels (type, zone, zone id, capacity type, region, arch,
  os, and the instance-* labels of its type), its providerID, image, capacity and allocatable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api import constants as k
from planner.catalog import Catalog, InstanceType
from sim.controllers.predicates import _int, expression_matches

ZONE_ID_LABEL = "topology.k8s.aws/zone-id"
TENANCY_LABEL = "karpenter.k8s.aws/instance-tenancy"


@dataclass(frozen=True)
class Choice:
    itype: InstanceType
    zone: str
    capacity_type: str
    price: float
    subnet: str
    zone_id: str

    @property
    def key(self) -> str:
        return f"{self.itype.name}/{self.zone}/{self.capacity_type}"


def requirement_holds(requirement: Mapping[str, Any], value: str | None) -> bool:
    """One NodeSelectorRequirement against a label value: the Kubernetes operators as the simulated
    kube-scheduler reads them (sim/controllers/predicates.py), plus Karpenter's own Gte and Lte."""
    values = [str(v) for v in requirement.get("values") or ()]
    operator = requirement.get("operator")
    if operator in ("Gte", "Lte"):
        have, bound = _int(value), _int(values[0] if values else None)
        if have is None or bound is None:
            return False
        return have >= bound if operator == "Gte" else have <= bound
    return expression_matches({**requirement, "values": values}, value)


def instance_labels(choice: Choice, region: str) -> dict[str, str]:
    """The labels Karpenter resolves for the launched instance (single-valued requirements of its type
    and offering)."""
    labels = {
        **choice.itype.labels,
        k.ZONE_LABEL: choice.zone,
        k.REGION_LABEL: region,
        k.CAPACITY_TYPE_LABEL: choice.capacity_type,
        TENANCY_LABEL: "default",
    }
    if choice.zone_id:
        labels[ZONE_ID_LABEL] = choice.zone_id
    return labels


def choices(
    requirements: list[Mapping[str, Any]],
    nodeclass: Mapping[str, Any],
    catalog: Catalog,
    region: str,
    unavailable: set[str],
) -> list[Choice]:
    """Every offering the NodeClaim may be launched on, cheapest first."""
    subnets: dict[str, tuple[str, str]] = {}
    for subnet in (nodeclass.get("status") or {}).get("subnets") or ():
        subnets.setdefault(str(subnet.get("zone")), (str(subnet.get("id")), str(subnet.get("zoneID") or "")))
    found = []
    for itype in catalog.types.values():
        for offering in itype.offerings:
            if not offering.available or offering.zone not in subnets:
                continue
            subnet, zone_id = subnets[offering.zone]
            choice = Choice(itype, offering.zone, offering.capacity_type, offering.price, subnet, zone_id)
            if choice.key in unavailable:
                continue
            labels = instance_labels(choice, region)
            if all(
                requirement_holds(r, labels.get(str(r.get("key"))))
                for r in requirements
                if r.get("key") in labels
            ):
                found.append(choice)
    return sorted(found, key=lambda c: (c.price, c.itype.name, c.zone, c.capacity_type))


def image_for(nodeclass: Mapping[str, Any], itype: InstanceType) -> str | None:
    """The first of the class's resolved AMIs whose requirements the type meets (its architecture)."""
    labels = itype.labels
    for ami in (nodeclass.get("status") or {}).get("amis") or ():
        if all(requirement_holds(r, labels.get(str(r.get("key")))) for r in ami.get("requirements") or ()):
            return str(ami.get("id"))
    return None


def launch_tags(cluster: str, nodepool: str, nodeclass: Mapping[str, Any]) -> dict[str, str]:
    """The class's tags, then Karpenter's own (they win)."""
    return {
        **((nodeclass.get("spec") or {}).get("tags") or {}),
        k.cluster_tag(cluster): k.CLUSTER_TAG_VALUE,
        k.TAG_NODEPOOL: nodepool,
        k.TAG_EKS_CLUSTER_NAME: cluster,
        k.TAG_NODECLASS: str((nodeclass.get("metadata") or {}).get("name", "")),
    }


def run_instances_params(
    choice: Choice, image: str, nodeclass: Mapping[str, Any], tags: Mapping[str, str], user_data: str
) -> dict[str, Any]:
    status = nodeclass.get("status") or {}
    tag_list = [{"Key": key, "Value": value} for key, value in tags.items()]
    params: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": choice.itype.name,
        "MinCount": 1,
        "MaxCount": 1,
        "SubnetId": choice.subnet,
        "UserData": user_data,
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
            "HttpEndpoint": "enabled",
        },
        "TagSpecifications": [
            {"ResourceType": kind, "Tags": tag_list} for kind in ("instance", "volume", "network-interface")
        ],
    }
    groups = [g.get("id") for g in status.get("securityGroups") or () if g.get("id")]
    if groups:
        params["SecurityGroupIds"] = groups
    if status.get("instanceProfile"):
        params["IamInstanceProfile"] = {"Name": status["instanceProfile"]}
    if choice.capacity_type == k.CAPACITY_SPOT:
        params["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return params
