import pydantic
import pytest

from sim import ec2_faults
from sim.ec2_faults import NEVER_READY_TAG, Ec2Faults, Ec2FaultSpec


def test_pools_match_with_wildcards():
    faults = Ec2Faults()
    faults.add_insufficient_capacity("m5.large", "us-west-2a", "on-demand")
    faults.add_insufficient_capacity("c5.large")  # every zone, every capacity type
    assert faults.exhausted("m5.large", "us-west-2a", "on-demand")
    assert not faults.exhausted("m5.large", "us-west-2a", "spot")
    assert not faults.exhausted("m5.large", "us-west-2b", "on-demand")
    assert faults.exhausted("c5.large", "us-west-2c", "spot")
    assert faults.remove_insufficient_capacity("c5.large")
    assert not faults.exhausted("c5.large", "us-west-2c", "spot")
    assert not faults.remove_insufficient_capacity("c5.large")


def test_spec_round_trips_and_validates():
    faults = Ec2Faults()
    spec = faults.replace(
        {
            "insufficient_capacity": [{"instance_type": "m5.large", "capacity_type": "spot"}],
            "throttle": {"probability": 0.5, "actions": ["RunInstances"], "seed": 1},
            "never_ready": {"instance_types": ["t3.micro"]},
        }
    )
    assert Ec2FaultSpec.model_validate(spec.model_dump()) == faults.spec()
    with pytest.raises(pydantic.ValidationError, match="capacity_type"):
        faults.replace({"insufficient_capacity": [{"instance_type": "m5.large", "capacity_type": "cheap"}]})
    with pytest.raises(pydantic.ValidationError):
        faults.set_throttle(probability=1.5)


def test_never_ready_by_id_type_tag_and_predicate():
    faults = Ec2Faults()
    faults.add_never_ready(instance_ids=["i-1"], instance_types=["t3.micro"])
    faults.add_never_ready(predicate=lambda i: i.get("Placement", {}).get("AvailabilityZone") == "us-west-2c")
    assert faults.is_never_ready({"InstanceId": "i-1", "InstanceType": "m5.large"})
    assert faults.is_never_ready({"InstanceId": "i-2", "InstanceType": "t3.micro"})
    assert faults.is_never_ready({"InstanceId": "i-3", "Tags": [{"Key": NEVER_READY_TAG, "Value": "true"}]})
    assert faults.is_never_ready({"InstanceId": "i-4", "Placement": {"AvailabilityZone": "us-west-2c"}})
    assert not faults.is_never_ready({"InstanceId": "i-5", "InstanceType": "m5.large"})
    faults.clear()
    assert not faults.is_never_ready({"InstanceId": "i-1"})


def test_throttle_by_probability_is_seeded_and_scoped():
    faults = Ec2Faults()
    faults.set_throttle(probability=0.5, actions=["RunInstances"], seed=7)
    first = [faults.should_throttle("RunInstances") for _ in range(200)]
    assert not any(faults.should_throttle("DescribeInstances") for _ in range(50))
    faults.set_throttle(probability=0.5, actions=["RunInstances"], seed=7)
    assert [faults.should_throttle("RunInstances") for _ in range(200)] == first
    assert 60 < sum(first) < 140
    assert faults.counters.throttled == 2 * sum(first)


def test_throttle_token_bucket_allows_the_burst_then_refuses():
    faults = Ec2Faults()
    faults.set_throttle(requests_per_second=0.001, burst=3)
    results = [faults.should_throttle("CreateFleet") for _ in range(5)]
    assert results == [False, False, False, True, True]
    assert not faults.should_throttle("TerminateInstances")  # one bucket per action


def test_installs_nest_and_moto_is_restored_at_the_end():
    from moto.ec2.responses.instances import InstanceResponse

    original = InstanceResponse.run_instances
    outer, inner = Ec2Faults(), Ec2Faults()
    ec2_faults.install(outer)
    ec2_faults.install(inner)
    try:
        assert ec2_faults.active() is inner
        assert InstanceResponse.run_instances is not original
        ec2_faults.uninstall(inner)
        assert ec2_faults.active() is outer
    finally:
        ec2_faults.uninstall(outer)
    assert ec2_faults.active() is None
    assert InstanceResponse.run_instances is original
