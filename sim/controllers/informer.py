"""One shared, in-process informer over the emulator store: a cache of every object the controllers
read, kept current from one store subscription.

Read-your-writes without "expectations": the store enqueues an event synchronously inside every
write made on the loop's thread, so `sync()` (drain the queued events into the cache) right before a
controller reconciles shows it everything written so far, its own creates and deletes included.
That is what keeps a ReplicaSet from creating the same replacement twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from sim.apiserver.errors import Gone
from sim.apiserver.store import DELETED, Store, Subscription, WatchEvent

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace or "", name)
Handler = Callable[[str, str, dict[str, Any] | None, dict[str, Any] | None], None]


def key_of(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


class Informer:
    """Caches `resources` (plural names) and tells handlers `(plural, type, new, old)` on each change.

    `new` is None for DELETED; `old` is the previously cached object (None when unseen). Handlers run
    synchronously inside `sync()`; they must be quick (mark work, do not write).
    """

    def __init__(self, store: Store, resources: Iterable[str]) -> None:
        self.store = store
        self.resources = tuple(resources)
        self.objects: dict[str, dict[Key, dict[str, Any]]] = {r: {} for r in self.resources}
        self._plural: dict[str, str] = {}
        self._handlers: list[Handler] = []
        self._sub: Subscription | None = None
        self.changed = asyncio.Event()

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    def start(self) -> None:
        """Subscribe (with the current state as ADDED events) and load the cache."""
        self._subscribe()
        self.sync()

    def _subscribe(self) -> None:
        if self._sub is not None:
            self._sub.close()
        for cache in self.objects.values():
            cache.clear()
        self._sub = self.store.subscribe(list(self.resources), initial=True)

    def stop(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    def sync(self) -> int:
        """Apply every queued event to the cache; returns how many."""
        if self._sub is None:
            return 0
        try:
            events = self._sub.pending()
            if self._sub.closed and self._sub.error is not None:
                raise self._sub.error
        except Gone:
            # We fell behind the store's window: start over from a full list, as an informer does.
            log.warning("informer fell behind; re-listing %s", ", ".join(self.resources))
            self._subscribe()
            events = self._sub.pending()
        for event in events:
            self._apply(event)
        return len(events)

    async def wait(self) -> None:
        """Until at least one event is queued; it is applied (call `sync()` for the rest)."""
        if self._sub is None:
            await self.changed.wait()
            return
        # No timeout here on purpose: on Python 3.11 `asyncio.wait_for` can drop an item that
        # arrives just as the timeout fires, and a lost event is a cache that never heals.
        try:
            event = await self._sub.__anext__()
        except Gone:
            self.sync()  # re-lists
            return
        except StopAsyncIteration:
            await asyncio.sleep(0.05)  # closed by stop(); the pump is being cancelled
            return
        self._apply(event)

    def _apply(self, event: WatchEvent) -> None:
        rt = event.resource
        plural = rt.plural
        cache = self.objects.get(plural)
        if cache is None:
            return
        key = (event.namespace, event.name)
        old = cache.get(key)
        if event.type == DELETED:
            cache.pop(key, None)
            new = None
        else:
            new = event.object
            cache[key] = new
        for handler in self._handlers:
            try:
                handler(plural, event.type, new, old)
            except Exception:
                log.exception("informer handler %r failed on %r", handler, event)
        self.changed.set()

    # --- reads --------------------------------------------------------------------------------------

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        return self.objects[plural].get((namespace, name))

    def items(self, plural: str) -> Iterable[dict[str, Any]]:
        return self.objects[plural].values()
