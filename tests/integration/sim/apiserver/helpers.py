"""HTTP and seeding helpers shared by the sync and aio client tests."""

from __future__ import annotations

import json
from typing import Any

import urllib3

from sim.apiserver import EmulatorServer

from . import builders as b

_http = urllib3.PoolManager()


def fresh(emu: EmulatorServer, time_scale: float) -> EmulatorServer:
    """The session's emulator emptied for the next test: no objects, faults or logged requests."""
    emu.store.reset()
    emu.store.timescale.factor = time_scale
    emu.store.watch_window = 20_000
    emu.faults.clear()
    emu.requests.clear()
    return emu


def http(emu: EmulatorServer, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
    """A raw request (no client-side checks): the status code and the decoded body."""
    data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    headers.setdefault("Content-Type", "application/json")
    resp = _http.request(method, emu.url + path, body=data, headers=headers)
    try:
        return resp.status, json.loads(resp.data)
    except ValueError:
        return resp.status, resp.data.decode()


def status_of(err: Any) -> dict[str, Any]:
    """The Status object of a client's ApiException (sync or aio)."""
    return json.loads(err.body)


def owned_pods(
    emu: EmulatorServer, rs_name: str, count: int, node_name: str = "n1", ready: int | None = None
) -> dict:
    """A ReplicaSet and `count` of its pods on `node_name`, Running (the first `ready` Ready)."""
    rs = emu.store.create("replicasets", b.replicaset(rs_name, replicas=count))
    for i in range(count):
        status = b.RUNNING_READY if ready is None or i < ready else b.RUNNING_UNREADY
        emu.store.create(
            "pods",
            {**b.pod(f"{rs_name}-{i}", node_name, app=rs_name, owner=rs), "status": status},
            keep_status=True,
        )
    return rs
