"""EC2NodeClass launch fields, written as Karpenter documents them (karpenter.k8s.aws/v1
EC2NodeClass: pkg/apis/v1/ec2nodeclass.go and the EC2NodeClass page of karpenter.sh), and the
RunInstances parameters EC2 takes for them (launch/ec2_params.py). One test per field."""

from __future__ import annotations

import pytest

from launch.ec2_params import block_device_mappings, metadata_options, volume_size_gib


def ebs_of(mapping: dict) -> dict:
    return block_device_mappings("AL2023", [mapping])[0]["Ebs"]


def one(**ebs) -> dict:
    return {"deviceName": "/dev/xvda", "ebs": {"volumeSize": "20Gi", **ebs}}


def test_device_name_and_ebs_become_ec2s_device_name_and_ebs():
    assert block_device_mappings("AL2023", [one()]) == [
        {"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 20}}
    ]


@pytest.mark.parametrize(
    ("quantity", "gib"), [("100Gi", 100), ("20G", 19), ("1Ti", 1024), ("1T", 932), ("59000Gi", 59000)]
)
def test_volume_size_is_a_quantity_rounded_up_to_whole_gib(quantity, gib):
    assert volume_size_gib(quantity) == gib
    assert ebs_of(one(volumeSize=quantity))["VolumeSize"] == gib


@pytest.mark.parametrize("bad", ["100", 100, "0Gi", "59001Gi", "100Mi", "1.5Gi", "59Ti"])
def test_a_volume_size_karpenters_schema_refuses_is_refused(bad):
    with pytest.raises(ValueError, match=r"blockDeviceMappings\[0\]: ebs.volumeSize"):
        block_device_mappings("AL2023", [one(volumeSize=bad)])


def test_volume_type():
    assert ebs_of(one(volumeType="gp3"))["VolumeType"] == "gp3"
    with pytest.raises(ValueError, match="volumeType"):
        block_device_mappings("AL2023", [one(volumeType="gp9")])


def test_iops_and_throughput():
    given = ebs_of(one(volumeType="gp3", iops=6000, throughput=250))
    assert (given["Iops"], given["Throughput"]) == (6000, 250)
    assert "Iops" not in ebs_of(one(iops=0))  # zero is unset, as in Karpenter


def test_encrypted_and_kms_key_id_with_karpenters_capital_id():
    given = ebs_of(one(encrypted=True, kmsKeyID="arn:aws:kms:us-west-2:111122223333:key/abc"))
    assert given["Encrypted"] is True
    assert given["KmsKeyId"] == "arn:aws:kms:us-west-2:111122223333:key/abc"


def test_delete_on_termination():
    assert ebs_of(one(deleteOnTermination=False))["DeleteOnTermination"] is False
    assert "DeleteOnTermination" not in ebs_of(one())  # unset: EC2's default (true for new volumes)


def test_snapshot_id_needs_no_size_but_one_of_them_is_needed():
    assert ebs_of({"deviceName": "/dev/xvdb", "ebs": {"snapshotID": "snap-0123"}}) == {
        "SnapshotId": "snap-0123"
    }
    with pytest.raises(ValueError, match="snapshotID or volumeSize must be defined"):
        block_device_mappings("AL2023", [{"deviceName": "/dev/xvdb", "ebs": {"volumeType": "gp3"}}])


def test_volume_initialization_rate_needs_a_snapshot_and_stays_in_range():
    given = ebs_of(
        {"deviceName": "/dev/xvdb", "ebs": {"snapshotID": "snap-1", "volumeInitializationRate": 200}}
    )
    assert given["VolumeInitializationRate"] == 200
    with pytest.raises(ValueError, match="snapshotID must be set when volumeInitializationRate is set"):
        block_device_mappings("AL2023", [one(volumeInitializationRate=200)])
    with pytest.raises(ValueError, match="volumeInitializationRate"):
        block_device_mappings(
            "AL2023",
            [{"deviceName": "/dev/xvdb", "ebs": {"snapshotID": "s", "volumeInitializationRate": 99}}],
        )


def test_root_volume_is_not_an_ec2_parameter_and_only_one_mapping_may_say_it():
    mappings = [one(), {"deviceName": "/dev/xvdb", "ebs": {"volumeSize": "200Gi"}, "rootVolume": True}]
    assert all(set(m) == {"DeviceName", "Ebs"} for m in block_device_mappings("AL2023", mappings))
    with pytest.raises(ValueError, match="only one blockDeviceMappings with rootVolume"):
        block_device_mappings("AL2023", [{**m, "rootVolume": True} for m in mappings])


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("AL2023", [("/dev/xvda", 20)]),
        ("AL2", [("/dev/xvda", 20)]),
        ("Bottlerocket", [("/dev/xvda", 4), ("/dev/xvdb", 20)]),
        ("Custom", []),  # the AMI's own volumes
    ],
)
def test_without_mappings_the_ami_familys_default_volumes_are_used(family, expected):
    mappings = block_device_mappings(family, [])
    assert [(m["DeviceName"], m["Ebs"]["VolumeSize"]) for m in mappings] == expected
    assert all(m["Ebs"]["VolumeType"] == "gp3" and m["Ebs"]["Encrypted"] for m in mappings)


def test_a_mapping_ec2_could_not_take_is_refused_before_ec2_is_asked():
    with pytest.raises(ValueError, match="no deviceName"):
        block_device_mappings("AL2023", [{"ebs": {"volumeSize": "20Gi"}}])
    with pytest.raises(ValueError, match="has no ebs"):
        block_device_mappings("AL2023", [{"deviceName": "/dev/xvda"}])
    # EC2's own spelling is not the EC2NodeClass's: it names no device Karpenter would read.
    with pytest.raises(ValueError, match="no deviceName"):
        block_device_mappings("AL2023", [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 80}}])


def test_metadata_options_default_as_karpenter():
    assert metadata_options(None) == {
        "HttpEndpoint": "enabled",
        "HttpProtocolIpv6": "disabled",
        "HttpPutResponseHopLimit": 1,
        "HttpTokens": "required",
    }


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("httpEndpoint", "disabled", "HttpEndpoint"),
        ("httpProtocolIPv6", "enabled", "HttpProtocolIpv6"),
        ("httpPutResponseHopLimit", 2, "HttpPutResponseHopLimit"),
        ("httpTokens", "optional", "HttpTokens"),
    ],
)
def test_each_metadata_option_in_karpenters_spelling(field, value, param):
    given = metadata_options({field: value})
    assert given[param] == value
    assert len(given) == 4  # the others keep their defaults


@pytest.mark.parametrize(
    "bad", [{"httpPutResponseHopLimit": 0}, {"httpPutResponseHopLimit": 65}, {"httpTokens": "sometimes"}]
)
def test_metadata_options_karpenters_schema_refuses_are_refused(bad):
    with pytest.raises(ValueError, match="metadataOptions"):
        metadata_options(bad)
