"""The rollout policy as operators write it on a NodePool, and the waves it makes."""

from __future__ import annotations

from datetime import timedelta

import pytest

from api.rollout_io import RolloutNode
from api.rollout_policy import PolicyError, RolloutPolicy, parse_policy, resolve_count
from workflows.rollout_waves import next_wave


def test_the_policy_reads_as_written_with_karpenter_style_counts_and_durations():
    policy = parse_policy(
        '{"canary": "10%", "soak": "1h30m", "growth": 3, "maxWave": 20, "zoneByZone": true}'
    )
    assert policy is not None
    assert policy.canary == "10%" and policy.soak == timedelta(hours=1, minutes=30)
    assert policy.max_wave == "20" and policy.zone_by_zone and policy.growth == 3
    gate = parse_policy(
        '{"maxRestarts": 0, "readyTimeout": "90s",'
        ' "prometheus": {"url": "http://p:9090", "query": "up", "max": 0.5}}'
    )
    assert gate is not None and gate.max_restarts == 0 and gate.ready_timeout == timedelta(seconds=90)
    assert gate.prometheus is not None and gate.prometheus.max == 0.5
    assert parse_policy(None) is None and parse_policy("  ") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "is not JSON"),
        ("[1]", "must be a JSON object"),
        ('{"canary": 0}', "at least one node"),
        ('{"canary": "150%"}', "between 1% and 100%"),
        ('{"canary": true}', "not a node count"),
        ('{"soak": "soon"}', "invalid duration"),
        ('{"growth": 0.5}', "growth"),
        ('{"sprinkles": 1}', "sprinkles"),
        ('{"prometheus": {"url": "ftp://x", "query": "up", "max": 1}}', "prometheus.url"),
    ],
)
def test_a_bad_policy_says_what_is_wrong(text: str, says: str):
    with pytest.raises(PolicyError, match=r"karpflow\.dev/rollout-policy") as err:
        parse_policy(text)
    assert says in str(err.value)


def test_waves_grow_by_the_factor_up_to_the_cap_and_cover_every_node():
    assert RolloutPolicy(canary="1", growth=2).wave_sizes(10) == [1, 2, 4, 3]
    assert RolloutPolicy(canary="1", growth=2, max_wave="3").wave_sizes(10) == [1, 2, 3, 3, 1]
    assert RolloutPolicy(canary="10%", growth=1).wave_sizes(20) == [2] * 10
    assert sum(RolloutPolicy(canary="5%", growth=1.5).wave_sizes(5000)) == 5000
    assert resolve_count("10%", 5) == 1 and resolve_count("3", 100) == 3


def test_after_the_canary_a_zone_by_zone_wave_takes_one_zone():
    nodes = [RolloutNode(name=f"n{i}", uid=f"u{i}", zone=z) for i, z in enumerate("abcabc")]
    policy = RolloutPolicy(canary="1", growth=10, zone_by_zone=True)
    assert [n.name for n in next_wave(policy, 6, 0, nodes)] == ["n0"]  # the canary: any zone
    rest = nodes[1:]
    second = next_wave(policy, 6, 1, rest)
    assert {n.zone for n in second} == {"a"} and [n.name for n in second] == ["n3"]
    assert len(next_wave(policy.model_copy(update={"zone_by_zone": False}), 6, 1, rest)) == 5


def test_the_policy_survives_a_workflow_payload_round_trip_in_the_users_units():
    """Temporal carries it as JSON: durations stay Go durations, and an ISO form still reads."""
    policy = RolloutPolicy(soak=timedelta(minutes=2), ready_timeout=timedelta(seconds=90), max_wave="5")
    text = policy.model_dump_json()
    assert '"soak":"2m"' in text and '"ready_timeout":"1m30s"' in text
    assert RolloutPolicy.model_validate_json(text) == policy
    assert RolloutPolicy.model_validate({"soak": "PT2M"}).soak == timedelta(minutes=2)
