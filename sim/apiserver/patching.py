"""The three PATCH flavours kube-apiserver accepts, as pure functions on JSON documents.

- JSON merge patch (RFC 7386, `application/merge-patch+json`): maps merge, `null` deletes a key,
  every list is replaced whole.
- JSON patch (RFC 6902, `application/json-patch+json`): applied with the `jsonpatch` library.
- Strategic merge patch (`application/strategic-merge-patch+json`): like merge patch, but lists
  that the Go type tags with `patchStrategy:"merge"` are merged — by `patchMergeKey` (conditions by
  `type`, containers by `name`, ownerReferences by `uid`) or as a set for scalars (finalizers).
  Lists without a strategy (node `spec.taints`, pod `spec.tolerations`) are replaced whole. The
  rules per type are in `resources.py`. Directives supported: `$patch: replace|delete|merge`,
  `$retainKeys`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>`.

Functions never modify their inputs' nested objects in place unless documented; they raise
`BadRequest` for a malformed patch document and `Invalid` (422) when a well-formed patch cannot be
applied (a failing JSON-patch `test`, a missing path), as kube-apiserver does.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from sim.apiserver.errors import BadRequest, Invalid
from sim.apiserver.resources import MergeRule, Path

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"

# Short names used by the Python store API.
PATCH_TYPES = {"merge": MERGE_PATCH, "json": JSON_PATCH, "strategic": STRATEGIC_MERGE_PATCH}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386. Returns a new document; `target` is not modified."""
    if not isinstance(patch, dict):
        return _copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = merge_patch(result.get(key), value)
        else:
            result[key] = _copy.deepcopy(value)
    return result


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 via `jsonpatch`. Returns a new document."""
    if not isinstance(operations, list):
        raise BadRequest("a JSON patch must be a list of operations")
    try:
        patch = jsonpatch.JsonPatch(operations)
        return patch.apply(target, in_place=False)
    except jsonpatch.InvalidJsonPatch as err:
        raise BadRequest(f"invalid JSON patch: {err}") from None
    except (
        jsonpatch.JsonPatchConflict,
        jsonpatch.JsonPatchTestFailed,
        jsonpatch.JsonPointerException,
    ) as err:
        raise Invalid(f"the server rejected our request due to an error in our request: {err}") from None
    except (KeyError, IndexError, TypeError) as err:
        raise Invalid(f"the server rejected our request due to an error in our request: {err!r}") from None


_PATCH = "$patch"
_RETAIN = "$retainKeys"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_ORDER = "$setElementOrder/"


def strategic_merge_patch(
    original: Any, patch: Any, rules: Mapping[Path, MergeRule], *, copy: bool = True
) -> Any:
    """Apply a strategic-merge patch with the given merge rules. Returns a new document, or with
    `copy=False` edits `original` in place (the store passes a fresh parse)."""
    if not isinstance(patch, dict):
        raise BadRequest("a strategic merge patch must be a JSON object")
    base = (_copy.deepcopy(original) if copy else original) if isinstance(original, dict) else {}
    result = _merge_map(base, patch, (), rules)
    return {} if result is None else result


def _merge_map(orig: dict[str, Any], patch: dict[str, Any], path: Path, rules: Mapping[Path, MergeRule]):
    directive = patch.get(_PATCH)
    if directive == "delete":
        return None
    if directive == "replace":
        return {k: _copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    if directive not in (None, "merge"):
        raise BadRequest(f"unknown patch directive {directive!r} at {'.'.join(path) or '<root>'}")

    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in (_PATCH, _RETAIN):
            continue
        if key.startswith(_ORDER):
            if not isinstance(value, list):
                raise BadRequest(f"{key} must be a list")
            orders[key[len(_ORDER) :]] = value
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            name = key[len(_DELETE_PRIMITIVE) :]
            if not isinstance(value, list):
                raise BadRequest(f"{key} must be a list")
            if isinstance(orig.get(name), list):
                orig[name] = [v for v in orig[name] if v not in value]
            continue
        if key.startswith("$"):
            raise BadRequest(f"unknown patch directive {key!r}")
        child = (*path, key)
        if value is None:
            orig.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(orig[key] if isinstance(orig.get(key), dict) else {}, value, child, rules)
            if merged is None:
                orig.pop(key, None)
            else:
                orig[key] = merged
        elif isinstance(value, list):
            orig[key] = _merge_list(orig.get(key), value, child, rules)
        else:
            orig[key] = value

    for name, order in orders.items():
        if isinstance(orig.get(name), list):
            orig[name] = _apply_order(orig[name], order, rules.get((*path, name)))

    retain = patch.get(_RETAIN)
    if retain is not None:
        if not isinstance(retain, list):
            raise BadRequest("$retainKeys must be a list")
        orig = {k: v for k, v in orig.items() if k in retain}
    return orig


def _merge_list(orig: Any, patch: list[Any], path: Path, rules: Mapping[Path, MergeRule]) -> list[Any]:
    rule = rules.get(path)
    if rule is None or not rule.merge:
        return [_strip_directives(v) for v in patch]
    if any(isinstance(item, dict) and item.get(_PATCH) == "replace" for item in patch):
        return [
            _strip_directives(v) for v in patch if not (isinstance(v, dict) and v.get(_PATCH) == "replace")
        ]
    current: list[Any] = list(orig) if isinstance(orig, list) else []
    if rule.key is None:
        # A set of scalars (finalizers, podCIDRs): union, existing order first.
        for item in patch:
            if isinstance(item, dict | list):
                raise BadRequest(f"{'.'.join(path)}: expected a list of scalars")
            if item not in current:
                current.append(item)
        return current
    key = rule.key
    for item in patch:
        if not isinstance(item, dict):
            raise BadRequest(f"{'.'.join(path)}: items must be objects with a {key!r} field")
        if key not in item:
            raise BadRequest(f"{'.'.join(path)}: map: {item} does not contain declared merge key: {key}")
        idx = next(
            (i for i, o in enumerate(current) if isinstance(o, dict) and o.get(key) == item[key]), None
        )
        if item.get(_PATCH) == "delete":
            if idx is not None:
                current.pop(idx)
            continue
        if idx is None:
            current.append(_strip_directives(item))
        else:
            merged = _merge_map(current[idx], item, path, rules)
            if merged is None:
                current.pop(idx)
            else:
                current[idx] = merged
    return current


def _apply_order(items: list[Any], order: list[Any], rule: MergeRule | None) -> list[Any]:
    """Honour `$setElementOrder`: listed items in that order, the others after, as they were."""
    key = rule.key if rule else None

    def ident(item: Any) -> Any:
        return item.get(key) if key and isinstance(item, dict) else item

    wanted = [o.get(key) if key and isinstance(o, dict) else o for o in order]
    rank = {repr(w): i for i, w in enumerate(wanted)}
    ranked = [it for it in items if repr(ident(it)) in rank]
    rest = [it for it in items if repr(ident(it)) not in rank]
    ranked.sort(key=lambda it: rank[repr(ident(it))])
    return ranked + rest


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value
