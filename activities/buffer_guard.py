"""The taint's check of CapacityBuffers for an emptiness command (planner/capacity_buffers.py).

A buffer's pods exist in no API object (Karpenter builds them in memory), so the taint cannot ask
which node they are on. What it can check is that the buffers the planner accounted for are still
all there is: a buffer that became ready, or asks for more replicas, since the decision could need
the nodes being emptied, and nothing says which. Then every candidate is left out (the command
fails without changing anything) and the next pass decides again with the buffer. A buffer that
went away or shrank frees nodes, which a later pass empties.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from api.capacity_buffer import read_capacity_buffer


def capacity_buffers_grown(planned: Mapping[str, int], buffers: Sequence[Mapping[str, Any]]) -> str | None:
    """Why the ready CapacityBuffers (`buffers`, as listed) need more than the planner accounted for
    (`planned`: namespace/name -> replicas), or None."""
    grown = []
    for raw in buffers:
        buffer = read_capacity_buffer(raw)
        if buffer.ready and buffer.replicas > planned.get(buffer.key, 0):
            grown.append(f"{buffer.key} ({planned.get(buffer.key, 0)} -> {buffer.replicas} replicas)")
    if not grown:
        return None
    return (
        f"CapacityBuffer(s) {', '.join(sorted(grown))} changed since the plan: their pods may need this node"
    )
