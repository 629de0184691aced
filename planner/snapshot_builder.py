"""A Snapshot kept up to date from watch events, instead of rebuilt from every object each pass.

At 200,000 pods, parsing every object into the planner's slim classes takes seconds, and between two
passes only a few hundred objects change. The worker's informer cache (cluster/informer.py) tells a
`SnapshotBuilder` every listing and watch event; `snapshot()` parses only what changed since the
last call, reuses every other parsed object, and assembles a new `Snapshot` from them.

The result equals `Snapshot.from_objects` over the same objects in the informer's order (the
property tests/unit/planner/test_snapshot_builder.py checks after random event sequences): objects
of each kind in the order of `kinds`, and within a kind in the order a dict keyed by namespace/name
keeps them (a new key at the end, a changed one in its place, a listing in its own order). Each
object is parsed exactly as `from_objects` parses it (the same `_add_objects`), and the parts are
merged as they would have been added. What a snapshot settles per pass (pods linked to nodes, PDBs'
disruptionsAllowed, the nodes held by workflows in flight) is done on copies, so a snapshot handed to
one pass never changes under it, whatever the next pass builds.

Pure: no I/O, no clock. Events may arrive on one thread (the event loop) while `snapshot()` runs on
another: events are queued under a lock, and applied by the next `snapshot()` call.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from api.constants import DISRUPTED_TAINT_KEY
from kube.pods import do_not_disrupt_problem
from kube.selectors import Taint
from planner.snapshot import Pod, Snapshot, parse_pod

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
_POD = "Pod"
_RELIST = "RELIST"
SOURCE = "<objects>"  # what Snapshot.from_objects names its source
_PARSED_AT = datetime(1970, 1, 1, tzinfo=UTC)
_DISRUPTED = Taint.from_dict({"key": DISRUPTED_TAINT_KEY, "effect": "NoSchedule"}, "virtual taint")


def object_key(obj: Mapping[str, Any]) -> str:
    """namespace/name: how an informer keys an object of a kind (cluster-scoped: "/name")."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


