"""Placement on existing nodes: the nodes with static compatibility and room for a signature,
scanned in placement order, and the commit of a pod to one.

A part of `Simulator` (planner/scheduling/simulator.py): the state and the other rooms' methods it
reads are declared in `SimulatorState` (state.py)."""

from __future__ import annotations

from kube.selectors import first_untolerated
from planner.scheduling.inputs import SimPod, ports_conflict
from planner.scheduling.requirements import labels_match
from planner.scheduling.state import (
    Effective,
    FitList,
    PreparedNode,
    Probe,
    SimulatorState,
    vec_fits,
    vec_sub,
)


class ExistingNodes(SimulatorState):
    """Placement of a pod on an existing node."""

    def _static_ok_node(self, eff: Effective, node: PreparedNode) -> bool:
        table = self._static_ok.get(eff.static_key)
        if table is None:
            table = self._static_ok[eff.static_key] = {}
        ok = table.get(node.klass)
        if ok is None:
            ok = first_untolerated(eff.tolerations, node.taints) is None and any(
                labels_match(t, node.labels) for t in eff.terms
            )
            table[node.klass] = ok
        return ok

    def _extend(self, fl: FitList, eff: Effective) -> bool:
        nodes = self.nodes
        vec = eff.vec
        assert vec is not None  # only a pod whose requests something offers is placed (_place)
        ports = eff.ports
        while fl.scan < len(nodes):
            node = nodes[fl.scan]
            fl.scan += 1
            if not vec_fits(vec, node.free) or not self._static_ok_node(eff, node):
                continue
            if ports and any(ports_conflict(a, b) for a in ports for b in node.ports):
                continue
            fl.items.append(node.idx)
            return True
        return False

    def _try_existing(self, probe: Probe, eff: Effective, avoid: frozenset[int] = frozenset()) -> int | None:
        """The first existing node that takes the pod; never one of `avoid` (skipped without moving
        the scan's start, since another pod of the signature may go there)."""
        fl = self._fitlists.get(eff.fitkey)
        if fl is None:
            fl = self._fitlists[eff.fitkey] = FitList()
        vec = eff.vec
        assert vec is not None  # only a pod whose requests something offers is placed (_place)
        pos = i = probe.ptr.get(eff.fitkey, 0)
        removed, free, pports = probe.removed, probe.free, probe.ports
        items = fl.items
        found = None
        while True:
            if i >= len(items) and not self._extend(fl, eff):
                break
            idx = items[i]
            if idx in removed:
                if i == pos:
                    pos += 1
                i += 1
                continue
            if avoid and idx in avoid:
                i += 1
                continue
            room = free.get(idx)
            if room is not None and not vec_fits(vec, room):
                if i == pos:
                    pos += 1  # room only shrinks within a probe: never look here again
                i += 1
                continue
            if (
                eff.ports
                and idx in pports
                and any(ports_conflict(a, b) for a in eff.ports for b in pports[idx])
            ):
                if i == pos:
                    pos += 1
                i += 1
                continue
            if self._topology_ok_node(probe, eff, self.nodes[idx]):
                found = idx
                break
            i += 1
        probe.ptr[eff.fitkey] = pos
        return found

    def _try_node(
        self, probe: Probe, eff: Effective, name: str, avoid: frozenset[int] = frozenset()
    ) -> int | None:
        """One named node, when every rule `_try_existing` checks lets the pod land there (a caller's
        planned destination for the pod: see `Simulator.simulate`'s `prefer`)."""
        idx = self.node_index.get(name)
        if idx is None or idx in probe.removed or idx in avoid:
            return None
        node = self.nodes[idx]
        room = probe.free.get(idx, node.free)
        vec = eff.vec
        assert vec is not None  # only a pod whose requests something offers is placed (_place)
        if not vec_fits(vec, room) or not self._static_ok_node(eff, node):
            return None
        if eff.ports:
            taken = (*node.ports, *probe.ports.get(idx, ()))
            if any(ports_conflict(a, b) for a in eff.ports for b in taken):
                return None
        return idx if self._topology_ok_node(probe, eff, node) else None

    def _commit_node(self, probe: Probe, eff: Effective, node: PreparedNode, pod: SimPod) -> None:
        vec = eff.vec
        assert vec is not None  # only a pod whose requests something offers is placed (_place)
        probe.free[node.idx] = vec_sub(probe.free.get(node.idx, node.free), vec)
        if eff.ports:
            probe.ports.setdefault(node.idx, []).extend(eff.ports)
        if probe.background:
            probe.on_node.setdefault(node.idx, []).append((pod, eff))
        self._record(probe, eff, self._node_domains(node), self._node_filter(node))
