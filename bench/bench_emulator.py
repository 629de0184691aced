"""Kubernetes API emulator at cluster scale: prints figures, asserts nothing.

Starts the emulator as its own process (`python -m sim.apiserver`), loads N nodes and M pods
through `POST /sim/state`, then measures over HTTP:
  - listing every pod (one request, and kubectl-style pages of 500), and parsing it client-side;
  - listing one node's pods by `fieldSelector=spec.nodeName=...` (the index lookup);
  - create and strategic-merge-patch throughput with several concurrent clients;
  - the emulator process's memory (RSS) at that size.
Goals: all pods < 3 s, one node's pods < 50 ms, >= 500 writes/s.

    .venv/bin/python bench/bench_emulator.py [--nodes 5000] [--pods 100000] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import psutil
import urllib3

from api.constants import DEFAULT_POD_TOLERATIONS

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(i: int) -> dict:
    name = f"ip-10-{i // 250}-{i % 250}-1.ec2.internal"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "karpenter.sh/nodepool": "default",
                "karpenter.sh/capacity-type": "on-demand",
                "node.kubernetes.io/instance-type": "m5.2xlarge",
                "topology.kubernetes.io/zone": f"us-east-1{'abc'[i % 3]}",
            },
        },
        "spec": {"providerID": f"aws:///us-east-1a/i-{i:017x}"},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "58"},
            "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "58"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": "2025-01-01T00:00:00Z",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ],
            "addresses": [{"type": "InternalIP", "address": f"10.{i // 250}.{i % 250}.1"}],
        },
    }


def pod(i: int, node_name: str) -> dict:
    app = f"app-{i % 500}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{i:06d}",
            "namespace": f"team-{i % 20}",
            "resourceVersion": "1",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {"app": app, "pod-template-hash": "6d4cf56db6"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-6d4cf56db6",
                    "uid": "00000000-0000-0000-0000-000000000000",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "nodeName": node_name,
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example.com/{app}:1.2.3",
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "512Mi"},
                        "limits": {"memory": "512Mi"},
                    },
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "LOG_LEVEL", "value": "info"}],
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [dict(t) for t in DEFAULT_POD_TOLERATIONS],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.1.{(i // 250) % 250}.{i % 250}",
            "startTime": "2025-01-01T00:00:00Z",
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2025-01-01T00:00:00Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": "app",
                    "ready": True,
                    "restartCount": 0,
                    "image": "app:1.2.3",
                    "imageID": "sha256:0",
                    "started": True,
                    "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}},
                }
            ],
        },
    }


def build_ndjson(nodes: int, pods: int) -> tuple[bytes, list[str]]:
    """The cluster as NDJSON (one object per line), generated one object at a time."""
    lines: list[bytes] = []
    for ns in [f"team-{i}" for i in range(20)] + [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "bench",
    ]:
        lines.append(
            orjson.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns},
                    "spec": {"finalizers": ["kubernetes"]},
                    "status": {"phase": "Active"},
                }
            )
        )
    names = []
    for i in range(nodes):
        n = node(i)
        names.append(n["metadata"]["name"])
        lines.append(orjson.dumps(n))
    for i in range(pods):
        lines.append(orjson.dumps(pod(i, names[i % nodes])))
    return b"\n".join(lines), names


def timed(fn, repeat: int = 1) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


async def writes(url: str, clients: int, total: int) -> tuple[float, float]:
    """(creates/s, patches/s) with `clients` concurrent HTTP clients."""
    body = pod(0, "")
    body["metadata"] = {"name": "", "namespace": "bench", "labels": {"app": "bench"}}
    del body["status"]
    del body["spec"]["nodeName"]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:

        async def create_worker(k: int) -> None:
            for j in range(k, total, clients):
                doc = {**body, "metadata": {**body["metadata"], "name": f"w-{j:06d}"}}
                async with session.post(
                    f"{url}/api/v1/namespaces/bench/pods", data=orjson.dumps(doc), headers=headers
                ) as resp:
                    assert resp.status == 201, await resp.text()
                    await resp.read()

        async def patch_worker(k: int) -> None:
            patch_headers = {**headers, "Content-Type": "application/strategic-merge-patch+json"}
            for j in range(k, total, clients):
                patch = orjson.dumps({"metadata": {"labels": {"rev": str(j)}}})
                async with session.patch(
                    f"{url}/api/v1/namespaces/bench/pods/w-{j:06d}", data=patch, headers=patch_headers
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

        started = time.perf_counter()
        await asyncio.gather(*(create_worker(k) for k in range(clients)))
        creates = total / (time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.gather(*(patch_worker(k) for k in range(clients)))
        patches = total / (time.perf_counter() - started)
    return creates, patches


def main() -> None:
    # The bench process builds and parses millions of small containers; the cyclic GC would
    # rescan them over and over and distort the client-side figures. The emulator keeps its own GC.
    gc.disable()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--writes", type=int, default=4000)
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sim.apiserver", "--port", str(port), "--timescale", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    http = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5, read=300))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if http.request("GET", f"{url}/readyz").status == 200:
                    break
            except urllib3.exceptions.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("emulator did not start")
            time.sleep(0.1)
        emulator = psutil.Process(proc.pid)
        rss_empty = emulator.memory_info().rss

        build_s, (payload, node_names) = timed(lambda: build_ndjson(args.nodes, args.pods))
        load_s, resp = timed(
            lambda: http.request(
                "POST", f"{url}/sim/state", body=payload, headers={"Content-Type": "application/x-ndjson"}
            )
        )
        assert resp.status == 200, resp.data[:300]
        rss_loaded = emulator.memory_info().rss
        print(
            f"Loaded {args.nodes:,} nodes and {args.pods:,} pods ({len(payload) / 1e6:.0f} MB of NDJSON) "
            f"in {load_s:.1f} s through POST /sim/state (generated in {build_s:.1f} s)"
        )
        payload = b""  # free it before measuring

        print("\nReads over HTTP")
        all_s, resp = timed(lambda: http.request("GET", f"{url}/api/v1/pods"), repeat=3)
        body = resp.data
        parse_s, parsed = timed(lambda: orjson.loads(body))
        assert len(parsed["items"]) == args.pods
        print(
            f"  list all pods, one request:          {all_s:6.3f} s  ({len(body) / 1e6:.0f} MB, "
            f"+{parse_s:.3f} s to parse with orjson)   goal < 3 s"
        )
        body, parsed = b"", None

        def paged() -> int:
            count, token = 0, ""
            while True:
                r = http.request("GET", f"{url}/api/v1/pods", fields={"limit": "500", "continue": token})
                page = orjson.loads(r.data)
                count += len(page["items"])
                token = page["metadata"].get("continue")
                if not token:
                    return count

        paged_s, count = timed(paged)
        assert count == args.pods
        print(
            f"  list all pods, pages of 500 (kubectl): {paged_s:6.3f} s  "
            f"({args.pods // 500} requests, parsed)"
        )

        samples = []
        for name in node_names[:: max(1, len(node_names) // 200)]:
            started = time.perf_counter()
            r = http.request("GET", f"{url}/api/v1/pods", fields={"fieldSelector": f"spec.nodeName={name}"})
            samples.append(time.perf_counter() - started)
            assert r.status == 200 and len(orjson.loads(r.data)["items"]) == args.pods // args.nodes
        samples.sort()
        print(
            f"  one node's pods (fieldSelector):     median {statistics.median(samples) * 1000:.1f} ms, "
            f"p95 {samples[int(len(samples) * 0.95)] * 1000:.1f} ms, max {samples[-1] * 1000:.1f} ms "
            f"over {len(samples)} nodes   goal < 50 ms"
        )
        label_s, r = timed(
            lambda: http.request(
                "GET",
                f"{url}/api/v1/namespaces/team-3/pods",
                fields={"labelSelector": "app in (app-3,app-23)"},
            ),
            repeat=3,
        )
        print(
            f"  one namespace, label selector:       {label_s * 1000:6.1f} ms  "
            f"({len(orjson.loads(r.data)['items'])} pods)"
        )
        nodes_s, _ = timed(lambda: http.request("GET", f"{url}/api/v1/nodes"), repeat=3)
        print(f"  list all nodes:                      {nodes_s * 1000:6.1f} ms")

        print(f"\nWrites over HTTP ({args.clients} concurrent clients, {args.writes:,} each)")
        cpu_before = sum(emulator.cpu_times()[:2])
        creates, patches = asyncio.run(writes(url, args.clients, args.writes))
        cpu_ms = (sum(emulator.cpu_times()[:2]) - cpu_before) * 1000 / (2 * args.writes)
        print(f"  create pod:                  {creates:7.0f} /s   goal >= 500/s")
        print(f"  strategic-merge patch pod:   {patches:7.0f} /s   goal >= 500/s")
        print(
            f"  emulator CPU per write:      {cpu_ms:7.2f} ms  "
            f"(~{1000 / cpu_ms:.0f} writes/s per core it owns; "
            f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
        )

        rss_final = emulator.memory_info().rss
        print("\nEmulator memory (RSS)")
        objects = args.pods + args.nodes + args.writes
        print(
            f"  empty {rss_empty / 2**20:.0f} MiB; just after loading {rss_loaded / 2**20:.0f} MiB "
            f"(the load's transient buffers included); after the run {rss_final / 2**20:.0f} MiB, "
            f"~{(rss_final - rss_empty) / objects / 1024:.1f} KiB per object"
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    main()
