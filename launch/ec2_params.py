"""EC2NodeClass launch fields, written in Karpenter's schema, as RunInstances parameters.

Users write `blockDeviceMappings: [{deviceName, ebs: {volumeSize: 100Gi, ...}, rootVolume}]` and
`metadataOptions: {httpTokens, httpProtocolIPv6, ...}` (api/nodepool.py validates that shape); EC2
wants `BlockDeviceMappings: [{DeviceName, Ebs: {VolumeSize: 100, ...}}]` and `MetadataOptions:
{HttpTokens, HttpProtocolIpv6, ...}`. Pure functions, so every field is tested without AWS.

As Karpenter's AWS provider does (pkg/providers/amifamily, pkg/providers/launchtemplate):
- a class without block devices gets its AMI family's default: one encrypted 20 GiB gp3 root volume
  at /dev/xvda (AL2, AL2023); a 4 GiB OS volume at /dev/xvda and a 20 GiB data volume at /dev/xvdb
  (Bottlerocket); none for Custom, which keeps the AMI's own;
- `volumeSize` is rounded up to whole GiB ("20G" is 18.6 GiB: 19);
- `rootVolume` is not an EC2 parameter: it marks the volume holding the kubelet's root directory
  (Karpenter sizes a node's ephemeral storage by it); at most one mapping may say it;
- metadata options default to IMDSv2 only, one hop, IPv6 endpoint off.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError

from api.nodepool import BlockDevice, BlockDeviceMapping, MetadataOptions
from api.quantity import QuantityError, parse
from launch.instance_labels import ReservedOffering

GIB = 1 << 30
DEFAULT_EBS = BlockDevice(encrypted=True, volume_type="gp3", volume_size="20Gi")
METADATA_DEFAULTS = {
    "HttpEndpoint": "enabled",
    "HttpProtocolIpv6": "disabled",
    "HttpPutResponseHopLimit": 1,
    "HttpTokens": "required",
}


def default_block_device_mappings(family: str | None) -> list[BlockDeviceMapping]:
    """The family's volumes when the EC2NodeClass names none (Custom: the AMI's own)."""
    family = (family or "AL2023").lower()
    if family in ("al2", "al2023"):
        return [BlockDeviceMapping(device_name="/dev/xvda", ebs=DEFAULT_EBS)]
    if family == "bottlerocket":
        return [
            BlockDeviceMapping(
                device_name="/dev/xvda", ebs=DEFAULT_EBS.model_copy(update={"volume_size": "4Gi"})
            ),
            BlockDeviceMapping(device_name="/dev/xvdb", ebs=DEFAULT_EBS),
        ]
    return []


def volume_size_gib(quantity: str) -> int:
    """A `volumeSize` quantity in whole GiB, rounded up (EC2 takes GiB)."""
    try:
        size = parse(quantity)
    except QuantityError as err:
        raise ValueError(f"volumeSize {quantity!r} is not a quantity") from err
    return math.ceil(size / GIB)


def _problems(err: ValidationError) -> str:
    """Pydantic's complaints, each with the field it is about (in the user's camelCase)."""
    out = []
    for error in err.errors():
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        out.append(f"{where}: {message}" if where else message)
    return "; ".join(out)


def parse_mappings(raw: list[dict[str, Any]]) -> list[BlockDeviceMapping]:
    """The EC2NodeClass `blockDeviceMappings` (as written), validated; ValueError names the entry."""
    mappings = []
    for index, entry in enumerate(raw):
        try:
            mappings.append(BlockDeviceMapping.model_validate(entry))
        except ValidationError as err:
            raise ValueError(f"blockDeviceMappings[{index}]: {_problems(err)}") from None
    if sum(1 for m in mappings if m.root_volume) > 1:
        raise ValueError("must have only one blockDeviceMappings with rootVolume")
    return mappings


def ebs(device: BlockDevice) -> dict[str, Any]:
    params: dict[str, Any] = {
        "DeleteOnTermination": device.delete_on_termination,
        "Encrypted": device.encrypted,
        "Iops": device.iops or None,  # 0 means unset, as in Karpenter
        "KmsKeyId": device.kms_key_id,
        "SnapshotId": device.snapshot_id,
        "Throughput": device.throughput or None,
        "VolumeInitializationRate": device.volume_initialization_rate,
        "VolumeSize": volume_size_gib(device.volume_size) if device.volume_size else None,
        "VolumeType": device.volume_type,
    }
    return {key: value for key, value in params.items() if value is not None}


def block_device_mappings(family: str | None, raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """RunInstances `BlockDeviceMappings` for the class's mappings, or its family's defaults."""
    mappings = parse_mappings(raw) or default_block_device_mappings(family)
    out = []
    for index, mapping in enumerate(mappings):
        if not mapping.device_name:
            raise ValueError(f"blockDeviceMappings[{index}] has no deviceName (EC2 needs one)")
        if mapping.ebs is None:
            raise ValueError(f"blockDeviceMappings[{index}] ({mapping.device_name}) has no ebs")
        out.append({"DeviceName": mapping.device_name, "Ebs": ebs(mapping.ebs)})
    return out


def metadata_options(raw: dict[str, Any] | None) -> dict[str, Any]:
    """RunInstances `MetadataOptions`: Karpenter's defaults, overridden by what the class sets."""
    try:
        options = MetadataOptions.model_validate(raw or {})
    except ValidationError as err:
        raise ValueError(f"metadataOptions: {_problems(err)}") from None
    given = {
        "HttpEndpoint": options.http_endpoint,
        "HttpProtocolIpv6": options.http_protocol_ipv6,
        "HttpPutResponseHopLimit": options.http_put_response_hop_limit,
        "HttpTokens": options.http_tokens,
    }
    return {**METADATA_DEFAULTS, **{k: v for k, v in given.items() if v is not None}}


def reservation_params(offering: ReservedOffering) -> dict[str, Any]:
    """RunInstances parameters of a reserved launch, as Karpenter's launch template sets them
    (aws/karpenter-provider-aws pkg/providers/launchtemplate/types.go): the reservation targeted, and
    the market type of a capacity block or an interruptible reservation. RunInstances takes a target
    or a preference, not both, so the target alone (it launches into that reservation only)."""
    if offering.capacity_type != "reserved" or not offering.reservation_id:
        return {}
    params: dict[str, Any] = {
        "CapacityReservationSpecification": {
            "CapacityReservationTarget": {"CapacityReservationId": offering.reservation_id}
        }
    }
    if offering.reservation_type == "capacity-block":
        params["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    elif offering.interruptible:
        params["InstanceMarketOptions"] = {"MarketType": "interruptible-capacity-reservation"}
    return params
