"""Temporal search attributes that karpflow workflows upsert, so operators can filter in the Web UI
and with `temporal workflow list --query`, e.g. `KarpflowNodes = 'ip-10-0-1-7.us-west-2.compute.internal'`.

The dev stack registers every attribute here (idempotently) before starting the worker: upserting an
unregistered attribute fails the workflow task.
"""

from __future__ import annotations

import json
from typing import Any

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

NODES = SearchAttributeKey.for_keyword_list("KarpflowNodes")
NODEPOOL = SearchAttributeKey.for_keyword("KarpflowNodePool")
REASON = SearchAttributeKey.for_keyword("KarpflowReason")
PHASE = SearchAttributeKey.for_keyword("KarpflowPhase")

ALL: tuple[SearchAttributeKey[Any], ...] = (NODES, NODEPOOL, REASON, PHASE)


def cli_type(key: SearchAttributeKey[Any]) -> str:
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


# Temporal refuses a search attribute value over 2 KB (`limit.searchAttributeSize`, the default of
# the server and of Temporal Cloud); a start or upsert with a longer one fails the workflow task, and
# the server terminates the controller that tried it. Room is left for the payload's metadata.
NODES_VALUE_BYTES = 1900


def nodes_value(nodes: list[str]) -> list[str]:
    """The nodes a workflow is searchable by: all of them, or as many as fit Temporal's limit (a
    command of 130 nodes is 5.7 KB). The workflow's input and status still name every node."""
    kept: list[str] = []
    size = 2  # the JSON list's brackets
    for node in nodes:
        size += len(json.dumps(node)) + (1 if kept else 0)
        if size > NODES_VALUE_BYTES:
            break
        kept.append(node)
    return kept


def at_start(nodes: list[str], reason: str, nodepool: str | None = None) -> TypedSearchAttributes:
    """What a workflow is searchable by from the moment it starts, before its first workflow task
    upserts anything: crash cleanup and in-flight accounting find its nodes through visibility."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(NODES, nodes_value(list(nodes))),
        SearchAttributePair(REASON, reason),
    ]
    if nodepool:
        pairs.append(SearchAttributePair(NODEPOOL, nodepool))
    return TypedSearchAttributes(pairs)
