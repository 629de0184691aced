"""Label and field selector parsing and matching (pure)."""

from __future__ import annotations

import pytest

from sim.apiserver.errors import BadRequest
from sim.apiserver.selectors import (
    NOTHING,
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector,
)

LABELS = {"app": "web", "tier": "front", "size": "5"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("app=web", True),
        ("app==web", True),
        ("app=db", False),
        ("app!=db", True),
        ("missing!=x", True),  # != matches objects without the key
        ("app in (web, db)", True),
        ("app in (db)", False),
        ("app notin (db)", True),
        ("missing notin (x)", True),
        ("tier", True),
        ("missing", False),
        ("!missing", True),
        ("!tier", False),
        ("size>4", True),
        ("size<5", False),
        ("app=web,tier=front,!missing", True),
        ("app=web,tier=back", False),
        ("empty=", False),
    ],
)
def test_label_selector_operators(text: str, matches: bool) -> None:
    assert parse_label_selector(text).matches(LABELS) is matches


def test_empty_value_matches_empty_label() -> None:
    assert parse_label_selector("k=").matches({"k": ""})


@pytest.mark.parametrize("text", ["app in (", "app in web", "=x", "app=(x)", "bad key!=x=y", "a b", "size>x"])
def test_label_selector_syntax_errors_are_400(text: str) -> None:
    with pytest.raises(BadRequest):
        parse_label_selector(text)


def test_selector_round_trips_to_text() -> None:
    text = "app=web,tier!=back,x in (a,b),y notin (c),z,!w"
    assert str(parse_label_selector(text)) == text


def test_label_selector_objects() -> None:
    sel = selector_from_label_selector(
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front"]},
                {"key": "gone", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel.matches(LABELS) and not sel.matches({"app": "web"})
    assert selector_from_label_selector({}).matches({})  # empty selects everything (policy/v1)
    assert selector_from_label_selector(None) is NOTHING  # null selects nothing
    assert selector_from_label_selector(None, none_matches_all=True).matches({})
    with pytest.raises(ValueError):
        selector_from_label_selector({"matchExpressions": [{"key": "a", "operator": "Maybe"}]})
    with pytest.raises(ValueError):
        selector_from_label_selector({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]})


def test_field_selectors() -> None:
    fields = {"spec.nodeName": "n1", "status.phase": "Running", "metadata.name": "a,b"}
    assert parse_field_selector("spec.nodeName=n1").matches(fields)
    assert parse_field_selector("spec.nodeName==n1,status.phase!=Pending").matches(fields)
    assert not parse_field_selector("spec.nodeName!=n1").matches(fields)
    assert parse_field_selector(r"metadata.name=a\,b").matches(fields)  # escaped comma
    sel = parse_field_selector("spec.nodeName=n1,status.phase!=Failed")
    assert sel.equals("spec.nodeName") == "n1" and sel.equals("status.phase") is None
    assert parse_field_selector("spec.nodeName=").matches({"spec.nodeName": ""})
    with pytest.raises(BadRequest):
        parse_field_selector("nonsense")
