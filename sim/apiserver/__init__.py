"""A Kubernetes API emulator: the real REST protocol on loopback, backed by an in-process store.

- `Store` (store.py): the object store controllers call directly; its docstring is the API.
- `EmulatorServer` (runner.py): the HTTP server, in a background thread or in a running loop.
- `write_kubeconfig` (kubeconfig.py): a kubeconfig for kubectl and the official client.
"""

from __future__ import annotations

from typing import Any

from sim.apiserver.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    InternalError,
    Invalid,
    NotFound,
    TooManyRequests,
)
from sim.apiserver.store import ADDED, DELETED, MODIFIED, ObjectList, Store, Subscription, WatchEvent

__all__ = [
    "ADDED",
    "DELETED",
    "MODIFIED",
    "AlreadyExists",
    "ApiError",
    "BadRequest",
    "Conflict",
    "EmulatorServer",
    "Forbidden",
    "Gone",
    "InternalError",
    "Invalid",
    "NotFound",
    "ObjectList",
    "Store",
    "Subscription",
    "TooManyRequests",
    "WatchEvent",
    "write_kubeconfig",
]


def __getattr__(name: str) -> Any:
    # The HTTP side imports aiohttp; controllers that only need the store do not pay for it.
    if name == "EmulatorServer":
        from sim.apiserver.runner import EmulatorServer

        return EmulatorServer
    if name == "write_kubeconfig":
        from sim.apiserver.kubeconfig import write_kubeconfig

        return write_kubeconfig
    raise AttributeError(name)
