"""EC2's parameter checks on RunInstances that moto leaves out, so a launch EC2 would refuse is
refused on the local stack too.

moto checks that a block device has a size or a snapshot, and little else: it takes any volume
type, IOPS on a gp2 volume, throughput on an io2 one, a KMS key on an unencrypted volume, the same
device twice, a hop limit of 99, an `aws:` tag or a 300-character tag value. EC2 refuses all of
these with a 400; so does the simulator, from EC2's documented limits (EbsBlockDevice,
InstanceMetadataOptionsRequest and the tag restrictions in the EC2 API reference). The upper bounds
are the widest EC2 has published, so nothing EC2 takes is refused.

Installed once per process by the simulator's moto (sim/stack.py) by wrapping moto's own parser of
`BlockDeviceMappings`, which only RunInstances calls; sim/ec2_faults.py wraps other handlers, so the
two never undo each other.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

VOLUME_TYPES = ("standard", "io1", "io2", "gp2", "sc1", "st1", "gp3")
SIZE_GIB = {
    "standard": (1, 1024),
    "gp2": (1, 16384),
    "gp3": (1, 65536),
    "io1": (4, 16384),
    "io2": (4, 65536),
    "st1": (125, 16384),
    "sc1": (125, 16384),
}
IOPS = {"gp3": (3000, 80000), "io1": (100, 64000), "io2": (100, 256000)}
THROUGHPUT_GP3 = (125, 2000)  # MiB/s, gp3 only
INITIALIZATION_RATE = (100, 300)  # MiB/s, from a snapshot only
HOP_LIMIT = (1, 64)
TAG_KEY_MAX, TAG_VALUE_MAX, TAGS_PER_RESOURCE = 128, 256, 50
METADATA_CHOICES = {
    "HttpTokens": ("required", "optional"),
    "HttpEndpoint": ("enabled", "disabled"),
    "HttpProtocolIpv6": ("enabled", "disabled"),
}

_installed = False
_lock = threading.Lock()


class Refused(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise Refused("InvalidParameterValue", f"Value ({value}) for parameter {name} is invalid.") from None


def _within(value: int, bounds: tuple[int, int], name: str, what: str) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise Refused(
            "InvalidParameterValue", f"{name} {value} is out of range for {what}: it must be {low} to {high}."
        )


def check_ebs(device: str, ebs: Mapping[str, Any]) -> None:
    volume_type = ebs.get("VolumeType") or "gp2"  # EC2's default when none is named
    if volume_type not in VOLUME_TYPES:
        raise Refused("InvalidParameterValue", f"Value ({volume_type}) for parameter volumeType is invalid.")
    if ebs.get("VolumeSize") is not None:
        _within(
            _int(ebs["VolumeSize"], "size"), SIZE_GIB[volume_type], "Volume size", f"{volume_type} ({device})"
        )
    iops = ebs.get("Iops")
    if iops is not None:
        if volume_type not in IOPS:
            raise Refused(
                "InvalidParameterCombination",
                f"The parameter iops is not supported for {volume_type} volumes.",
            )
        _within(_int(iops, "iops"), IOPS[volume_type], "IOPS", f"{volume_type} ({device})")
    elif volume_type in ("io1", "io2"):
        raise Refused(
            "MissingParameter", f"The request must contain the parameter iops for {volume_type} volumes."
        )
    throughput = ebs.get("Throughput")
    if throughput is not None:
        if volume_type != "gp3":
            raise Refused(
                "InvalidParameterCombination",
                f"The parameter throughput is not supported for {volume_type} volumes.",
            )
        _within(_int(throughput, "throughput"), THROUGHPUT_GP3, "Throughput", f"gp3 ({device})")
    if ebs.get("KmsKeyId") and str(ebs.get("Encrypted")).lower() != "true":
        raise Refused(
            "InvalidParameterDependency", "The parameter KmsKeyId requires the parameter Encrypted to be set."
        )
    rate = ebs.get("VolumeInitializationRate")
    if rate is not None:
        if not ebs.get("SnapshotId"):
            raise Refused(
                "InvalidParameterCombination",
                "VolumeInitializationRate is only supported for volumes created from a snapshot.",
            )
        _within(_int(rate, "VolumeInitializationRate"), INITIALIZATION_RATE, "Initialization rate", device)


def check_block_device_mappings(mappings: list[Mapping[str, Any]]) -> None:
    seen: set[str] = set()
    for mapping in mappings:
        device = mapping.get("DeviceName")
        if not device:
            raise Refused("MissingParameter", "The request must contain the parameter deviceName")
        if device in seen:
            raise Refused(
                "InvalidBlockDeviceMapping",
                f"The device '{device}' is used in more than one block-device mapping",
            )
        seen.add(device)
        if mapping.get("Ebs"):
            check_ebs(device, mapping["Ebs"])


def check_metadata_options(options: Mapping[str, Any]) -> None:
    for name, choices in METADATA_CHOICES.items():
        value = options.get(name)
        if value is not None and value not in choices:
            raise Refused("InvalidParameterValue", f"Value ({value}) for parameter {name} is invalid.")
    if options.get("HttpPutResponseHopLimit") is not None:
        limit = _int(options["HttpPutResponseHopLimit"], "HttpPutResponseHopLimit")
        _within(limit, HOP_LIMIT, "HttpPutResponseHopLimit", "the instance metadata service")


def check_tag_specifications(specifications: list[Mapping[str, Any]]) -> None:
    for specification in specifications:
        tags = specification.get("Tags") or []
        if len(tags) > TAGS_PER_RESOURCE:
            raise Refused(
                "TagLimitExceeded", f"The maximum number of tags per resource is {TAGS_PER_RESOURCE}."
            )
        for tag in tags:
            key, value = str(tag.get("Key") or ""), str(tag.get("Value") or "")
            if key.lower().startswith("aws:"):
                raise Refused("InvalidParameterValue", f"Tag keys starting with 'aws:' are reserved: {key}")
            if not key or len(key) > TAG_KEY_MAX or len(value) > TAG_VALUE_MAX:
                raise Refused(
                    "InvalidParameterValue",
                    f"Tag {key!r}: keys take 1 to {TAG_KEY_MAX} characters, values at most {TAG_VALUE_MAX}.",
                )


def install() -> None:
    """Wrap moto's RunInstances parameter parsing with EC2's checks (once per process)."""
    global _installed
    with _lock:
        if _installed:
            return
        from moto.ec2.exceptions import EC2ClientError
        from moto.ec2.responses.instances import InstanceResponse

        original = InstanceResponse._parse_block_device_mapping

        def checked(self: Any) -> list[dict[str, Any]]:
            try:
                check_block_device_mappings(self._get_param("BlockDeviceMappings", []))
                check_metadata_options(self._get_param("MetadataOptions", {}) or {})
                check_tag_specifications(self._get_param("TagSpecifications", []) or [])
            except Refused as err:
                raise EC2ClientError(err.code, str(err)) from None
            return original(self)

        InstanceResponse._parse_block_device_mapping = checked
        _installed = True
