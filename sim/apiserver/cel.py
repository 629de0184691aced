"""CRD validation rules (`x-kubernetes-validations`), evaluated as kube-apiserver does.

Each rule is a CEL expression over `self` (the value at the schema node that carries it) and, for a
transition rule, `oldSelf` (the value before an update; such a rule is skipped on create, and when
the old object has no value there). A rule that is not true is a field error in kube-apiserver's
words, `<path>: Invalid value: "<schema type>": <message>` (`failed rule: <rule>` without a
message); a rule that cannot be evaluated (`int("x")`) is `<error> evaluating rule: <message>`.

CEL comes from cel-python (celpy): it follows the spec where Karpenter's rules need it (a macro such
as `all()` is false when any element is false even if another errs, as in cel-go; the Rust-based
`common-expression-language` raised there instead). Kubernetes adds libraries to CEL; the functions
Karpenter's rules call beyond the standard ones are added here: `find` (regex library) and `split`
(strings library); every rule of the bundled v1.14.1 CRDs compiles with them. An unset field a rule
reads is cel-go's `no such key: <field>`, as kube-apiserver prints it. Values are converted by their
schema type, so an `integer` field is a CEL int.
Not reproduced: the cost budget, `messageExpression`, `fieldPath`/`reason`, old values inside lists
(list items are not correlated: transition rules under a list are skipped, as for atomic lists).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import celpy
from celpy import celtypes

log = logging.getLogger("sim.apiserver.cel")
FieldErrors = list[tuple[str, str, str]]
_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _find(text: celtypes.StringType, pattern: celtypes.StringType) -> celtypes.StringType:
    """Kubernetes' regex library: the first match of `pattern` in `text`, "" when there is none."""
    match = re.search(str(pattern), str(text))
    return celtypes.StringType(match.group(0) if match else "")


def _split(text: celtypes.StringType, separator: celtypes.StringType) -> celtypes.ListType:
    """Kubernetes' strings library: `text` split at every `separator`."""
    return celtypes.ListType([celtypes.StringType(part) for part in str(text).split(str(separator))])


_FUNCTIONS = {"find": _find, "split": _split}
_ENV = celpy.Environment()


@functools.lru_cache(maxsize=512)
def _program(rule: str) -> tuple[Any, bool]:
    """The compiled rule, and whether it reads `oldSelf` (a transition rule)."""
    program = _ENV.program(_ENV.compile(rule), functions=_FUNCTIONS)
    return program, re.search(r"\boldSelf\b", rule) is not None


def _to_cel(value: Any, schema: dict[str, Any]) -> Any:
    """A JSON value as CEL sees it, typed by its schema (a JSON 2 in a `number` field is a double)."""
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return celtypes.MapType(
            {
                celtypes.StringType(k): _to_cel(
                    v, properties.get(k) or (extra if isinstance(extra, dict) else {})
                )
                for k, v in value.items()
            }
        )
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return celtypes.ListType([_to_cel(v, items) for v in value])
    if isinstance(value, bool) or value is None:
        return celpy.json_to_cel(value)
    if isinstance(value, int | float) and schema.get("type") == "number":
        return celtypes.DoubleType(value)
    if isinstance(value, float) and schema.get("type") == "integer" and value.is_integer():
        return celtypes.IntType(int(value))
    return celpy.json_to_cel(value)


def _matches_type(value: Any, schema: dict[str, Any]) -> bool:
    """Rules only run on a value of their node's type (a wrong type is already a schema error)."""
    kind = schema.get("type")
    if kind is None:
        return True
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return _TYPES.get(type(value)) == kind


def rule_errors(
    schema: dict[str, Any], value: Any, old: Any = None, path: str = "", has_old: bool = False
) -> FieldErrors:
    """Field errors of every validation rule in `schema` and below it, for `value` (and `old`, the
    value before an update, when `has_old`)."""
    if not isinstance(schema, dict) or not _matches_type(value, schema):
        return []
    errs: FieldErrors = []
    rules = schema.get("x-kubernetes-validations") or []
    if rules:
        errs += _evaluate(rules, schema, value, old, path, has_old)
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        old_map = old if has_old and isinstance(old, dict) else {}
        for key, child in value.items():
            sub = properties.get(key) or (extra if isinstance(extra, dict) else None)
            if sub is None:
                continue
            where = (f"{path}.{key}" if path else key) if key in properties else f"{path}[{key}]"
            errs += rule_errors(sub, child, old_map.get(key), where, key in old_map)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, child in enumerate(value):
            errs += rule_errors(schema["items"], child, None, f"{path}[{index}]", False)
    return errs


# celpy's words for a field or key that is not there, and cel-go's, which kube-apiserver prints (cel-go
# common/types/err.go `NoSuchKey`; apiextensions-apiserver pkg/apiserver/schema/cel/validation.go quotes
# the error before "evaluating rule"): a rule reading an unset field, such as the EC2NodeClass's
# `e in self.evictionSoftGracePeriod` when only evictionSoft is set.
_NO_SUCH_MEMBER = re.compile(r"^no such member in mapping: '(.*)'$")


def _eval_detail(err: celpy.CELEvalError) -> str:
    """The cause of an evaluation error (celpy wraps it as (summary, type, args)), in cel-go's words
    where they differ."""
    args = err.args
    if len(args) >= 3 and args[2]:
        detail = str(args[2][0] if isinstance(args[2], tuple) else args[2])
    else:
        detail = str(args[0]) if args else str(err)
    return _NO_SUCH_MEMBER.sub(r"no such key: \1", detail)


def _evaluate(
    rules: list[dict[str, Any]], schema: dict[str, Any], value: Any, old: Any, path: str, has_old: bool
) -> FieldErrors:
    kind = schema.get("type") or ""
    errs: FieldErrors = []
    activation: dict[str, Any] | None = None
    for rule in rules:
        text = str(rule.get("rule", ""))
        message = str(rule.get("message") or "").strip()
        program, transition = _program(text)
        if transition and not has_old:
            continue
        if activation is None:
            activation = {"self": _to_cel(value, schema)}
            if has_old:
                activation["oldSelf"] = _to_cel(old, schema)
        try:
            result = program.evaluate(activation)
        except celpy.CELEvalError as err:
            result = err
        if isinstance(result, celpy.CELEvalError):
            detail = _eval_detail(result)
            why = f"{detail} evaluating rule: {message or text}"
            errs.append((path, "FieldValueInvalid", f'Invalid value: "{kind}": {why}'))
        elif result != celtypes.BoolType(True):
            errs.append(
                (path, "FieldValueInvalid", f'Invalid value: "{kind}": {message or f"failed rule: {text}"}')
            )
    return errs
