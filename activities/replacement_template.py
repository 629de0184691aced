"""`resolve_replacement`: a replacement's NodePool and EC2NodeClass read once and written down as the
LaunchTemplate the launch needs (subnets, AMIs, labels, drift hashes, taints and startup taints).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities import errors
from activities.errors import classify_kube, not_found, permanent
from activities.kubernetes_base import KubernetesBase
from api.activity_io import AmiChoice, LaunchTemplate, ResolveRequest
from api.constants import (
    ARCH_LABEL,
    AWS_GROUP,
    AWS_VERSION,
    EC2NODECLASS_LABEL,
    KARPENTER_GROUP,
    KARPENTER_VERSION,
    NODEPOOL_LABEL,
)
from api.hashes import nodeclass_hash_annotations, nodepool_hash_annotations
from api.nodepool import EC2NodeClass, NodePool
from api.workflow_io import TaintSpec
from kube.client import Json


def _merge_taints(*groups: list[Any]) -> list[TaintSpec]:
    merged: dict[tuple[str, str], TaintSpec] = {}
    for group in groups:
        for taint in group:
            spec = (
                taint
                if isinstance(taint, TaintSpec)
                else TaintSpec(key=taint.key, value=taint.value, effect=taint.effect)
            )
            merged[(spec.key, spec.effect)] = spec
    return list(merged.values())


class ReplacementTemplates(KubernetesBase):
    """What a replacement is launched from: its NodePool and EC2NodeClass, read once."""

    async def _custom(self, group: str, version: str, plural: str, name: str, kind: str) -> Json:
        try:
            return await self.kube.get_cluster_custom(group, version, plural, name)
        except Exception as err:
            if not_found(err):
                raise permanent(f"{kind} {name} not found", errors.INVALID) from None
            raise classify_kube(err, f"reading {kind} {name}") from None

    async def _nodepool(self, name: str) -> NodePool:
        """The NodePool as the planner reads it: an invalid duration reads as the value that disrupts
        nothing (logged), so a forceful command's replacements still launch in such a pool."""
        raw = await self._custom(KARPENTER_GROUP, KARPENTER_VERSION, "nodepools", name, "NodePool")
        return self._read_nodepool(name, raw)

    @activity.defn(name="resolve_replacement")
    async def resolve_replacement(self, request: ResolveRequest) -> LaunchTemplate:
        """Read the NodePool and EC2NodeClass once and write down everything the launch needs."""
        spec = request.spec
        pool = await self._nodepool(spec.nodepool)
        template = pool.spec.template
        ref = template.spec.node_class_ref
        nodeclass_name = spec.nodeclass or (ref.name if ref else None)
        if not nodeclass_name:
            raise permanent(
                f"replacement {request.index}: NodePool {pool.name} has no nodeClassRef "
                "and no nodeclass was given",
                errors.INVALID,
            )
        raw = await self._custom(AWS_GROUP, AWS_VERSION, "ec2nodeclasses", nodeclass_name, "EC2NodeClass")
        try:
            nodeclass = EC2NodeClass.model_validate(raw)
        except ValueError as err:
            raise permanent(
                f"EC2NodeClass {nodeclass_name} does not validate: {err}", errors.INVALID
            ) from None
        status = nodeclass.status
        subnets: dict[str, str] = {}
        zone_ids: dict[str, str] = {}
        for subnet in status.subnets:
            subnets.setdefault(subnet.zone, subnet.id)
            if subnet.zone_id:
                zone_ids.setdefault(subnet.zone, subnet.zone_id)
        if not subnets:
            raise permanent(f"EC2NodeClass {nodeclass_name} has no subnets in status.subnets", errors.INVALID)
        amis = [
            AmiChoice(
                id=ami.id,
                architectures=[
                    v
                    for r in ami.requirements
                    if r.key == ARCH_LABEL and r.operator == "In"
                    for v in r.values
                ],
            )
            for ami in status.amis
        ]
        if not amis and not spec.image_id:
            raise permanent(f"EC2NodeClass {nodeclass_name} has no AMIs in status.amis", errors.INVALID)
        if spec.image_id:
            amis = [AmiChoice(id=spec.image_id)]
        labels = {
            **template.metadata.labels,
            **spec.labels,
            NODEPOOL_LABEL: pool.name,
            EC2NODECLASS_LABEL: nodeclass_name,
        }
        # The drift hashes of the templates the node is built from: drift detection sees it as current.
        annotations = {
            **template.metadata.annotations,
            **spec.annotations,
            **nodepool_hash_annotations(pool),
            **nodeclass_hash_annotations(nodeclass),
        }
        return LaunchTemplate(
            nodepool=pool.name,
            nodeclass=nodeclass_name,
            subnets=subnets,
            security_group_ids=[group.id for group in status.security_groups],
            amis=amis,
            instance_profile=status.instance_profile or nodeclass.spec.instance_profile,
            role=nodeclass.spec.role,
            ami_family=nodeclass.spec.family,
            user_data=nodeclass.spec.user_data,
            kubelet=nodeclass.spec.kubelet,
            associate_public_ip_address=nodeclass.spec.associate_public_ip_address,
            detailed_monitoring=nodeclass.spec.detailed_monitoring,
            # In the EC2NodeClass's own shape: the history shows what the user wrote, and the launch
            # activity translates it for EC2 (launch/ec2_params.py).
            block_device_mappings=[m.to_wire() for m in nodeclass.spec.block_device_mappings],
            metadata_options=nodeclass.spec.metadata_options.to_wire()
            if nodeclass.spec.metadata_options
            else None,
            instance_store_policy=nodeclass.spec.instance_store_policy,
            ip_prefix_count=nodeclass.spec.ip_prefix_count,
            enclave_options=nodeclass.spec.enclave_options.to_wire()
            if nodeclass.spec.enclave_options
            else None,
            zone_ids=zone_ids,
            instance_tags=dict(nodeclass.spec.tags),
            labels=labels,
            annotations=annotations,
            taints=_merge_taints(template.spec.taints, spec.taints),
            startup_taints=_merge_taints(template.spec.startup_taints, spec.startup_taints),
            via_nodeclaim=self.coexistence,
        )
