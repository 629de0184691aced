"""What the Temporal Web UI shows for a workflow before anyone opens it: a one-line static summary
("Drifted: replace ip-… with m5.large spot in us-west-2a") and a memo with the command that started
it, its reason and the estimated savings. Whoever starts a DisruptionWorkflow passes them to
`start_workflow(static_summary=..., static_details=..., memo=...)`; they cost no workflow history.

Duck-typed on the planner's `Command` (planner/model.py) and its serialized `CommandOut` (what
validation keeps), like `api.workflow_io.disruption_input`, so this module stays free of the planner.
The controller's commands carry them from the planning activity (`PlannedCommand.summary`, ...).

A command that waits for an operator (`DisruptionInput.approval`, a NodePool's
`karpflow.dev/require-approval`) says so in both, with the pending plan and the timeout; while it
waits, the workflow's current details (`awaiting_approval_details`) say until when.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from api.duration import format_duration

SUMMARY_LIMIT = 200  # the UI shows one line; Temporal caps the field at 400 bytes


def short_node(name: str) -> str:
    """`ip-10-0-1-2.us-west-2.compute.internal` -> `ip-10-0-1-2`: the part people tell apart."""
    return name.split(".", 1)[0]


def _nodes(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(short_node(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _type_names(replacement: Any) -> list[str]:
    """The launch options: a planner Replacement's `instance_type_names`, a CommandOut's names."""
    names = getattr(replacement, "instance_type_names", None)
    return list(names if names is not None else replacement.instance_types)


def _replacement(replacement: Any) -> str:
    types = _type_names(replacement)
    zones = list(replacement.zones)
    where = f" in {zones[0]}" if len(zones) == 1 else (f" in {len(zones)} zones" if zones else "")
    others = len(types) - 1
    alternatives = f" (or {others} other type{'s' if others > 1 else ''})" if others > 0 else ""
    return f"{types[0] if types else 'a node'} {replacement.capacity_type}{where}{alternatives}"


def _plan(command: Any) -> str:
    """What goes, what comes, what it saves: `replace ip-a with m5.large spot in us-west-2a, saves $…/h`."""
    nodes = list(command.nodes)
    if command.replacements:
        launched = "; ".join(_replacement(r) for r in command.replacements)
        text = f"replace {_nodes(nodes)} with {launched}"
    else:
        text = f"delete {len(nodes)} node{'s' if len(nodes) != 1 else ''}: {_nodes(nodes)}"
    savings = float(getattr(command, "savings_per_hour", 0.0) or 0.0)
    if savings > 0:
        text += f", saves ${savings:.4f}/h"
    return text


def disruption_summary(command: Any, approval: Any = None) -> str:
    """One line: reason, what goes, what comes, what it saves; first, whether it awaits approval
    (`approval`: the command's `DisruptionInput.approval`, or None)."""
    gate = f" (awaits approval, {format_duration(approval.timeout)})" if approval is not None else ""
    return f"{command.reason}{gate}: {_plan(command)}"[:SUMMARY_LIMIT]


def awaiting_approval_details(command: Any, approval: Any, rejected_at: datetime) -> str:
    """The workflow's current details while it waits at the approval gate (Markdown): the pending plan,
    the estimated savings, and when no decision rejects it."""
    lines = [
        f"**Awaiting approval**: {command.reason}: {_plan(command)}",
        "",
        f"Estimated savings: ${float(approval.savings_per_hour):.4f}/h. Nothing changes before a decision; "
        f"without one it is rejected at {rejected_at.strftime('%Y-%m-%dT%H:%M:%SZ')} "
        f"(timeout {format_duration(approval.timeout)}).",
        "",
        "Nodes:",
        "",
        *(f"- {name}" for name in command.nodes),
    ]
    for index, replacement in enumerate(command.replacements):
        lines.append(f"- replacement {index + 1}: {_replacement(replacement)}")
    lines += ["", "Decide with the `approve` or `reject` update (`karpflow approve` / `karpflow reject`)."]
    return "\n".join(lines)


def disruption_details(command: Any, approval: Any = None) -> str:
    """The summary's longer form (the UI's details field; Markdown): every node and option, and the
    approval gate when the command waits for one."""
    lines = [f"**{command.reason}** ({command.method}, {command.decision})", "", "Nodes:", ""]
    lines += [f"- {name}" for name in command.nodes]
    for index, replacement in enumerate(command.replacements):
        lines += [
            "",
            f"Replacement {index + 1}: NodePool {replacement.nodepool}, {replacement.capacity_type}, "
            f"zones {', '.join(replacement.zones) or 'any'}",
            f"options, cheapest first: {', '.join(_type_names(replacement))}",
        ]
    if getattr(command, "message", ""):
        lines += ["", str(command.message)]
    if approval is not None:
        lines += [
            "",
            f"**Awaits approval** before it takes any node: `approve` or `reject` (`karpflow approve` / "
            f"`karpflow reject`); no decision within {format_duration(approval.timeout)} rejects it. "
            f"Estimated savings ${float(approval.savings_per_hour):.4f}/h.",
        ]
    return "\n".join(lines)


def disruption_memo(command: Any, started_by: str) -> dict[str, Any]:
    """The memo: who started it (the command line), why, and the estimated savings per hour."""
    return {
        "command": started_by,
        "reason": command.reason,
        "method": command.method,
        "decision": command.decision,
        "nodes": list(command.nodes),
        "estimatedSavingsPerHour": round(float(getattr(command, "savings_per_hour", 0.0) or 0.0), 6),
    }
