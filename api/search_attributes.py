"""Temporal search attributes that karpflow workflows upsert, so operators can filter in the Web UI
and with `temporal workflow list --query`, e.g. `KarpflowNodes = 'ip-10-0-1-7.us-west-2.compute.internal'`.

The dev stack registers every attribute here (idempotently) before starting the worker: upserting an
unregistered attribute fails the workflow task.
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

NODES = SearchAttributeKey.for_keyword_list("KarpflowNodes")
NODEPOOL = SearchAttributeKey.for_keyword("KarpflowNodePool")
REASON = SearchAttributeKey.for_keyword("KarpflowReason")
PHASE = SearchAttributeKey.for_keyword("KarpflowPhase")

ALL: tuple[SearchAttributeKey, ...] = (NODES, NODEPOOL, REASON, PHASE)


def cli_type(key: SearchAttributeKey) -> str:
    """The `--type` value `temporal operator search-attribute create` expects for this key."""
    return {
        "KEYWORD": "Keyword",
        "KEYWORD_LIST": "KeywordList",
        "TEXT": "Text",
        "INT": "Int",
        "FLOAT": "Double",
        "BOOL": "Bool",
        "DATETIME": "Datetime",
    }[key.indexed_value_type.name.removeprefix("INDEXED_VALUE_TYPE_")]


def at_start(nodes: list[str], reason: str, nodepool: str | None = None) -> TypedSearchAttributes:
    """What a workflow is searchable by from the moment it starts, before its first workflow task
    upserts anything: crash cleanup and in-flight accounting find its nodes through visibility."""
    pairs: list[SearchAttributePair] = [
        SearchAttributePair(NODES, list(nodes)),
        SearchAttributePair(REASON, reason),
    ]
    if nodepool:
        pairs.append(SearchAttributePair(NODEPOOL, nodepool))
    return TypedSearchAttributes(pairs)
