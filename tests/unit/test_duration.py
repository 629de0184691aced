from datetime import timedelta

import pytest

from api.duration import (
    DurationError,
    format_duration,
    karpenter_duration,
    parse_duration,
    parse_optional_duration,
    ttl_seconds,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("720h", timedelta(hours=720)),
        ("1h30m", timedelta(minutes=90)),
        ("15s", timedelta(seconds=15)),
        ("1.5h", timedelta(minutes=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("0", timedelta(0)),
        ("0s", timedelta(0)),
        ("-5m", timedelta(minutes=-5)),
    ],
)
def test_go_durations_parse(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "5", "1d", "h", "1h 30m", "abc", "10mm"])
def test_invalid_durations_are_refused_with_the_text(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_never_means_no_duration():
    assert parse_optional_duration("Never") is None
    assert parse_optional_duration(None) is None
    assert parse_optional_duration("1m") == timedelta(minutes=1)


def test_format_is_the_inverse_of_parse():
    for text in ("720h", "1h30m", "15s", "0s", "Never"):
        assert format_duration(parse_optional_duration(text) if text != "0s" else timedelta(0)) == text


@pytest.mark.parametrize(
    ("text", "never_ok", "expected"),
    [("720h", True, timedelta(hours=720)), ("0s", False, timedelta(0)), ("Never", True, None)],
)
def test_karpenter_durations_are_go_durations_that_are_not_negative(text, never_ok, expected):
    assert karpenter_duration(text, never_ok=never_ok) == expected


@pytest.mark.parametrize(
    ("value", "never_ok", "message"),
    [
        ("-1h", True, "must not be negative"),
        ("-0.5s", True, "must not be negative"),
        ("Never", False, "not allowed here"),
        ("1d", True, "invalid duration"),
        (3600, True, "is not a duration"),
        (None, True, "is not a duration"),
    ],
)
def test_invalid_karpenter_durations_say_why(value, never_ok, message):
    with pytest.raises(DurationError, match=message):
        karpenter_duration(value, never_ok=never_ok)


def test_provisioner_ttls_are_whole_non_negative_seconds():
    assert ttl_seconds(30) == timedelta(seconds=30)
    for bad in (-1, 1.5, "30", True):
        with pytest.raises(DurationError):
            ttl_seconds(bad)


@pytest.mark.parametrize("value", ["99999999999999h", "9" * 400 + "s", 1e300, float("inf"), 10**20])
def test_a_duration_out_of_range_is_a_duration_error(value):
    """Found by the fuzz tests (tests/unit/test_fuzz_inputs.py): Karpenter's CRD pattern admits
    "99999999999999h", and it raised OverflowError, past every caller's handling of bad input: a
    NodePool with it broke reading the pool instead of being reported as invalid."""
    with pytest.raises(DurationError, match="out of range"):
        parse_duration(value)


def test_a_nodepool_with_an_out_of_range_expire_after_is_read_with_a_problem():
    from api.nodepool_reader import read_nodepool

    raw = {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": "p"},
        "spec": {
            "template": {
                "spec": {
                    "expireAfter": "99999999999999h",
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "d"},
                    "requirements": [],
                }
            }
        },
    }
    pool, problems = read_nodepool(raw)
    assert any("expireAfter" in p and "out of range" in p for p in problems), problems
    assert pool.spec.template.spec.expire_after == "Never"  # fails closed: never expires


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(microseconds=1), "0.000001s"),
        (timedelta(seconds=12.345678), "12.345678s"),
        (timedelta(hours=1, microseconds=500_000), "1h0.5s"),
        (-timedelta(minutes=1, microseconds=10), "-1m0.00001s"),
    ],
)
def test_a_formatted_duration_is_go_syntax_that_parses_back_the_same(delta, text):
    """Found by the fuzz tests: "%g" wrote 1e-06s, which is not Go syntax, and 12.3457s for
    12.345678s, so a workflow input with such a duration did not read back as it was started."""
    assert format_duration(delta) == text
    assert parse_duration(text) == delta
