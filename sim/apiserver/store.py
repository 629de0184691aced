"""The emulator's object store: what etcd plus kube-apiserver's registry do, in process.

Controllers, the invariant checker and scenario seeding call this API directly (no HTTP); the
HTTP server (`server.py`) is a thin layer over the same calls, so both see one state.

Resources are named by plural, singular, Kind, short name or `plural.group` ("pods", "Pod",
"po", "deployments.apps", "nodeclaims"); see `resources.py`. Cluster-scoped resources take no
namespace; namespaced ones default to "default".

Reading (every call returns fresh dicts the caller may modify freely)::

    store.get("pods", "web-1", "default")                 -> dict            (NotFound)
    store.list("pods", namespace=None,                    -> ObjectList(items, resource_version,
               label_selector="app=web,tier in (a,b)",        continue_token, remaining_item_count)
               field_selector="spec.nodeName=n1", limit=500, continue_token=None)
    store.pods_on_node("n1")                              -> list[dict]   (index lookup, no scan)
    store.count("pods")  store.resource_version            (int, the global counter)
    store.get_raw(...) / store.list_raw(...)              the same as stored JSON bytes (no parse)

Writing (each returns the object as stored, with metadata filled)::

    store.create("pods", obj, namespace=None, keep_status=False)     (AlreadyExists, Invalid, NotFound ns)
    store.update("nodes", obj)             optimistic: Conflict if obj's resourceVersion is stale;
                                           status changes are ignored for types with /status
    store.update_status("nodes", obj)      only `status` is taken from obj (same rv check)
    store.patch("nodes", "n1", {"spec": {"unschedulable": True}}, patch_type="strategic"|"merge"|"json",
                subresource=None|"status")
    store.mutate("pods", "p", fn, namespace, subresource=None)  read-modify-write under the store lock:
                                           fn(obj) edits the dict in place (or returns a new one); no
                                           Conflict possible. Returns the stored object.
    store.delete("pods", "p", "default", grace_period_seconds=None, preconditions={"uid": ..,
                 "resourceVersion": ..}, propagation_policy="Background"|"Foreground"|"Orphan")
                 -> the object as it now stands: with metadata.deletionTimestamp if it lingers
                    (finalizers, or a pod on a node in its grace period), else its last state.
    store.delete_collection("pods", namespace, label_selector=..., field_selector=...) -> list[dict]
    store.bind("default", "p", "node-1")   the pods/binding subresource (what a scheduler calls)
    store.evict("default", "p", preconditions=None, dry_run=False)  the policy/v1 Eviction API,
                                           PDB aware (TooManyRequests 429, InternalError 500)

    Like kube-apiserver: create drops `status` for types with a status subresource (nodes keep
    theirs; `keep_status=True` keeps it for seeding); a pod's spec is immutable but for images,
    tolerations (additions), activeDeadlineSeconds and the grace period, so a scheduler binds with
    `bind()`, not by setting spec.nodeName; finalizers may not be added once deletion started; an
    update that changes nothing writes nothing (same resourceVersion, no event). `copy=False` hands
    the body over (no defensive copy) and `raw=True` returns stored bytes: what the HTTP layer uses.

Deletion semantics: an object with finalizers gets `deletionTimestamp` and stays until an update
empties its finalizers. A pod bound to a node with a grace period (DeleteOptions, else
spec.terminationGracePeriodSeconds, default 30) becomes Terminating and disappears once the grace
period — scaled by the store's `TimeScale` — has passed (at once with 0, or when not on a node).
Owner references are garbage collected as kube's GC does, synchronously: Background deletes
dependents whose owners are all gone, Foreground waits for dependents (foregroundDeletion
finalizer), Orphan strips the owner reference. Deleting a namespace deletes its content.

Watching::

    sub = store.subscribe("pods", namespace=None, since=None, initial=False,
                          label_selector=None, field_selector=None)   # needs a running event loop
    async for event in sub: ...      # event.type: ADDED | MODIFIED | DELETED
                                     # event.object (dict, private to this subscriber),
                                     # event.old_object (previous state, None for ADDED)
                                     # event.resource (ResourceType), event.resource_version (int)
    sub.pending() -> list[WatchEvent]  # what is queued, without waiting (an informer's sync)
    sub.closed, sub.error              # error is Gone when the subscriber fell 200k events behind,
                                       # or when reset()/load() replaced the state
    sub.close()
    resources=None subscribes to every resource. `since=rv` replays the kept history after rv
    (Gone if older than the window); `initial=True` starts with synthetic ADDED events for what
    exists (what `watch` without a resourceVersion does). With selectors, an update that makes an
    object match arrives as ADDED and one that makes it stop matching as DELETED (its last
    matching state), as from kube-apiserver.

    remove = store.add_listener(callback)  # callback(event) runs synchronously inside each write,
                                           # in write order (recorders, invariant checkers)

Errors are the typed exceptions of `sim.apiserver.errors` (NotFound, AlreadyExists, Conflict,
Invalid, BadRequest, Gone, TooManyRequests, Forbidden, InternalError); `err.status()` is the
Kubernetes Status object. All methods are thread-safe (one re-entrant lock); subscriptions deliver
to their own event loop thread-safely. Objects are kept serialized (orjson bytes), so a read never
aliases stored state and an HTTP list is a join of stored bytes.

Administration: `store.reset()`, `store.dump()` / `store.load(dump)` / `store.load_objects(objs)`
(bulk load as given, no events; like reset, it keeps the resourceVersion counter moving forward,
compacts the history so an older watch resume is 410 Gone, and ends open watches with 410 so
clients re-list), `store.attach_loop(loop)`
(where grace-period timers run; attached by the server), `store.process_due()` (finish grace
periods that have ended, also done lazily on every call).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import heapq
import itertools
import logging
import random
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

import orjson

from sim.apiserver import admission
from sim.apiserver.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    NotFound,
    invalid,
)
from sim.apiserver.patching import json_patch, merge_patch, strategic_merge_patch
from sim.apiserver.resources import ResourceType, UnknownResource, resolve
from sim.apiserver.selectors import (
    FieldSelector,
    Selector,
    parse_field_selector,
    parse_label_selector,
)
from sim.timescale import TimeScale

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
Key = tuple[str, str]  # (namespace or "", name)

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what kube's name generator uses


def now_rfc3339(at: datetime | None = None) -> str:
    """RFC 3339 at second precision, as metav1.Time serializes."""
    at = at or datetime.now(UTC)
    return f"{at.year:04d}-{at.month:02d}-{at.day:02d}T{at.hour:02d}:{at.minute:02d}:{at.second:02d}Z"


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(slots=True)
class _Entry:
    raw: bytes
    uid: str
    rv: int
    labels: dict[str, str]
    fields: dict[str, str]
    owners: tuple[str, ...]


@dataclass(slots=True)
class _Change:
    rv: int
    type: str
    resource: ResourceType
    namespace: str
    name: str
    raw: bytes
    old_raw: bytes | None
    labels: dict[str, str]
    fields: dict[str, str]
    # What selectors matched before a MODIFIED (None otherwise): a selected watch turns the
    # update into ADDED or DELETED when the object starts or stops matching.
    old_labels: dict[str, str] | None = None
    old_fields: dict[str, str] | None = None


class WatchEvent:
    """One change, as a subscriber sees it. `object` is parsed on first use and private to it.

    `previous=True` is the DELETED a selected watch sees when an update makes the object stop
    matching: kube-apiserver sends the last matching state, with the update's resourceVersion."""

    __slots__ = ("__dict__", "_change", "_raw", "type")

    def __init__(self, change: _Change, type_: str | None = None, *, previous: bool = False) -> None:
        self._change = change
        self.type = type_ or change.type
        self._raw = _with_resource_version(change.old_raw, change.rv) if previous and change.old_raw else None

    @property
    def resource(self) -> ResourceType:
        return self._change.resource

    @property
    def resource_version(self) -> int:
        return self._change.rv

    @property
    def namespace(self) -> str:
        return self._change.namespace

    @property
    def name(self) -> str:
        return self._change.name

    @property
    def raw(self) -> bytes:
        return self._change.raw if self._raw is None else self._raw

    @cached_property
    def object(self) -> dict[str, Any]:
        return orjson.loads(self.raw)

    @cached_property
    def old_object(self) -> dict[str, Any] | None:
        if self._change.old_raw is None or self.type == ADDED:
            return None
        return orjson.loads(self._change.old_raw)

    def __repr__(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"WatchEvent({self.type} {self.resource.plural} {ns}{self.name} rv={self.resource_version})"


def _with_resource_version(raw: bytes, rv: int) -> bytes:
    obj = orjson.loads(raw)
    obj["metadata"]["resourceVersion"] = str(rv)
    return orjson.dumps(obj)


@dataclass
class ObjectList:
    items: list[dict[str, Any]]
    resource_version: str
    continue_token: str | None = None
    remaining_item_count: int | None = None


@dataclass
class RawList:
    """A list as stored bytes, for the HTTP layer (no parse, no re-serialization)."""

    items: list[bytes]
    resource_version: str
    continue_token: str | None = None
    remaining_item_count: int | None = None


class Subscription:
    """An async iterator of WatchEvent for one subscriber; see `Store.subscribe`.

    Writers append to a thread-safe deque under the store lock and wake the subscriber's loop, so
    "nothing pending" checked under the lock means every change up to the store's resource
    version has been handed over (what watch bookmarks rely on).
    """

    def __init__(
        self,
        store: Store,
        resources: frozenset[ResourceType] | None,
        namespace: str | None,
        labels: Selector,
        fields: FieldSelector,
        loop: asyncio.AbstractEventLoop,
        max_queue: int,
    ) -> None:
        self._store = store
        self._resources = resources
        self._namespace = namespace
        self._labels = labels
        self._fields = fields
        self._loop = loop
        self._items: deque[WatchEvent] = deque()
        self._wakeup = asyncio.Event()
        self._max_queue = max_queue
        self._thread = threading.get_ident()
        self.closed = False
        self.error: ApiError | None = None

    def event_for(self, change: _Change) -> WatchEvent | None:
        """What this subscriber sees of `change`, None if nothing. With selectors, an update that
        makes the object match is ADDED and one that makes it stop matching is DELETED, as
        kube-apiserver's watch cache sends them."""
        if self._resources is not None and change.resource not in self._resources:
            return None
        if self._namespace is not None and change.namespace != self._namespace:
            return None
        if self._labels.empty and not self._fields.terms:
            return WatchEvent(change)
        matches = self._matches(change.labels, change.fields)
        if change.old_labels is None or change.old_fields is None:
            return WatchEvent(change) if matches else None
        matched = self._matches(change.old_labels, change.old_fields)
        if matches:
            return WatchEvent(change, None if matched else ADDED)
        return WatchEvent(change, DELETED, previous=True) if matched else None

    def _matches(self, labels: dict[str, str], fields: dict[str, str]) -> bool:
        if not self._labels.empty and not self._labels.matches(labels):
            return False
        return not self._fields.terms or self._fields.matches(fields)

    def _end(self, error: ApiError) -> None:
        """End the watch with `error` (after what is queued): the store's state was replaced."""
        if not self.closed:
            self.error = error
            self.closed = True
            self._wake()

    def _offer(self, event: WatchEvent) -> None:
        if self.closed:
            return
        if len(self._items) >= self._max_queue:
            # A consumer this far behind would hold the whole history: end its watch, as the
            # watch cache does, and let it re-list.
            self.error = Gone("watch consumer too slow; events dropped, re-list and watch again")
            self.closed = True
        else:
            self._items.append(event)
        self._wake()

    def _wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._wakeup.set()
        else:
            try:
                self._loop.call_soon_threadsafe(self._wakeup.set)
            except RuntimeError:  # loop closed
                self.closed = True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._store._unsubscribe(self)
            self._wake()

    def queued(self) -> int:
        """How many events wait to be read."""
        return len(self._items)

    def bookmark_version(self) -> int | None:
        """The store's resource version if this subscriber has consumed every change, else None."""
        with self._store._lock:
            return None if self._items else self._store.resource_version

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> WatchEvent:
        while True:
            if self._items:
                return self._items.popleft()
            if self.closed:
                if self.error is not None:
                    raise self.error
                raise StopAsyncIteration
            self._wakeup.clear()
            if self._items or self.closed:
                continue
            await self._wakeup.wait()

    async def get(self, wait: float | None = None) -> WatchEvent | None:
        """The next event, or None after `wait` seconds or when closed (then `error` says why)."""
        try:
            return await asyncio.wait_for(self.__anext__(), wait)
        except (TimeoutError, StopAsyncIteration):
            return None
        except ApiError:  # ended by the store (Gone): the caller reports `self.error`
            return None

    def pending(self) -> list[WatchEvent]:
        """Events already queued, without waiting."""
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store:
    """In-process Kubernetes object store. See the module docstring for the API."""

    def __init__(
        self,
        timescale: TimeScale | None = None,
        *,
        watch_window: int = 20_000,
        pdb_status: str = "inline",
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        """`watch_window`: how many changes are kept for watch resume (older → 410 Gone).
        `pdb_status`: "inline" recomputes a PDB's status from the pods at each eviction (no PDB
        controller needed); "controller" trusts the stored status, as kube-apiserver does.
        """
        if pdb_status not in ("inline", "controller"):
            raise ValueError(f"pdb_status must be 'inline' or 'controller', got {pdb_status!r}")
        self.timescale = timescale or TimeScale(1.0)
        self.watch_window = watch_window
        self.pdb_status = pdb_status
        self._clock = clock or (lambda: datetime.now(UTC))
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._subs: list[Subscription] = []
        self._listeners: list[Callable[[WatchEvent], None]] = []
        self._rv = 0
        self._init_state()

    def _init_state(self) -> None:
        """Empty the store. The resource version counter is kept: it never goes backwards."""
        self._objects: dict[ResourceType, dict[Key, _Entry]] = {}
        self._sorted: dict[ResourceType, list[Key]] = {}
        self._by_node: dict[str, set[Key]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, Key]]] = {}
        self._by_uid: dict[str, tuple[ResourceType, Key]] = {}
        self._log: deque[_Change] = deque()
        self._compacted_rv = self._rv
        self._graceful: list[tuple[float, int, ResourceType, Key, str]] = []
        self._seq = itertools.count()
        for ns in INITIAL_NAMESPACES:
            self.create("namespaces", {"metadata": {"name": ns}})

    # --- administration ----------------------------------------------------------------------------

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run grace-period timers on `loop` (the server does this; otherwise they run lazily)."""
        self._loop = loop

    def reset(self) -> None:
        """Forget every object. Listeners stay (they see no DELETED events); open watches end with
        410 Gone, so their clients re-list, as after an apiserver restart."""
        with self._lock:
            self._replace_state()
            self._init_state()

    def _replace_state(self) -> None:
        """Before the state is replaced: move the resource version past every version handed out
        (nothing listed before can be resumed: it is compacted) and end the open watches."""
        self._rv += 1
        subs, self._subs = self._subs, []
        for sub in subs:
            sub._end(Gone("the emulator's state was reset or reloaded; re-list and watch again"))

    def dump(self) -> dict[str, Any]:
        """Every object, by `plural[.group]`, plus the resource version counter."""
        with self._lock:
            self._reap()
            out: dict[str, Any] = {"resourceVersion": self._rv, "objects": {}}
            for rt, entries in self._objects.items():
                if entries:
                    out["objects"][rt.group_resource] = [
                        orjson.loads(e.raw) for _, e in sorted(entries.items())
                    ]
            return out

    def load(self, dump: dict[str, Any]) -> None:
        """Replace the state with a `dump()` (objects kept as they were, metadata included)."""
        objects = ((name, obj) for name, objs in (dump.get("objects") or {}).items() for obj in objs)
        self.load_objects(objects, resource_version=int(dump.get("resourceVersion", 0)))

    def load_objects(
        self,
        objects: Iterable[tuple[str | ResourceType, dict[str, Any]] | dict[str, Any]],
        *,
        resource_version: int = 0,
    ) -> int:
        """Replace the state with these objects, stored as given (no defaulting, no events): for
        loading a saved or generated cluster quickly. Items are `(resource, obj)` pairs or objects
        whose `kind` names the resource. Objects without a uid get one. Returns how many loaded."""
        count = 0
        with self._lock:
            self._replace_state()
            self._init_state()
            for item in objects:
                resource, obj = item if isinstance(item, tuple) else (item.get("kind", ""), item)
                rt = self._resolve(resource)
                meta = obj.setdefault("metadata", {})
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", now_rfc3339(self._clock()))
                if rt.namespaced:
                    meta.setdefault("namespace", "default")
                key = self._key(rt, meta.get("namespace"), meta["name"])
                old = self._objects.setdefault(rt, {}).pop(key, None)
                if old is not None:
                    self._unindex(rt, key, old)
                self._put(rt, key, obj, int(meta.get("resourceVersion") or 0))
                count += 1
            self._rv = max(
                self._rv,
                resource_version,
                *(e.rv for entries in self._objects.values() for e in entries.values()),
            )
            # Loaded objects come with no history: a watch resumes from now on, not before.
            self._log.clear()
            self._compacted_rv = self._rv
            self._sorted.clear()
        return count

    @property
    def resource_version(self) -> int:
        return self._rv

    def count(self, resource: str | ResourceType, namespace: str | None = None) -> int:
        rt = self._resolve(resource)
        with self._lock:
            entries = self._objects.get(rt, {})
            if namespace is None:
                return len(entries)
            return sum(1 for ns, _ in entries if ns == namespace)

    # --- reading ---------------------------------------------------------------------------------------

    def get(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> dict[str, Any]:
        rt = self._resolve(resource)
        with self._lock:
            self._reap()
            return orjson.loads(self._entry(rt, namespace, name).raw)

    def get_raw(self, resource: str | ResourceType, name: str, namespace: str | None = None) -> bytes:
        rt = self._resolve(resource)
        with self._lock:
            self._reap()
            return self._entry(rt, namespace, name).raw

    def list(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | Selector | None = None,
        field_selector: str | FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> ObjectList:
        raw = self.list_raw(
            resource,
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_token=continue_token,
        )
        return ObjectList(
            [orjson.loads(b) for b in raw.items],
            raw.resource_version,
            raw.continue_token,
            raw.remaining_item_count,
        )

    def list_raw(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | Selector | None = None,
        field_selector: str | FieldSelector | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> RawList:
        """Like `list`, with items as stored JSON bytes (what the HTTP layer sends)."""
        rt = self._resolve(resource)
        labels = self._label_selector(label_selector)
        fields = self._field_selector(rt, field_selector)
        if limit is not None and limit < 0:
            raise BadRequest(f"limit must be >= 0, got {limit}")
        with self._lock:
            self._reap()
            entries = self._objects.get(rt, {})
            list_rv = self._rv
            start: Key | None = None
            if continue_token:
                list_rv, start = self._decode_continue(continue_token)
            keys = self._candidate_keys(rt, namespace, fields)
            first = bisect.bisect_left(keys, start) if start is not None else 0
            filtered = not labels.empty or bool(fields.terms)
            out: list[bytes] = []
            token = remaining = None
            for index in range(first, len(keys)):
                e = entries.get(keys[index])
                if e is None:
                    continue
                if filtered and not (labels.matches(e.labels) and fields.matches(e.fields)):
                    continue
                if limit and len(out) >= limit:
                    token = self._encode_continue(list_rv, keys[index])
                    # Like kube-apiserver: a count only when it is cheap and exact (no selectors).
                    remaining = None if filtered else len(keys) - index
                    break
                out.append(e.raw)
            return RawList(out, str(list_rv), token, remaining)

    def pods_on_node(self, node_name: str) -> list[dict[str, Any]]:
        """Pods whose spec.nodeName is `node_name` ("" = unscheduled), from the index."""
        rt = resolve("pods")
        with self._lock:
            self._reap()
            entries = self._objects.get(rt, {})
            return [orjson.loads(entries[k].raw) for k in sorted(self._by_node.get(node_name, ()))]

    # --- writing ---------------------------------------------------------------------------------------

    def create(
        self,
        resource: str | ResourceType,
        obj: dict[str, Any],
        namespace: str | None = None,
        *,
        keep_status: bool = False,
        dry_run: bool = False,
        copy: bool = True,
        raw: bool = False,
    ) -> Any:
        """Create `obj`. `keep_status=True` keeps a given status even where kube-apiserver would
        drop it (pods, workloads, custom resources) — for seeding a scenario in one call.
        `copy=False` hands `obj` over to the store (it is modified; the HTTP layer passes bodies it
        just parsed); `raw=True` returns the stored JSON bytes instead of a dict."""
        rt = self._resolve(resource)
        if not isinstance(obj, dict):
            raise BadRequest(f"{rt.kind} body must be a JSON object")
        if copy:
            obj = _json_copy(rt, obj)  # never keep a reference to the caller's dicts
        self._check_type(rt, obj)
        self._check_decodes(rt, obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        ns = self._namespace_for(rt, namespace, meta)
        with self._lock:
            self._reap()
            if rt.namespaced:
                self._check_namespace_open(ns)
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(rt, ns, str(meta["generateName"]))
            name = meta.get("name") or ""
            if errs := admission.name_errors(rt, name):
                raise invalid(rt.kind, name, rt.group, errs)
            if not keep_status and not rt.keep_status_on_create and rt.has_status:
                obj.pop("status", None)
            admission.apply_defaults(rt, obj)
            admission.fill_zero_values(rt, obj)
            errs = admission.validate(rt, obj)
            if errs:
                raise invalid(rt.kind, name, rt.group, errs)
            key = self._key(rt, ns, name)
            if key in self._objects.get(rt, {}):
                raise AlreadyExists(
                    f'{rt.group_resource} "{name}" already exists', name=name, group=rt.group, kind=rt.plural
                )
            meta.pop("deletionTimestamp", None)
            meta.pop("deletionGracePeriodSeconds", None)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339(self._clock())
            if rt.generation:
                meta["generation"] = 1
            if dry_run:
                meta["resourceVersion"] = ""
                return orjson.dumps(obj) if raw else obj
            entry = self._build_entry(rt, obj, self._rv + 1)
            self._rv = entry.rv
            self._index(rt, key, entry)
            self._emit(rt, ADDED, key, entry, None)
            return entry.raw if raw else orjson.loads(entry.raw)

    def update(
        self,
        resource: str | ResourceType,
        obj: dict[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        copy: bool = True,
        raw: bool = False,
    ) -> Any:
        """Replace an object (PUT). Conflict when obj's resourceVersion is set and stale; status
        changes are ignored for types with a status subresource. `copy`/`raw` as for `create`."""
        return self._replace(resource, obj, namespace, status_only=False, dry_run=dry_run, copy=copy, raw=raw)

    def update_status(
        self,
        resource: str | ResourceType,
        obj: dict[str, Any],
        namespace: str | None = None,
        *,
        dry_run: bool = False,
        copy: bool = True,
        raw: bool = False,
    ) -> Any:
        """Replace only the status (PUT .../status); everything else in obj is ignored."""
        return self._replace(resource, obj, namespace, status_only=True, dry_run=dry_run, copy=copy, raw=raw)

    def patch(
        self,
        resource: str | ResourceType,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
        subresource: str | None = None,
        dry_run: bool = False,
        raw: bool = False,
    ) -> Any:
        """PATCH: `patch_type` "merge" (RFC 7386), "json" (RFC 6902) or "strategic".
        `raw=True` returns the stored JSON bytes instead of a dict."""
        rt = self._resolve(resource)
        self._check_subresource(rt, subresource)
        if patch_type == "strategic" and rt.custom:
            from sim.apiserver.errors import UnsupportedMediaType

            raise UnsupportedMediaType(
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            )
        with self._lock:
            self._reap()
            entry = self._entry(rt, namespace, name)
            current = orjson.loads(entry.raw)
            if patch_type == "merge":
                if not isinstance(patch, dict):
                    raise BadRequest("a merge patch must be a JSON object")
                patched = merge_patch(current, patch)
            elif patch_type == "json":
                patched = json_patch(current, patch)
            elif patch_type == "strategic":
                patched = strategic_merge_patch(current, patch, rt.merge_rules, copy=False)
            else:
                raise BadRequest(f"unknown patch type {patch_type!r}; use merge, json or strategic")
            if not isinstance(patched, dict):
                raise BadRequest("the patched object is not a JSON object")
            return self._replace(
                rt,
                patched,
                namespace,
                status_only=subresource == "status",
                dry_run=dry_run,
                expected_name=name,
                copy=False,  # `patched` was built from a fresh parse
                raw=raw,
            )

    def mutate(
        self,
        resource: str | ResourceType,
        name: str,
        fn: Callable[[dict[str, Any]], dict[str, Any] | None],
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """Atomic read-modify-write: `fn` edits the object in place or returns a replacement."""
        rt = self._resolve(resource)
        self._check_subresource(rt, subresource)
        with self._lock:
            self._reap()
            current = orjson.loads(self._entry(rt, namespace, name).raw)
            result = fn(current)
            new = current if result is None else result
            return self._replace(
                rt,
                new,
                namespace,
                status_only=subresource == "status",
                expected_name=name,
                copy=result is not None,
            )

    def delete(
        self,
        resource: str | ResourceType,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        preconditions: dict[str, Any] | None = None,
        propagation_policy: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        rt = self._resolve(resource)
        if propagation_policy not in (None, "Background", "Foreground", "Orphan"):
            raise BadRequest(
                f"propagationPolicy {propagation_policy!r} is not one of Background, Foreground, Orphan"
            )
        if grace_period_seconds is not None and grace_period_seconds < 0:
            grace_period_seconds = 0
        with self._lock:
            self._reap()
            key = self._key(rt, namespace, name)
            entry = self._entry(rt, namespace, name)
            obj = orjson.loads(entry.raw)
            self._check_preconditions(rt, name, obj, preconditions)
            if dry_run:
                return obj
            return self._delete(rt, key, obj, grace_period_seconds, propagation_policy)

    def delete_collection(
        self,
        resource: str | ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | Selector | None = None,
        field_selector: str | FieldSelector | None = None,
        grace_period_seconds: int | None = None,
        propagation_policy: str | None = None,
    ) -> list[dict[str, Any]]:
        rt = self._resolve(resource)
        with self._lock:
            items = self.list(
                rt, namespace, label_selector=label_selector, field_selector=field_selector
            ).items
            out = []
            for obj in items:
                meta = obj["metadata"]
                with contextlib.suppress(NotFound):
                    out.append(
                        self.delete(
                            rt,
                            meta["name"],
                            meta.get("namespace"),
                            grace_period_seconds=grace_period_seconds,
                            propagation_policy=propagation_policy,
                        )
                    )
            return out

    def bind(self, namespace: str, name: str, node_name: str) -> dict[str, Any]:
        """Assign a pod to a node (POST pods/{name}/binding). Conflict if already bound."""
        if not node_name:
            raise invalid("Binding", name, "", [("target.name", "FieldValueRequired", "Required value")])
        rt = resolve("pods")
        with self._lock:
            self._reap()
            pod = orjson.loads(self._entry(rt, namespace, name).raw)
            if pod["metadata"].get("deletionTimestamp"):
                raise Conflict(
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is being deleted, '
                    "cannot be assigned to a host",
                    name=name,
                    kind="pods/binding",
                )
            current = (pod.get("spec") or {}).get("nodeName")
            if current:
                raise Conflict(
                    f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                    f'assigned to node "{current}"',
                    name=name,
                    kind="pods/binding",
                )
            pod.setdefault("spec", {})["nodeName"] = node_name
            conds = [
                c
                for c in pod.setdefault("status", {}).get("conditions") or []
                if c.get("type") != "PodScheduled"
            ]
            conds.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now_rfc3339(self._clock()),
                }
            )
            pod["status"]["conditions"] = conds
            key = self._key(rt, namespace, name)
            return self._write(rt, key, pod, self._objects[rt][key])

    def evict(
        self,
        namespace: str,
        name: str,
        *,
        preconditions: dict[str, Any] | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """The Eviction API. Returns a Success Status; raises TooManyRequests (PDB), InternalError
        (more than one PDB), NotFound, Conflict (preconditions). See `eviction.py`."""
        from sim.apiserver.eviction import evict

        with self._lock:
            self._reap()
            return evict(
                self,
                namespace,
                name,
                preconditions=preconditions,
                grace_period_seconds=grace_period_seconds,
                dry_run=dry_run,
            )

    # --- subscriptions ---------------------------------------------------------------------------------

    def subscribe(
        self,
        resources: str | ResourceType | Iterable[str | ResourceType] | None = None,
        namespace: str | None = None,
        *,
        since: int | str | None = None,
        initial: bool = False,
        label_selector: str | Selector | None = None,
        field_selector: str | FieldSelector | None = None,
        max_queue: int = 200_000,
    ) -> Subscription:
        """Subscribe to changes; must be called from a running event loop (see module doc)."""
        loop = asyncio.get_running_loop()
        if resources is None:
            rts = None
        elif isinstance(resources, str | ResourceType):
            rts = frozenset([self._resolve(resources)])
        else:
            rts = frozenset(self._resolve(r) for r in resources)
        labels = self._label_selector(label_selector)
        fields = FieldSelector()
        if field_selector is not None:
            fields = (
                field_selector
                if isinstance(field_selector, FieldSelector)
                else parse_field_selector(field_selector)
            )
            for rt in rts or ():
                self._check_fields(rt, fields)
        sub = Subscription(self, rts, namespace, labels, fields, loop, max_queue)
        with self._lock:
            self._reap()
            if since not in (None, "", "0", 0):
                since_rv = self._parse_rv(since)
                if since_rv < self._compacted_rv:
                    raise Gone(f"too old resource version: {since_rv} ({self._compacted_rv + 1})")
                for change in self._log:
                    if change.rv > since_rv and (event := sub.event_for(change)) is not None:
                        sub._offer(event)
            elif initial:
                for rt in sorted(rts or self._objects.keys(), key=lambda r: r.group_resource):
                    for key in self._sorted_keys(rt):
                        e = self._objects[rt][key]
                        change = _Change(e.rv, ADDED, rt, key[0], key[1], e.raw, None, e.labels, e.fields)
                        if (event := sub.event_for(change)) is not None:
                            sub._offer(event)
            self._subs.append(sub)
        return sub

    def add_listener(self, callback: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Call `callback(event)` synchronously on every change; returns a function that removes it."""
        with self._lock:
            self._listeners.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return remove

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    # --- grace periods ---------------------------------------------------------------------------------

    def process_due(self) -> int:
        """Finish every graceful deletion whose (scaled) grace period has ended; returns how many."""
        with self._lock:
            return self._reap()

    def _reap(self) -> int:
        done = 0
        now = time.monotonic()
        while self._graceful and self._graceful[0][0] <= now:
            _, _, rt, key, uid = heapq.heappop(self._graceful)
            entry = self._objects.get(rt, {}).get(key)
            if entry is None or entry.uid != uid:
                continue
            obj = orjson.loads(entry.raw)
            obj["metadata"]["deletionGracePeriodSeconds"] = 0
            if obj["metadata"].get("finalizers"):
                self._write(rt, key, obj, entry)  # the kubelet is done; finalizers still hold it
            else:
                self._remove(rt, key, obj)
            done += 1
        return done

    def _schedule_reap(self, delay: float) -> None:
        loop = self._loop
        if loop is None:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop: reaped lazily by the next call
        if loop.is_closed():
            return

        def arm() -> None:
            loop.call_later(delay + 0.001, self.process_due)

        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is loop:
                arm()
            else:
                loop.call_soon_threadsafe(arm)
        except RuntimeError:
            pass  # loop closed: reaped lazily

    # --- internals: deletion ---------------------------------------------------------------------------

    def _delete(
        self, rt: ResourceType, key: Key, obj: dict[str, Any], grace: int | None, propagation: str | None
    ) -> dict[str, Any]:
        meta = obj["metadata"]
        entry = self._objects[rt][key]
        if rt.kind == "Namespace":
            return self._delete_namespace(key, obj)
        now = self._clock()
        finalizers = list(meta.get("finalizers") or [])
        policy = propagation or "Background"
        if (
            policy == "Foreground"
            and "foregroundDeletion" not in finalizers
            and self._dependents.get(entry.uid)
        ):
            finalizers.append("foregroundDeletion")
        if policy == "Orphan" and "orphan" not in finalizers and self._dependents.get(entry.uid):
            finalizers.append("orphan")
        graceful = False
        if rt.kind == "Pod" and (obj.get("spec") or {}).get("nodeName"):
            if grace is None:
                grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30) or 0)
            phase = (obj.get("status") or {}).get("phase")
            graceful = grace > 0 and phase not in ("Succeeded", "Failed")
        if meta.get("deletionTimestamp"):
            # Already terminating: a second delete may only shorten the grace period.
            if graceful and grace is not None and grace < int(meta.get("deletionGracePeriodSeconds") or 0):
                meta["deletionGracePeriodSeconds"] = grace
                meta["deletionTimestamp"] = now_rfc3339(now + timedelta(seconds=grace))
                obj = orjson.loads(self._write(rt, key, obj, entry, raw_only=True))
                self._arm_grace(rt, key, entry.uid, grace)
            elif rt.kind == "Pod" and grace == 0 and not meta.get("finalizers"):
                self._remove(rt, key, obj)
            return obj
        if not finalizers and not graceful:
            self._remove(rt, key, obj)
            return obj
        meta["finalizers"] = finalizers
        if graceful:
            meta["deletionTimestamp"] = now_rfc3339(now + timedelta(seconds=grace or 0))
            meta["deletionGracePeriodSeconds"] = grace
        else:
            meta["deletionTimestamp"] = now_rfc3339(now)
            meta["deletionGracePeriodSeconds"] = 0
        if rt.generation:
            meta["generation"] = int(meta.get("generation") or 0) + 1
        stored = self._write(rt, key, obj, entry, raw_only=True)
        if graceful:
            self._arm_grace(rt, key, entry.uid, grace or 0)
        self._run_gc_finalizers(rt, key)
        entry = self._objects.get(rt, {}).get(key)
        return orjson.loads(entry.raw if entry else stored)

    def _arm_grace(self, rt: ResourceType, key: Key, uid: str, grace: int) -> None:
        delay = self.timescale.seconds(grace)
        heapq.heappush(self._graceful, (time.monotonic() + delay, next(self._seq), rt, key, uid))
        if delay <= 0:
            self._reap()
        else:
            self._schedule_reap(delay)

    def _remove(self, rt: ResourceType, key: Key, obj: dict[str, Any]) -> None:
        """Drop the object for good: DELETED event, indexes, then garbage collection."""
        entry = self._objects[rt].pop(key)
        self._sorted.pop(rt, None)
        self._unindex(rt, key, entry)
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        raw = orjson.dumps(obj)
        self._publish(_Change(rv, DELETED, rt, key[0], key[1], raw, entry.raw, entry.labels, entry.fields))
        self._collect_dependents(entry.uid)
        for owner_uid in entry.owners:
            self._maybe_finish_foreground(owner_uid)
        if key[0] and rt.kind != "Namespace":
            self._maybe_finish_namespace(key[0])

    def _collect_dependents(self, owner_uid: str) -> None:
        """Background GC: dependents with no owner left are deleted; others lose the reference."""
        for drt, dkey in sorted(self._dependents.pop(owner_uid, set()), key=lambda d: (d[0].plural, d[1])):
            entry = self._objects.get(drt, {}).get(dkey)
            if entry is None:
                continue
            obj = orjson.loads(entry.raw)
            remaining = [o for o in obj["metadata"].get("ownerReferences") or [] if o.get("uid") != owner_uid]
            if any(o.get("uid") in self._by_uid for o in remaining):
                _set_owner_refs(obj, remaining)
                self._write(drt, dkey, obj, entry)
            elif not obj["metadata"].get("deletionTimestamp"):
                self._delete(drt, dkey, obj, None, "Background")

    def _run_gc_finalizers(self, rt: ResourceType, key: Key) -> None:
        entry = self._objects.get(rt, {}).get(key)
        if entry is None:
            return
        obj = orjson.loads(entry.raw)
        finalizers = obj["metadata"].get("finalizers") or []
        if "orphan" in finalizers:
            for drt, dkey in list(self._dependents.pop(entry.uid, set())):
                dentry = self._objects.get(drt, {}).get(dkey)
                if dentry is None:
                    continue
                dobj = orjson.loads(dentry.raw)
                _set_owner_refs(dobj, [o for o in _owner_refs(dobj) if o.get("uid") != entry.uid])
                self._write(drt, dkey, dobj, dentry)
            self._drop_finalizer(rt, key, "orphan")
        elif "foregroundDeletion" in finalizers:
            for drt, dkey in sorted(
                self._dependents.get(entry.uid, set()), key=lambda d: (d[0].plural, d[1])
            ):
                dentry = self._objects.get(drt, {}).get(dkey)
                if dentry is None:
                    continue
                dobj = orjson.loads(dentry.raw)
                if not dobj["metadata"].get("deletionTimestamp"):
                    self._delete(drt, dkey, dobj, None, "Foreground")
            self._maybe_finish_foreground(entry.uid)

    def _maybe_finish_foreground(self, owner_uid: str) -> None:
        where = self._by_uid.get(owner_uid)
        if where is None:
            return
        rt, key = where
        entry = self._objects[rt][key]
        if not self._dependents.get(owner_uid) and b"foregroundDeletion" in entry.raw:
            obj = orjson.loads(entry.raw)
            if "foregroundDeletion" in (obj["metadata"].get("finalizers") or []) and obj["metadata"].get(
                "deletionTimestamp"
            ):
                self._drop_finalizer(rt, key, "foregroundDeletion")

    def _drop_finalizer(self, rt: ResourceType, key: Key, finalizer: str) -> None:
        entry = self._objects[rt][key]
        obj = orjson.loads(entry.raw)
        obj["metadata"]["finalizers"] = [f for f in obj["metadata"].get("finalizers") or [] if f != finalizer]
        self._write(rt, key, obj, entry)
        self._finish_if_released(rt, key)

    def _finish_if_released(self, rt: ResourceType, key: Key) -> None:
        """Remove an object being deleted once no finalizer and no grace period holds it."""
        entry = self._objects.get(rt, {}).get(key)
        if entry is None:
            return
        obj = orjson.loads(entry.raw)
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return
        if any(g[3] == key and g[4] == entry.uid for g in self._graceful):
            return
        self._remove(rt, key, obj)

    def _delete_namespace(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        rt = resolve("namespaces")
        ns = key[1]
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp"):
            meta["deletionTimestamp"] = now_rfc3339(self._clock())
            meta["deletionGracePeriodSeconds"] = 0
            obj.setdefault("status", {})["phase"] = "Terminating"
            self._write(rt, key, obj, self._objects[rt][key])
            for crt, entries in list(self._objects.items()):
                if not crt.namespaced:
                    continue
                for ckey in [k for k in self._sorted_keys(crt) if k[0] == ns]:
                    centry = entries.get(ckey)
                    if centry is not None:
                        cobj = orjson.loads(centry.raw)
                        if not cobj["metadata"].get("deletionTimestamp"):
                            self._delete(crt, ckey, cobj, None, "Background")
        self._maybe_finish_namespace(ns)
        entry = self._objects.get(rt, {}).get(key)
        return orjson.loads(entry.raw) if entry else obj

    def _maybe_finish_namespace(self, ns: str) -> None:
        rt = resolve("namespaces")
        key = ("", ns)
        entry = self._objects.get(rt, {}).get(key)
        if entry is None:
            return
        obj = orjson.loads(entry.raw)
        if not obj["metadata"].get("deletionTimestamp"):
            return
        for crt, entries in self._objects.items():
            if crt.namespaced and any(k[0] == ns for k in entries):
                return
        if not obj["metadata"].get("finalizers"):
            self._remove(rt, key, obj)

    # --- internals: writing ----------------------------------------------------------------------------

    def _replace(
        self,
        resource: str | ResourceType,
        obj: dict[str, Any],
        namespace: str | None,
        *,
        status_only: bool,
        dry_run: bool = False,
        expected_name: str | None = None,
        copy: bool = True,
        raw: bool = False,
    ) -> Any:
        rt = self._resolve(resource)
        if not isinstance(obj, dict):
            raise BadRequest(f"{rt.kind} body must be a JSON object")
        if copy:
            obj = _json_copy(rt, obj)
        self._check_type(rt, obj)
        self._check_decodes(rt, obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            raise BadRequest(f"{rt.kind}: metadata is required")
        name = meta.get("name") or expected_name or ""
        if expected_name is not None and meta.get("name") not in (None, expected_name):
            raise BadRequest("the name of the object does not match the name on the URL")
        ns = self._namespace_for(rt, namespace, meta)
        with self._lock:
            self._reap()
            key = self._key(rt, ns, name)
            entry = self._entry(rt, ns, name)
            old = orjson.loads(entry.raw)
            old_meta = old["metadata"]
            rv = meta.get("resourceVersion")
            if rv not in (None, "") and str(rv) != old_meta["resourceVersion"]:
                raise Conflict(
                    f'Operation cannot be fulfilled on {rt.group_resource} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                    name=name,
                    group=rt.group,
                    kind=rt.plural,
                )
            uid = meta.get("uid")
            if uid not in (None, "") and uid != old_meta["uid"]:
                raise Conflict(
                    f'Operation cannot be fulfilled on {rt.group_resource} "{name}": Precondition failed: '
                    f"UID in precondition: {uid}, UID in object meta: {old_meta['uid']}",
                    name=name,
                    group=rt.group,
                    kind=rt.plural,
                )
            if status_only:
                new = orjson.loads(entry.raw)
                new["status"] = obj.get("status")
                if new["status"] is None:
                    new.pop("status")
                new_meta = new["metadata"]
            else:
                new = obj
                if rt.has_status:
                    if "status" in old:
                        new["status"] = old["status"]
                    else:
                        new.pop("status", None)
                new_meta = meta
                for field in (
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ):
                    if field in old_meta:
                        new_meta[field] = old_meta[field]
                    else:
                        new_meta.pop(field, None)
                new_meta["name"] = old_meta["name"]
                if rt.namespaced:
                    new_meta["namespace"] = old_meta["namespace"]
            new_meta["resourceVersion"] = old_meta["resourceVersion"]
            admission.fill_zero_values(rt, new)
            errs = admission.validate(rt, new, old)
            if errs:
                raise invalid(rt.kind, name, rt.group, errs)
            if rt.generation and _spec_of(new) != _spec_of(old):
                new_meta["generation"] = int(old_meta.get("generation") or 0) + 1
            if new == old:
                return entry.raw if raw else old  # no change, no write, same resourceVersion
            if dry_run:
                return orjson.dumps(new) if raw else new
            stored = self._write(rt, key, new, entry, raw_only=True)
            if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
                self._finish_if_released(rt, key)
            elif new_meta.get("deletionTimestamp") and "foregroundDeletion" in new_meta["finalizers"]:
                self._maybe_finish_foreground(entry.uid)
            return stored if raw else orjson.loads(stored)

    def _write(
        self, rt: ResourceType, key: Key, obj: dict[str, Any], old: _Entry, *, raw_only: bool = False
    ) -> Any:
        """Store a new version of an existing object and publish MODIFIED. Returns the new object
        (or its bytes with raw_only)."""
        # Everything that can fail (serializing, reading selectable fields) happens before the
        # indexes change: a write that raises leaves the store as it was.
        entry = self._build_entry(rt, obj, self._rv + 1)
        self._rv = entry.rv
        self._unindex(rt, key, old)
        self._index(rt, key, entry)
        self._emit(rt, MODIFIED, key, entry, old)
        return entry.raw if raw_only else orjson.loads(entry.raw)

    def _put(self, rt: ResourceType, key: Key, obj: dict[str, Any], rv: int) -> _Entry:
        entry = self._build_entry(rt, obj, rv)
        self._index(rt, key, entry)
        return entry

    def _build_entry(self, rt: ResourceType, obj: dict[str, Any], rv: int) -> _Entry:
        """The stored form of `obj` at `rv`; touches no index (it may raise on a malformed body)."""
        meta = obj["metadata"]
        meta["resourceVersion"] = str(rv)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        # Keep apiVersion/kind first, metadata next: it is how kube serializes and how people read.
        ordered = {"apiVersion": rt.api_version, "kind": rt.kind, "metadata": meta}
        ordered.update(obj)
        owners = tuple(o.get("uid", "") for o in meta.get("ownerReferences") or [] if isinstance(o, dict))
        labels = meta.get("labels") or {}
        return _Entry(
            # orjson hands back bytes in a 4 KiB allocation; an exact-size copy keeps 100k pods
            # at ~1.6 KiB each instead of 4 KiB.
            bytes(memoryview(orjson.dumps(ordered))),
            meta["uid"],
            rv,
            # Interned: 100k pods share a handful of label keys and values.
            {sys.intern(str(k)): sys.intern(str(v)) for k, v in labels.items()}
            if isinstance(labels, dict)
            else {},
            rt.selectable_fields(obj),
            owners,
        )

    def _index(self, rt: ResourceType, key: Key, entry: _Entry) -> None:
        bucket = self._objects.setdefault(rt, {})
        if key not in bucket:
            self._sorted.pop(rt, None)
        bucket[key] = entry
        self._by_uid[entry.uid] = (rt, key)
        for owner in entry.owners:
            self._dependents.setdefault(owner, set()).add((rt, key))
        if rt.kind == "Pod":
            self._by_node.setdefault(entry.fields.get("spec.nodeName", ""), set()).add(key)

    def _unindex(self, rt: ResourceType, key: Key, entry: _Entry) -> None:
        if self._by_uid.get(entry.uid) == (rt, key) and key not in self._objects.get(rt, {}):
            del self._by_uid[entry.uid]
        for owner in entry.owners:
            deps = self._dependents.get(owner)
            if deps is not None:
                deps.discard((rt, key))
                if not deps:
                    del self._dependents[owner]
        if rt.kind == "Pod":
            node = entry.fields.get("spec.nodeName", "")
            keys = self._by_node.get(node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_node[node]

    def _emit(self, rt: ResourceType, type_: str, key: Key, entry: _Entry, old: _Entry | None) -> None:
        change = _Change(entry.rv, type_, rt, key[0], key[1], entry.raw, None, entry.labels, entry.fields)
        if old is not None:
            change.old_raw, change.old_labels, change.old_fields = old.raw, old.labels, old.fields
        self._publish(change)

    def _publish(self, change: _Change) -> None:
        self._log.append(change)
        while len(self._log) > self.watch_window:
            self._compacted_rv = self._log.popleft().rv
        for sub in list(self._subs):
            if sub.closed:
                self._subs.remove(sub)
            elif (event := sub.event_for(change)) is not None:
                sub._offer(event)
        for listener in list(self._listeners):
            try:
                listener(WatchEvent(change))
            except Exception:  # a recorder's bug must not fail the write that triggered it
                log.exception("store listener %r failed on %s", listener, change.type)

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    # --- internals: helpers ----------------------------------------------------------------------------

    def _resolve(self, resource: str | ResourceType) -> ResourceType:
        try:
            return resolve(resource)
        except UnknownResource as err:
            raise NotFound(str(err)) from None

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return ((namespace or "default") if rt.namespaced else "", name)

    def _entry(self, rt: ResourceType, namespace: str | None, name: str) -> _Entry:
        entry = self._objects.get(rt, {}).get(self._key(rt, namespace, name))
        if entry is None:
            raise NotFound(
                f'{rt.group_resource} "{name}" not found', name=name, group=rt.group, kind=rt.plural
            )
        return entry

    def _namespace_for(self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> str:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return ""
        body_ns = meta.get("namespace")
        if namespace and body_ns and body_ns != namespace:
            raise BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        ns = namespace or body_ns or "default"
        meta["namespace"] = ns
        return ns

    def _check_namespace_open(self, ns: str) -> None:
        entry = self._objects.get(resolve("namespaces"), {}).get(("", ns))
        if entry is None:
            raise NotFound(f'namespaces "{ns}" not found', name=ns, kind="namespaces")
        if b'"deletionTimestamp"' in entry.raw:
            raise Forbidden(
                f"unable to create new content in namespace {ns} because it is being terminated",
                name=ns,
                kind="namespaces",
            )

    def _check_type(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind not in (None, "", rt.kind):
            raise BadRequest(f"the kind in the body ({kind}) does not match the expected kind ({rt.kind})")
        if api_version not in (None, "", rt.api_version):
            raise BadRequest(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version})"
            )

    @staticmethod
    def _check_decodes(rt: ResourceType, obj: dict[str, Any]) -> None:
        # Wrong JSON types are refused before any code reads them: a 400/422, never a crash.
        if (err := admission.decode_error(rt, obj)) is not None:
            raise err

    def _check_subresource(self, rt: ResourceType, subresource: str | None) -> None:
        if subresource not in (None, "") and subresource not in rt.subresources:
            raise NotFound(f"the server could not find the requested resource ({rt.plural}/{subresource})")
        if subresource == "status" and not rt.has_status:
            raise NotFound(f"{rt.plural} have no status subresource")

    def _check_preconditions(
        self, rt: ResourceType, name: str, obj: dict[str, Any], pre: dict[str, Any] | None
    ) -> None:
        if not pre:
            return
        meta = obj["metadata"]
        uid, rv = pre.get("uid"), pre.get("resourceVersion")
        if uid and uid != meta["uid"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {rt.group_resource} "{name}": Precondition failed: '
                f"UID in precondition: {uid}, UID in object meta: {meta['uid']}",
                name=name,
                group=rt.group,
                kind=rt.plural,
            )
        if rv and str(rv) != meta["resourceVersion"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {rt.group_resource} "{name}": Precondition failed: '
                f"ResourceVersion in precondition: {rv}, "
                f"ResourceVersion in object meta: {meta['resourceVersion']}",
                name=name,
                group=rt.group,
                kind=rt.plural,
            )

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        bucket = self._objects.get(rt, {})
        for _ in range(16):
            name = prefix[:58] + "".join(random.choices(_GENERATE_CHARS, k=5))
            if (ns, name) not in bucket:
                return name
        raise AlreadyExists(f"could not generate a unique name from {prefix!r}")

    def _sorted_keys(self, rt: ResourceType) -> list[Key]:
        keys = self._sorted.get(rt)
        if keys is None:
            keys = self._sorted[rt] = sorted(self._objects.get(rt, {}))
        return keys

    def _candidate_keys(self, rt: ResourceType, namespace: str | None, fields: FieldSelector) -> list[Key]:
        """The sorted keys that can match: an index lookup for a pinned node or name, else the
        namespace's slice of the sorted keys."""
        node = fields.equals("spec.nodeName") if rt.kind == "Pod" else None
        name = fields.equals("metadata.name")
        if node is not None:
            keys: list[Key] = sorted(self._by_node.get(node, ()))
            if namespace is not None:
                keys = [k for k in keys if k[0] == namespace]
            return keys
        if name is not None:
            if namespace is not None or not rt.namespaced:
                return [self._key(rt, namespace, name)]
            return [k for k in self._sorted_keys(rt) if k[1] == name]
        keys = self._sorted_keys(rt)
        if namespace is not None and rt.namespaced:
            lo = bisect.bisect_left(keys, (namespace, ""))
            hi = bisect.bisect_left(keys, (namespace + "\x00", ""))
            keys = keys[lo:hi]
        return keys

    def _label_selector(self, selector: str | Selector | None) -> Selector:
        if isinstance(selector, Selector):
            return selector
        return parse_label_selector(selector)

    def _field_selector(self, rt: ResourceType, selector: str | FieldSelector | None) -> FieldSelector:
        fields = selector if isinstance(selector, FieldSelector) else parse_field_selector(selector)
        self._check_fields(rt, fields)
        return fields

    def _check_fields(self, rt: ResourceType, fields: FieldSelector) -> None:
        supported = rt.field_names
        for f in fields.fields:
            if f not in supported:
                raise BadRequest(
                    f'"{f}" is not a known field selector: only "{", ".join(sorted(supported))}"'
                )

    @staticmethod
    def _parse_rv(rv: int | str) -> int:
        try:
            return int(rv)
        except (TypeError, ValueError):
            raise BadRequest(f"invalid resource version {rv!r}") from None

    def _encode_continue(self, rv: int, key: Key) -> str:
        payload = orjson.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{key[0]}/{key[1]}"})
        return base64.urlsafe_b64encode(payload).decode()

    def _decode_continue(self, token: str) -> tuple[int, Key]:
        try:
            data = orjson.loads(base64.urlsafe_b64decode(token.encode() + b"=="))
            ns, _, name = str(data["start"]).partition("/")
            rv = int(data["rv"])
        except Exception:
            raise BadRequest("continue key is not valid: invalid continue token") from None
        if rv < self._compacted_rv:
            raise Gone(
                "The provided continue parameter is too old to display a consistent list result. You can "
                "start a new list without the continue parameter."
            )
        return rv, (ns, name)


def _json_copy(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    try:
        return orjson.loads(orjson.dumps(obj))
    except TypeError as err:  # a Python caller's non-JSON value (an int key, a set): not storable
        raise BadRequest(f"{rt.kind} body is not JSON: {err}") from None


def _owner_refs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return list(obj["metadata"].get("ownerReferences") or [])


def _set_owner_refs(obj: dict[str, Any], refs: list[dict[str, Any]]) -> None:
    if refs:
        obj["metadata"]["ownerReferences"] = refs
    else:
        obj["metadata"].pop("ownerReferences", None)  # kube omits empty lists


def _spec_of(obj: dict[str, Any]) -> Any:
    """What a generation bump tracks: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "ApiError",
    "ObjectList",
    "RawList",
    "Store",
    "Subscription",
    "WatchEvent",
    "now_rfc3339",
    "parse_time",
]
