"""EC2 activities: launch a replacement (idempotently), describe and terminate instances (owned only).

Launch uses RunInstances for exactly one offering (instance type, zone, capacity type) per call. The
workflow walks the offerings in price order, so every capacity error is a visible step of the
history and the choice of the next offering is the workflow's, not hidden inside a fleet request.
(CreateFleet `instant` with all offerings as overrides would let EC2 choose, at the price of
hiding that step; moto also never reports fleet errors.)

Idempotency does not rely on EC2 alone: before launching, the activity looks for an instance already
tagged with this command id and replacement index (moto ignores ClientToken; a crash between
RunInstances and the activity completing must not launch twice). The ClientToken still makes a
retried request idempotent on real EC2; it also covers the offering, because EC2 refuses a token
reused with different parameters.

boto3 is synchronous: calls run in a thread pool of their own so the worker's event loop, which
also runs workflows and heartbeats, never blocks on AWS.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio import activity

from activities import errors
from activities.cluster_endpoint import ClusterEndpoint
from activities.errors import classify_ec2, ec2_code, permanent
from activities.instance_profiles import InstanceProfiles
from api.activity_io import InstanceRequest, InstanceState, LaunchedInstance, LaunchRequest, LaunchTemplate
from api.constants import (
    CAPACITY_SPOT,
    CAPACITY_TYPE_LABEL,
    CLUSTER_TAG_VALUE,
    TAG_CAPACITY_TYPE,
    TAG_COMMAND_ID,
    TAG_NODE_NAME,
    TAG_NODECLASS,
    TAG_NODEPOOL,
    TAG_REPLACEMENT_INDEX,
    aws_provider_id,
    cluster_tag,
)
from api.workflow_io import CapacityType, Offering
from kube import events
from kube.events import EventRecorder
from launch import ec2_params
from launch.instance_labels import eni_max_pods, instance_type_labels, offering_labels, reservation_labels
from launch.userdata import ClusterInfo, NodeBootstrap, generate

log = logging.getLogger(__name__)

LIVE_STATES = ("pending", "running", "stopping", "stopped")
GONE_STATES = ("shutting-down", "terminated")
TAG_VALUE_MAX = 256
ARCH = {"x86_64": "amd64", "arm64": "arm64", "i386": "386"}


EKS_CLUSTER_NAME_TAG = "eks:eks-cluster-name"
TAG_KEY_MAX = 128


def client_token(command_id: str, index: int, offering: Offering, attempt: int = 0) -> str:
    """Stable per (command, replacement, offering, attempt); EC2 allows at most 64 ASCII characters.
    A relaunch after a failed launch of the same offering needs its own token: EC2 answers a token it
    has seen with the earlier (terminated) instance. The first attempt keeps the token it always had."""
    seed = f"{command_id}\x00{index}\x00{offering.key}" + (f"\x00{attempt}" if attempt else "")
    return hashlib.sha256(seed.encode()).hexdigest()[:64]


def launch_tags(cluster: str, request: LaunchRequest) -> dict[str, str]:
    """Ownership and provenance (NodePool, command, index). What the kubelet registers with travels in
    the user data, as on a real node (bootstrap_user_data)."""
    template, offering = request.template, request.offering
    tags = {
        **template.instance_tags,
        cluster_tag(cluster): CLUSTER_TAG_VALUE,
        EKS_CLUSTER_NAME_TAG: cluster,
        TAG_NODEPOOL: template.nodepool,
        TAG_NODECLASS: template.nodeclass,
        TAG_COMMAND_ID: request.command_id,
        TAG_REPLACEMENT_INDEX: str(request.index),
        TAG_CAPACITY_TYPE: offering.capacity_type,
        TAG_NODE_NAME: f"karpflow/{template.nodepool}",
    }
    for key, value in tags.items():
        if len(key) > TAG_KEY_MAX or key.lower().startswith("aws:"):
            raise permanent(
                f"replacement {request.index}: EC2 refuses the tag key {key!r} (at most {TAG_KEY_MAX} "
                "characters, and no aws: prefix)",
                errors.INVALID,
            )
        if len(value) > TAG_VALUE_MAX:
            raise permanent(
                f"replacement {request.index}: tag {key} would be {len(value)} characters (EC2 allows "
                f"{TAG_VALUE_MAX})",
                errors.INVALID,
            )
    return tags


def bootstrap_user_data(cluster: ClusterInfo, request: LaunchRequest, max_pods: int | None = None) -> str:
    """The EC2NodeClass user data merged with the bootstrap of its AMI family: the NodePool's labels,
    taints and startup taints, the kubelet settings, and the instance type's max pods unless the
    class sets maxPods (launch/userdata.py)."""
    template = request.template
    node = NodeBootstrap(
        nodepool=template.nodepool,
        labels={**template.labels, CAPACITY_TYPE_LABEL: request.offering.capacity_type},
        taints=[t.kubelet() for t in template.taints],
        startup_taints=[t.kubelet() for t in template.startup_taints],
        kubelet=dict(template.kubelet or {}),
        max_pods=max_pods,
        instance_store_policy=template.instance_store_policy,
    )
    try:
        return generate(template.ami_family, cluster, node, template.user_data)
    except ValueError as err:  # unknown family, user data that is not what its family reads
        raise permanent(
            f"EC2NodeClass {template.nodeclass}: cannot build user data for amiFamily "
            f"{template.ami_family}: {err}",
            errors.INVALID,
        ) from None


def _architecture(info: dict[str, Any] | None) -> str | None:
    archs = (info or {}).get("ProcessorInfo", {}).get("SupportedArchitectures") or []
    return ARCH.get(archs[0]) if archs else None


def _max_pods(info: dict[str, Any] | None) -> int | None:
    """The pods the planner's catalog assumes a node of this type holds (ENI-limited, as EKS AMIs
    compute it): the kubelet is told the same, so the two never disagree."""
    return eni_max_pods(info) if info else None


def pick_image(template: LaunchTemplate, architecture: str | None) -> str:
    for ami in template.amis:
        if not ami.architectures or architecture is None or architecture in ami.architectures:
            return ami.id
    raise permanent(
        f"EC2NodeClass {template.nodeclass} has no AMI for architecture {architecture} "
        f"(status.amis: {', '.join(a.id for a in template.amis)})",
        errors.OFFERING_UNAVAILABLE,
    )


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags") or ()}


class UnavailableOfferings:
    """Offerings that recently failed with insufficient capacity, skipped for a TTL (Karpenter: 3 min).

    Process-wide and best effort: it spares other commands a doomed request. The workflow keeps its own
    durable list, which is what makes a retried or resumed command skip them."""

    def __init__(self, ttl_seconds: float) -> None:
        self.ttl = ttl_seconds
        self._until: dict[str, float] = {}

    def mark(self, offering: Offering) -> None:
        self._until[offering.key] = time.monotonic() + self.ttl

    def is_unavailable(self, offering: Offering) -> bool:
        until = self._until.get(offering.key)
        if until is None:
            return False
        if until <= time.monotonic():
            del self._until[offering.key]
            return False
        return True


class EC2Activities:
    def __init__(
        self,
        ec2: Any,
        cluster_name: str,
        unavailable_ttl_seconds: float = 180.0,
        poll_interval: float = 5.0,
        threads: int = 32,
        *,
        endpoint: ClusterEndpoint | None = None,
        iam: Any = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.ec2 = ec2
        self.events = events  # DisruptionLaunching on the candidates (none without a Kubernetes API)
        self.cluster = cluster_name
        self.endpoint = endpoint or ClusterEndpoint(cluster_name)
        self.profiles = InstanceProfiles(iam, cluster_name)
        self.unavailable = UnavailableOfferings(unavailable_ttl_seconds)
        self.poll_interval = poll_interval
        self._type_infos: dict[str, dict[str, Any] | None] = {}
        self._zone_ids: dict[str, str | None] = {}
        self._region: str | None = getattr(getattr(ec2, "meta", None), "region_name", None)
        # Its own threads: asyncio's default pool has cpu+4 threads, too few for fifty terminations.
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ec2")

    async def _call(self, method: str, **kwargs: Any) -> dict[str, Any]:
        call = functools.partial(getattr(self.ec2, method), **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    # -- launch -----------------------------------------------------------------------------------

    @activity.defn(name="launch_instance")
    async def launch_instance(self, request: LaunchRequest) -> LaunchedInstance:
        offering = request.offering
        what = f"replacement {request.index} ({offering.key})"
        try:
            existing = await self._launched(request.command_id, request.index)
        except Exception as err:
            raise classify_ec2(err, f"looking up {what}") from None
        if existing is not None:
            log.info("%s: adopting instance %s launched by an earlier attempt", what, existing["InstanceId"])
            adopted = self._launched_instance(existing, adopted=True, requested=offering)
            return await self._with_labels(adopted, existing, request)
        if self.unavailable.is_unavailable(offering):
            raise permanent(
                f"{what}: recently failed with insufficient capacity; skipped", errors.OFFERING_UNAVAILABLE
            )
        subnet = request.template.subnets.get(offering.zone)
        if subnet is None:
            raise permanent(
                f"{what}: EC2NodeClass {request.template.nodeclass} has no subnet in zone {offering.zone}",
                errors.OFFERING_UNAVAILABLE,
            )
        template = request.template
        cluster = await self.endpoint.get()
        profile = template.instance_profile
        if not profile and template.role:
            profile = await self.profiles.for_role(template.role)
        try:
            info = await self._type_info(offering.instance_type)
        except Exception as err:
            raise classify_ec2(err, f"describing instance type {offering.instance_type}") from None
        image = pick_image(template, _architecture(info))
        try:
            user_data = bootstrap_user_data(cluster, request, _max_pods(info))
            params = self._run_params(request, subnet, image, user_data, profile)
        except ValueError as err:  # an EC2NodeClass launch field EC2 would refuse
            raise permanent(f"EC2NodeClass {template.nodeclass}: {err}", errors.INVALID) from None
        try:
            response = await self._call("run_instances", **params)
        except errors.ApplicationError:
            raise
        except Exception as err:
            failure = classify_ec2(err, f"launching {what}")
            if failure.type == errors.INSUFFICIENT_CAPACITY:
                self.unavailable.mark(offering)
                log.warning(
                    "%s: %s (%s); offering skipped for %ss",
                    what,
                    failure.message,
                    ec2_code(err),
                    self.unavailable.ttl,
                )
            raise failure from None
        instance = response["Instances"][0]
        log.info("%s: launched instance %s", what, instance["InstanceId"])
        await self._launching(request, instance["InstanceId"])
        launched = self._launched_instance(instance, adopted=False, requested=offering)
        return await self._with_labels(launched, instance, request)

    async def _launching(self, request: LaunchRequest, instance_id: str) -> None:
        """Karpenter's DisruptionLaunching on each node the launch replaces."""
        if self.events is None or not request.candidates:
            return
        offering = request.offering
        launched = f"{instance_id} ({offering.instance_type} {offering.capacity_type} in {offering.zone})"
        reason = request.reason or "disruption"
        await events.record_all(
            self.events,
            [events.disruption_launching(ref, reason, launched) for ref in events.refs(request.candidates)],
        )

    async def _with_labels(
        self, launched: LaunchedInstance, instance: dict[str, Any], request: LaunchRequest
    ) -> LaunchedInstance:
        """The instance labels Karpenter's NodeClaim would carry, for registration to write."""
        offering = launched.offering
        try:
            info = await self._type_info(offering.instance_type)
            zone_id = request.template.zone_ids.get(offering.zone) or await self._zone_id(
                instance.get("SubnetId")
            )
        except Exception as err:
            raise classify_ec2(err, f"describing instance {launched.instance_id}") from None
        labels = instance_type_labels(info) if info else {}
        labels |= offering_labels(offering.zone, zone_id, offering.capacity_type, self._region)
        labels |= reservation_labels(offering)
        return launched.model_copy(update={"labels": labels})

    async def _zone_id(self, subnet_id: str | None) -> str | None:
        """The subnet's availability zone id (e.g. usw2-az1), asked once per subnet."""
        if not subnet_id:
            return None
        if subnet_id not in self._zone_ids:
            subnets = (await self._call("describe_subnets", SubnetIds=[subnet_id])).get("Subnets") or []
            self._zone_ids[subnet_id] = subnets[0].get("AvailabilityZoneId") if subnets else None
        return self._zone_ids[subnet_id]

    def _run_params(
        self, request: LaunchRequest, subnet: str, image: str, user_data: str, profile: str | None
    ) -> dict[str, Any]:
        template, offering = request.template, request.offering
        tags = launch_tags(self.cluster, request)
        params: dict[str, Any] = {
            "ImageId": image,
            "InstanceType": offering.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "SubnetId": subnet,
            "ClientToken": client_token(request.command_id, request.index, offering, request.attempt),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]},
                *(
                    {
                        "ResourceType": kind,
                        "Tags": [
                            {"Key": cluster_tag(self.cluster), "Value": CLUSTER_TAG_VALUE},
                            {"Key": EKS_CLUSTER_NAME_TAG, "Value": self.cluster},
                            {"Key": TAG_NODEPOOL, "Value": template.nodepool},
                        ],
                    }
                    for kind in ("volume", "network-interface")
                ),
            ],
        }
        if template.associate_public_ip_address is not None or template.ip_prefix_count is not None:
            # Only a network interface can say these; the subnet and groups then move onto it.
            del params["SubnetId"]
            interface: dict[str, Any] = {
                "DeviceIndex": 0,
                "SubnetId": subnet,
                "Groups": template.security_group_ids,
            }
            if template.associate_public_ip_address is not None:
                interface["AssociatePublicIpAddress"] = template.associate_public_ip_address
            if template.ip_prefix_count is not None:
                interface["Ipv4PrefixCount"] = template.ip_prefix_count
            params["NetworkInterfaces"] = [interface]
        elif template.security_group_ids:
            params["SecurityGroupIds"] = template.security_group_ids
        if profile:
            params["IamInstanceProfile"] = {"Name": profile}
        if user_data:
            params["UserData"] = user_data  # boto3 base64-encodes it
        params["Monitoring"] = {"Enabled": bool(template.detailed_monitoring)}
        # The class's volumes in EC2's shape, or its AMI family's default root volume.
        mappings = ec2_params.block_device_mappings(template.ami_family, template.block_device_mappings)
        if mappings:
            params["BlockDeviceMappings"] = mappings
        # Karpenter's EC2NodeClass defaults: IMDSv2 only, one hop (pods cannot reach the node's role).
        params["MetadataOptions"] = ec2_params.metadata_options(template.metadata_options)
        enclave = template.enclave_options or {}
        if enclave.get("enabled") is not None:
            params["EnclaveOptions"] = {"Enabled": bool(enclave["enabled"])}
        params |= ec2_params.reservation_params(offering)
        if offering.capacity_type == CAPACITY_SPOT:
            # Tagged at launch like the instance, so a tag-conditioned IAM policy lets the request
            # be created (deploy/iam-policy.json) and the request is traceable to its cluster.
            params["TagSpecifications"].append(
                {
                    "ResourceType": "spot-instances-request",
                    "Tags": [
                        {"Key": cluster_tag(self.cluster), "Value": CLUSTER_TAG_VALUE},
                        {"Key": TAG_NODEPOOL, "Value": template.nodepool},
                    ],
                }
            )
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        return params

    async def _type_info(self, instance_type: str) -> dict[str, Any] | None:
        """The DescribeInstanceTypes entry of a type (None: EC2 does not know it), asked once."""
        if instance_type not in self._type_infos:
            response = await self._call("describe_instance_types", InstanceTypes=[instance_type])
            found = response.get("InstanceTypes") or []
            self._type_infos[instance_type] = found[0] if found else None
        return self._type_infos[instance_type]

    async def _command_instances(self, command_id: str, index: int | None = None) -> list[dict[str, Any]]:
        """This cluster's live instances launched by the command (for one replacement, with `index`)."""
        filters = [{"Name": f"tag:{TAG_COMMAND_ID}", "Values": [command_id]}]
        if index is not None:
            filters.append({"Name": f"tag:{TAG_REPLACEMENT_INDEX}", "Values": [str(index)]})
        filters += [
            {"Name": f"tag:{cluster_tag(self.cluster)}", "Values": [CLUSTER_TAG_VALUE]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        response = await self._call("describe_instances", Filters=filters)
        return [i for r in response.get("Reservations") or () for i in r.get("Instances") or ()]

    async def _launched(self, command_id: str, index: int) -> dict[str, Any] | None:
        instances = await self._command_instances(command_id, index)
        return min(instances, key=lambda i: i["InstanceId"]) if instances else None

    def _launched_instance(
        self, instance: dict[str, Any], adopted: bool, requested: Offering | None = None
    ) -> LaunchedInstance:
        zone = (instance.get("Placement") or {}).get("AvailabilityZone", "")
        capacity: CapacityType = (
            CAPACITY_SPOT if instance.get("InstanceLifecycle") == CAPACITY_SPOT else "on-demand"
        )
        if _tags(instance).get(TAG_CAPACITY_TYPE) == CAPACITY_SPOT:
            capacity = CAPACITY_SPOT
        index = _tags(instance).get(TAG_REPLACEMENT_INDEX, "")
        offering = Offering(instance_type=instance["InstanceType"], zone=zone, capacity_type=capacity)
        # Reserved when EC2 put it in the reservation the launch targeted (DescribeInstances'
        # CapacityReservationId), with the type and flag the plan named. An on-demand launch EC2 placed
        # in an open reservation stays on-demand, as it was planned and priced.
        reservation_id = instance.get("CapacityReservationId")
        if reservation_id and requested is not None and requested.reservation_id == reservation_id:
            offering = Offering(
                instance_type=instance["InstanceType"],
                zone=zone,
                capacity_type="reserved",
                reservation_id=reservation_id,
                reservation_type=requested.reservation_type,
                interruptible=requested.interruptible,
            )
        return LaunchedInstance(
            instance_id=instance["InstanceId"],
            index=int(index) if index.isdigit() else None,
            provider_id=aws_provider_id(zone, instance["InstanceId"]),
            private_dns_name=instance.get("PrivateDnsName") or "",
            offering=offering,
            adopted=adopted,
        )

    @activity.defn(name="find_command_instances")
    async def find_command_instances(self, command_id: str) -> list[LaunchedInstance]:
        """Every live instance this command launched (compensation must not miss one a cancelled launch
        created after the workflow stopped waiting for it)."""
        try:
            instances = await self._command_instances(command_id)
        except Exception as err:
            raise classify_ec2(err, f"listing the instances of command {command_id}") from None
        return [self._launched_instance(i, adopted=True) for i in instances]

    async def command_launches(self, page_size: int = 500) -> list[dict[str, Any]]:
        """Every instance of this cluster tagged with a command id, live or ending (shutting-down,
        terminated while EC2 still lists it), every page: what the garbage collector judges
        (activities/garbage_rules.py checks the ownership tags again)."""
        filters = [
            {"Name": f"tag:{cluster_tag(self.cluster)}", "Values": [CLUSTER_TAG_VALUE]},
            {"Name": "tag-key", "Values": [TAG_COMMAND_ID]},
            {"Name": "instance-state-name", "Values": [*LIVE_STATES, *GONE_STATES]},
        ]

        def every_page() -> list[dict[str, Any]]:
            pages = self.ec2.get_paginator("describe_instances").paginate(
                Filters=filters, PaginationConfig={"PageSize": page_size}
            )
            return [
                i for page in pages for r in page.get("Reservations") or () for i in r.get("Instances") or ()
            ]

        return await asyncio.get_running_loop().run_in_executor(self._threads, every_page)

    # -- describe / terminate ---------------------------------------------------------------------

    async def _describe(self, instance_id: str) -> dict[str, Any] | None:
        try:
            response = await self._call("describe_instances", InstanceIds=[instance_id])
        except Exception as err:
            if ec2_code(err) == "InvalidInstanceID.NotFound":
                return None
            raise
        instances = [i for r in response.get("Reservations") or () for i in r.get("Instances") or ()]
        return instances[0] if instances else None

    def _state(self, instance_id: str, instance: dict[str, Any] | None) -> InstanceState:
        """Owned: tagged at launch `kubernetes.io/cluster/<cluster>: owned` AND `karpenter.sh/nodepool`
        (as Karpenter and karpflow launch). The cluster tag alone is what an EKS managed node group's
        instances carry too, so it does not make an instance ours."""
        if instance is None:
            return InstanceState(instance_id=instance_id, found=False)
        tags = _tags(instance)
        cluster_owned = tags.get(cluster_tag(self.cluster)) == CLUSTER_TAG_VALUE
        nodepool = tags.get(TAG_NODEPOOL) or None
        return InstanceState(
            instance_id=instance_id,
            found=True,
            state=instance["State"]["Name"],
            owned=cluster_owned and nodepool is not None,
            cluster_owned=cluster_owned,
            nodepool=nodepool,
        )

    async def ownership(self, instance_id: str) -> InstanceState:
        """The instance's state and ownership tags, for the managed-node guard of the Kubernetes
        activities (a terminated instance counts as not found)."""
        try:
            state = self._state(instance_id, await self._describe(instance_id))
        except Exception as err:
            raise classify_ec2(err, f"describing instance {instance_id}") from None
        if state.found and state.state == "terminated":
            return state.model_copy(update={"found": False})
        return state

    @activity.defn(name="describe_instance")
    async def describe_instance(self, request: InstanceRequest) -> InstanceState:
        try:
            return self._state(request.instance_id, await self._describe(request.instance_id))
        except Exception as err:
            raise classify_ec2(err, f"describing instance {request.instance_id}") from None

    @activity.defn(name="terminate_instance")
    async def terminate_instance(self, request: InstanceRequest) -> InstanceState:
        """Terminate and wait until EC2 says terminated (or forgets the instance). Refuses, without retry,
        an instance this cluster does not own (`_state`: its cluster tag and a NodePool tag): the check
        is in code, not only IAM."""
        what = f"instance {request.instance_id}" + (f" of node {request.node}" if request.node else "")
        while True:
            try:
                state = self._state(request.instance_id, await self._describe(request.instance_id))
            except Exception as err:
                raise classify_ec2(err, f"describing {what}") from None
            if not state.found or state.state == "terminated":
                return state
            if not state.owned:
                why = (
                    f"its tag {cluster_tag(self.cluster)} is not '{CLUSTER_TAG_VALUE}'"
                    if not state.cluster_owned
                    else f"it has no {TAG_NODEPOOL} tag (not launched for a NodePool)"
                )
                raise permanent(
                    f"refusing to terminate {what}: {why}, so cluster {self.cluster} does not own it",
                    errors.NOT_OWNED,
                )
            if state.state != "shutting-down":
                try:
                    response = await self._call("terminate_instances", InstanceIds=[request.instance_id])
                except Exception as err:
                    if ec2_code(err) == "InvalidInstanceID.NotFound":
                        return InstanceState(instance_id=request.instance_id, found=False)
                    raise classify_ec2(err, f"terminating {what}") from None
                log.info("terminating %s", what)
                changes = response.get("TerminatingInstances") or [{}]
                if (changes[0].get("CurrentState") or {}).get("Name") == "terminated":
                    return state.model_copy(update={"state": "terminated"})
            if activity.in_activity():
                activity.heartbeat({"instance": request.instance_id, "state": state.state})
            await asyncio.sleep(self.poll_interval)