def _version(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, resourceVersion): the same pair means the same content, so a re-list reuses the parse."""
    meta = obj.get("metadata") or {}
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    return (str(uid), str(version)) if uid and version else None


class _Entry:
    """One object: its version and what parsing it gave (a pod, or a one-object Snapshot)."""

    __slots__ = ("part", "pod", "problems", "raw", "seq", "version")

    def __init__(self, raw: Mapping[str, Any], seq: int = 0) -> None:
        self.raw: Mapping[str, Any] | None = raw  # dropped once parsed
        # Its place among its kind's objects (the informer's order): pods linked to a node are kept
        # in this order, as a snapshot lists them.
        self.seq = seq
        self.version = _version(raw)
        self.pod: Pod | None = None
        self.problems: tuple[str, ...] = ()
        self.part: Snapshot | None = None

    def parse(self) -> None:
        raw, self.raw = self.raw, None
        assert raw is not None
        if raw.get("kind") == "Pod":
            # The hot path (most objects are pods): what Snapshot._add + _put_pod do, less the Snapshot.
            try:
                self.pod = parse_pod(raw)
            except Exception:
                pass  # the general path below reports it exactly as from_objects does
            else:
                problem = do_not_disrupt_problem(self.pod.annotations)
                self.problems = (f"Pod {self.pod.key}: {problem}",) if problem is not None else ()
                return
        part = Snapshot(now=_PARSED_AT)  # parsing does not read the time
        part._add_objects([raw], SOURCE)
        self.part = part

    def pods(self) -> tuple[Pod, ...]:
        if self.pod is not None:
            return (self.pod,)
        return tuple(self.part.pods) if self.part is not None else ()


class SnapshotBuilder:
    """Parsed cluster objects, kept up to date by `replace` (a listing) and `apply` (a watch event)."""

    def __init__(self, kinds: Sequence[str]) -> None:
        self.kinds = tuple(kinds)
        self._entries: dict[str, dict[str, _Entry]] = {kind: {} for kind in self.kinds}
        self._pending: list[tuple[str, str, Any]] = []
        self._pending_lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._instances: dict[int, tuple[Mapping[str, Any], Snapshot]] = {}
        self.parsed = 0  # objects parsed so far (a figure for tests and benches)
        # Pods by the node they are bound to, kept up to date with the events, so a snapshot links
        # each node's pods without walking every pod: node name -> seq -> pod; each node's list in
        # seq order as the last snapshot linked it; the nodes whose pods changed since.
        self._seq = itertools.count()
        self._by_node: dict[str, dict[int, Pod]] = {}
        self._linked: dict[str, list[Pod]] = {}
        self._dirty: set[str] = set()

    # -- events (any thread) -------------------------------------------------------------------------

    def replace(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """Every object of `kind`, as a listing returned them (in that order)."""
        with self._pending_lock:
            self._pending.append((_RELIST, kind, list(objects)))

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """A watch event of `kind`: ADDED, MODIFIED or DELETED (others are ignored)."""
        if event in (ADDED, MODIFIED, DELETED):
            with self._pending_lock:
                self._pending.append((event, kind, obj))

    # -- snapshots (one at a time, any thread) -------------------------------------------------------

    def snapshot(
        self,
        now: datetime,
        instances: Iterable[Mapping[str, Any]] = (),
        held: Iterable[str] = (),
    ) -> Snapshot:
        """The objects as `Snapshot.from_objects(objects, now, instances=instances)` reads them, with the
        nodes named in `held` tainted `karpenter.sh/disrupted` (in-flight workflows hold them)."""
        with self._build_lock:
            self._catch_up()
            snapshot = Snapshot(now=now)
            snapshot.sources.append(SOURCE)
            pods, problems = snapshot.pods, snapshot.problems
            for kind in self.kinds:
                for entry in self._entries[kind].values():
                    if entry.pod is not None:
                        pods.append(entry.pod)
                        if entry.problems:
                            problems.extend(entry.problems)
                    elif entry.part is not None:
                        snapshot._merge(entry.part)
            self._merge_instances(snapshot, instances, now)
            for name in held:
                node = snapshot.nodes.get(name)
                if node is not None and not any(t.key == DISRUPTED_TAINT_KEY for t in node.taints):
                    node.taints = (*node.taints, _DISRUPTED)
            snapshot._index(self._linked_pods())
            return snapshot

    def _linked_pods(self) -> dict[str, list[Pod]]:
        """Each node name's bound pods in the informer's order; only changed nodes are sorted again."""
        for name in self._dirty:
            bucket = self._by_node.get(name)
            if bucket:
                self._linked[name] = [bucket[seq] for seq in sorted(bucket)]
            else:
                self._by_node.pop(name, None)
                self._linked.pop(name, None)
        self._dirty.clear()
        return self._linked

    def catch_up(self) -> None:
        """Parse what changed, now rather than at the next snapshot (e.g. right after the first sync)."""
        with self._build_lock:
            self._catch_up()

    def _catch_up(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        changed: dict[tuple[str, str], _Entry] = {}  # the last version of each changed object
        touched: dict[str, _Entry | None] = {}  # pod key -> its entry before these events
        relisted = False
        for event, kind, obj in pending:
            entries = self._entries.get(kind)
            if entries is None:
                continue
            if event == _RELIST:
                fresh = {}
                for item in obj:
                    old = entries.get(object_key(item))
                    version = _version(item)
                    key = object_key(item)
                    if old is not None and version is not None and old.version == version:
                        fresh[key] = old
                        old.seq = next(self._seq)  # in the listing's order
                    else:
                        fresh[key] = changed[(kind, key)] = _Entry(item, next(self._seq))
                self._entries[kind] = fresh
                relisted = relisted or kind == _POD
            elif event == DELETED:
                key = object_key(obj)
                if kind == _POD:
                    touched.setdefault(key, entries.get(key))
                entries.pop(key, None)
            else:
                key = object_key(obj)
                old = entries.get(key)
                if kind == _POD:
                    touched.setdefault(key, old)
                # A changed object keeps its place in the dict, a new one goes to the end.
                seq = old.seq if old is not None else next(self._seq)
                entries[key] = changed[(kind, key)] = _Entry(obj, seq)
        for (kind, key), entry in changed.items():
            if self._entries[kind].get(key) is entry:  # not deleted or listed away since
                entry.parse()
                self.parsed += 1
        if _POD in self._entries:
            self._relink(touched, relisted)

    def _relink(self, touched: Mapping[str, _Entry | None], relisted: bool) -> None:
        """Bring the pods-by-node index up to date with the pods these events changed."""
        entries = self._entries[_POD]
        if relisted:  # a new order for every pod: index them all again
            self._dirty.update(self._by_node, self._linked)
            self._by_node = {}
            touched = dict.fromkeys(entries)
        gone, came = [], []
        for key, old in touched.items():
            new = entries.get(key)
            if new is old:
                continue
            if old is not None and not relisted:
                gone.append(old)
            if new is not None:
                came.append(new)
        for entry in gone:  # all removals first: a changed pod keeps its seq
            for pod in entry.pods():
                bucket = self._by_node.get(pod.node_name or "")
                if bucket is not None and bucket.get(entry.seq) is pod:
                    del bucket[entry.seq]
                    self._dirty.add(pod.node_name or "")
        for entry in came:
            for pod in entry.pods():
                if pod.node_name:
                    self._by_node.setdefault(pod.node_name, {})[entry.seq] = pod
                    self._dirty.add(pod.node_name)

    def _merge_instances(
        self, snapshot: Snapshot, instances: Iterable[Mapping[str, Any]], now: datetime
    ) -> None:
        """EC2's descriptions: the same dicts come back while they are cached, so each is parsed once."""
        seen: dict[int, tuple[Mapping[str, Any], Snapshot]] = {}
        for raw in instances:
            known = self._instances.get(id(raw))
            if known is None or known[0] is not raw:
                part = Snapshot(now=now)
                part._add_objects([raw], SOURCE)
                known = (raw, part)
            seen[id(raw)] = known
            snapshot._merge(known[1])
        self._instances = seen

    # -- what is held ---------------------------------------------------------------------------------

    def count(self, kind: str) -> int:
        return len(self._entries.get(kind, ()))
