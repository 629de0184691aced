"""The simulator's moto refuses the launches EC2 refuses (sim/ec2_validation.py): a wrong block
device or metadata option fails on the local stack as it would in AWS, instead of launching."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from sim import ec2_validation


@pytest.fixture
def ec2() -> Iterator[Any]:
    ec2_validation.install()
    with mock_aws():
        yield boto3.client("ec2", region_name="us-west-2")


def run(ec2: Any, **params: Any) -> dict[str, Any]:
    return ec2.run_instances(
        ImageId="ami-12345678", MinCount=1, MaxCount=1, InstanceType="m5.large", **params
    )


def device(**ebs: Any) -> list[dict[str, Any]]:
    return [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 100, "VolumeType": "gp3", **ebs}}]


def test_a_launch_ec2_takes_is_taken(ec2):
    mappings = [
        *device(Iops=4000, Throughput=250),
        {"DeviceName": "/dev/xvdb", "Ebs": {"VolumeSize": 500, "VolumeType": "st1", "Encrypted": True}},
    ]
    options = {"HttpTokens": "required", "HttpPutResponseHopLimit": 2}
    assert run(ec2, BlockDeviceMappings=mappings, MetadataOptions=options)["Instances"]


@pytest.mark.parametrize(
    ("mappings", "code"),
    [
        (device(VolumeType="gp9"), "InvalidParameterValue"),
        (device(VolumeType="gp2", Iops=3000), "InvalidParameterCombination"),
        (device(VolumeType="io2"), "MissingParameter"),
        (device(VolumeType="gp2", Throughput=250), "InvalidParameterCombination"),
        (device(Throughput=5000), "InvalidParameterValue"),
        (device(VolumeSize=100000), "InvalidParameterValue"),
        (
            [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 10, "VolumeType": "st1"}}],
            "InvalidParameterValue",
        ),
        (device(KmsKeyId="alias/k"), "InvalidParameterDependency"),
        (device(VolumeInitializationRate=200), "InvalidParameterCombination"),
        ([*device(), *device()], "InvalidBlockDeviceMapping"),
        ([{"Ebs": {"VolumeSize": 20}}], "MissingParameter"),
    ],
)
def test_a_block_device_ec2_refuses_is_refused(ec2, mappings, code):
    with pytest.raises(ClientError) as refused:
        run(ec2, BlockDeviceMappings=mappings)
    assert refused.value.response["Error"]["Code"] == code


@pytest.mark.parametrize(
    "tags", [[{"Key": "aws:cloudformation:stack", "Value": "x"}], [{"Key": "team", "Value": "v" * 257}]]
)
def test_tags_ec2_refuses_are_refused(ec2, tags):
    with pytest.raises(ClientError) as refused:
        run(ec2, TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"


@pytest.mark.parametrize("options", [{"HttpPutResponseHopLimit": 65}, {"HttpTokens": "sometimes"}])
def test_metadata_options_ec2_refuses_are_refused(ec2, options):
    with pytest.raises(ClientError) as refused:
        run(ec2, MetadataOptions=options)
    assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"
