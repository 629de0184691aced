"""What EC2NodeClass drift costs a controller pass: describing the managed nodes' instances.

`activities/instance_descriptions.py` describes the instances a pass has not seen within its TTL
(200 ids per DescribeInstances call) and answers the rest from its cache. This prints the time of a
cold pass (every instance described) and of a warm one (all cached), against moto over HTTP, for a
few cluster sizes. Figures only; docs/launch.md quotes them.

    .venv/bin/python -m bench.bench_instance_descriptions [--sizes 100,1000,3000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import time

import boto3

from activities.instance_descriptions import InstanceDescriptions


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def measure(ec2, ids: list[str]) -> tuple[float, float]:
    descriptions = InstanceDescriptions(ec2, ttl_seconds=300)
    start = time.perf_counter()
    found, problem = await descriptions.describe(ids)
    cold = time.perf_counter() - start
    assert problem is None and len(found) == len(ids)
    start = time.perf_counter()
    await descriptions.describe(ids)
    warm = time.perf_counter() - start
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100,1000,3000")
    sizes = [int(s) for s in parser.parse_args().sizes.split(",")]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        ec2 = boto3.client(
            "ec2",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-west-2",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        ids: list[str] = []
        for size in sizes:
            while len(ids) < size:
                count = min(500, size - len(ids))
                launched = ec2.run_instances(ImageId=image, MinCount=count, MaxCount=count)["Instances"]
                ids += [i["InstanceId"] for i in launched]
            cold, warm = asyncio.run(measure(ec2, ids[:size]))
            print(f"{size:6d} instances   cold pass {cold * 1000:8.1f} ms   cached pass {warm * 1e3:7.2f} ms")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
