"""The karpflow worker: one process that runs every workflow and activity on one task queue.

    karpflow worker --cluster-name prod --temporal-address temporal.example:7233 \\
        --kubeconfig ~/.kube/config --aws-region us-west-2

Every flag has an environment variable (`KARPFLOW_<FLAG>`, e.g. KARPFLOW_CLUSTER_NAME); flags win
(runtime/settings.py). What the process does:

- connects to Temporal (plain, TLS with a client certificate, or an API key as on Temporal
  Cloud) with the pydantic data converter, and OpenTelemetry tracing when an exporter is chosen
  (runtime/connections.py, runtime/telemetry.py);
- registers the search attributes the workflows upsert (skipped where the operator API is not
  available, e.g. Temporal Cloud: register them there once);
- talks to Kubernetes through a kubeconfig, in-cluster configuration or a plain API server URL,
  and to EC2 through the standard AWS credential chain, with an endpoint override for moto;
- runs the workflows and activities listed below (an explicit list, as in Temporal's samples);
- watches for deleted nodes carrying karpflow's finalizer and starts their termination
  (cluster/node_deletions.py);
- beside Karpenter (--karpenter-coexistence) requests replacements as NodeClaims, hands the nodes
  Karpenter's termination controller acts on to it, and taints `karpflow.dev/disrupted`
  (activities/nodeclaims.py, docs/running-beside-karpenter.md);
- keeps the cluster's ControllerWorkflow running: starts it at start-up and checks every
  --controller-supervise-interval seconds, starting it again if it failed or was terminated (one an
  operator stopped stays stopped; runtime/controller_start.py);
- logs an expected activity failure (a guard's refusal, a capacity error) as one line with its
  cause, not a traceback (runtime/failure_log.py);
- serves /healthz (liveness) and /readyz (readiness, red with its reasons while the cluster cache is
  unsynced or stale) for Kubernetes probes (runtime/health.py);
- on SIGTERM stops polling, lets running activities finish (up to --graceful-shutdown seconds),
  and exits; a long drain that does not finish is resumed by another worker from its heartbeat.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import click
from kubernetes.aio.config import incluster_config
from pydantic import ValidationError
from temporalio.client import Client
from temporalio.worker import Interceptor, PollerBehaviorAutoscaling, Worker

from activities.capacity_reservations import CapacityReservationReader
from activities.cluster_endpoint import ClusterEndpoint
from activities.controls_gate import ControlsGate
from activities.ec2 import EC2Activities
from activities.events import EventActivities
from activities.garbage_collection import GarbageCollector
from activities.instance_descriptions import InstanceDescriptions
from activities.kubernetes import KubernetesActivities
from activities.nodeclaims import NodeClaimActivities
from activities.notifications import NotificationActivities
from activities.planning import PlanningActivities
from activities.rollout import RolloutActivities
from activities.rollout_health import RolloutHealthActivities
from activities.waiting_commands import WaitingCommandActivities
from api.workflow_ids import controller_workflow_id
from cluster.heap import HeapFreezer
from cluster.informer import ClusterCache
from cluster.interruption import InterruptionPoller
from cluster.node_deletions import NodeDeletionWatcher
from cluster.reads import ClusterReads
from kube.client import KubeApi
from kube.events import recorder_for
from runtime.connections import (
    TemporalUnreachable,
    aws_client,
    connect_kubernetes,
    connect_temporal_patiently,
    ec2_client,
    ensure_search_attributes,
    sqs_client,
)
from runtime.controller_start import ensure_controller, supervise_controller
from runtime.failure_log import ExpectedFailureLog
from runtime.health import HealthServer
from runtime.permission_log import PermissionDeniedLog
from runtime.settings import WorkerSettings, explain, plan_options, settings_options, unknown_variables
from runtime.telemetry import configure_logging, tracing_interceptors
from workflows.controller import ControllerWorkflow
from workflows.disruption import DisruptionWorkflow
from workflows.notify import NotificationWorkflow
from workflows.rollout import RolloutWorkflow
from workflows.termination import TerminationWorkflow

log = logging.getLogger("karpflow.worker")

WORKFLOWS: tuple[type, ...] = (
    ControllerWorkflow,
    DisruptionWorkflow,
    TerminationWorkflow,
    RolloutWorkflow,
    NotificationWorkflow,
)


def worker_interceptors() -> list[Interceptor]:
    """One line for a refused permission, and for every other expected failure."""
    return [PermissionDeniedLog(), ExpectedFailureLog()]


def in_cluster_ca(settings: WorkerSettings) -> str | None:
    """In a pod the mounted ca.crt is the cluster's CA: what new nodes need when only the endpoint is
    set (base64 PEM, as DescribeCluster gives it)."""
    path = settings.kube_ca_file or Path(incluster_config.SERVICE_CERT_FILENAME)
    return base64.b64encode(path.read_bytes()).decode() if path.is_file() else None


def activities_for(
    kube: KubeApi, ec2: Any, settings: WorkerSettings, planning: PlanningActivities | None = None
) -> list[Callable[..., Any]]:
    """Every activity the workflows call, bound to its clients. The worker passes `planning` whether or
    not it runs the controller: every worker of a task queue must be able to run every activity the
    workflows on it call (Temporal gives an activity task to any poller of the queue), so a worker
    started with the controller off still serves the passes of a controller someone starts
    (`karpflow controller start`); its informer cache starts with the first pass it gets."""
    ca_bundle = settings.cluster_ca_bundle or (settings.cluster_endpoint and in_cluster_ca(settings))
    given = settings.cluster_endpoint and ca_bundle and settings.service_cidr
    endpoint = ClusterEndpoint(
        settings.cluster_name,
        endpoint=settings.cluster_endpoint,
        ca_bundle=ca_bundle or None,
        service_cidr=settings.service_cidr,
        eks=None if given else aws_client("eks", settings),
    )
    aws = EC2Activities(
        ec2,
        settings.cluster_name,
        unavailable_ttl_seconds=settings.unavailable_offering_ttl,
        poll_interval=settings.ec2_poll_interval,
        threads=settings.ec2_threads,
        endpoint=endpoint,
        iam=aws_client("iam", settings),
        events=recorder_for(kube),
    )
    # The hot reads (drain, waits, budget claims, NodeClaims) from the worker's informer cache.
    reads = ClusterReads(kube, planning.cache if planning is not None else None)
    kubernetes = KubernetesActivities(
        kube,
        poll_interval=settings.poll_interval,
        ownership=aws.ownership,
        cluster=settings.cluster_name,
        karpenter_coexistence=settings.karpenter_coexistence,
        # The controller's pauses and the rate budgets' starts, checked at every taint (the planning
        # activities' Temporal client: the worker's own).
        controls=ControlsGate(planning.client, settings.cluster_name, settings.task_queue)
        if planning is not None
        else None,
        reads=reads,
    )
    nodeclaims = NodeClaimActivities(
        kube,
        poll_interval=settings.poll_interval,
        reads=reads,
    )
    rollout = RolloutActivities(kube)
    rollout_health = RolloutHealthActivities(kube, reads)
    activities: list[Callable[..., Any]] = [
        # Kubernetes: candidates, replacements, termination.
        kubernetes.taint_disrupted,
        kubernetes.untaint_disrupted,
        kubernetes.resolve_replacement,
        kubernetes.await_node_registered,
        kubernetes.await_node_initialized,
        kubernetes.await_node_ready,
        kubernetes.release_node,
        kubernetes.begin_termination,
        kubernetes.termination_gate,
        kubernetes.taint_for_termination,
        kubernetes.drain_node,
        kubernetes.await_volumes_detached,
        kubernetes.remove_finalizer,
        # Beside Karpenter (--karpenter-coexistence): replacements as NodeClaims, terminations handed over.
        nodeclaims.create_nodeclaim,
        nodeclaims.await_nodeclaim,
        nodeclaims.delete_nodeclaims,
        nodeclaims.await_karpenter_termination,
        # EC2.
        aws.launch_instance,
        aws.find_command_instances,
        aws.describe_instance,
        aws.terminate_instance,
        # The rollout gate (workflows/rollout_waves.py): a wave's new nodes and pods, from the cache.
        rollout_health.check_wave_health,
        # Events only a workflow knows to record (workflows/events.py).
        EventActivities(kube).record_event,
        # The operator's webhook (workflows/notify.py).
        NotificationActivities(
            kube,
            settings.cluster_name,
            secret=settings.notify_webhook_secret,
            key=settings.notify_webhook_key,
            format=settings.notify_format,
        ).send_notification,
        # `karpflow rollout`: the marks the planner replaces as drift, and the progress.
        rollout.mark_rollout_nodes,
        rollout.rollout_remaining,
        rollout.unmark_rollout_nodes,
        # Waves (workflows/rollout_waves.py): a wave's marks and the pool's rollout state.
        rollout.mark_rollout_wave,
        rollout.sync_rollout_state,
    ]
    if planning is not None:
        # The garbage collection of karpflow's own launches: on the controller's cache and client.
        collector = GarbageCollector(planning.cache, kube, planning.client, aws, settings.cluster_name)
        activities += [
            # The controller: observe and plan, validate, crash cleanup, node annotations.
            planning.plan_pass,
            planning.validate_commands,
            planning.untaint_orphans,
            planning.sync_nodepool_finalizers,
            planning.sync_operator_controls,
            planning.apply_annotations,
            planning.apply_taints,
            # A command waiting for approval, judged again (activities/waiting_commands.py).
            WaitingCommandActivities(planning).check_waiting_command,
            collector.collect_garbage,
        ]
    return activities


# -- the process ---------------------------------------------------------------------------------------


class KarpflowWorker:
    """The worker with its watcher and health endpoint; an async context manager, so tests run the
    very same assembly in process (optionally with clients they already hold)."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        client: Client | None = None,
        kube: KubeApi | None = None,
        ec2: Any = None,
        heap: HeapFreezer | None = None,
    ) -> None:
        """`heap`: the process's garbage-collector policy for the cluster cache (cluster/heap.py); the
        `karpflow worker` process sets it, a worker assembled inside another program (tests) does not."""
        self.settings = settings
        self.heap = heap
        self.client = client
        self.kube = kube
        self.ec2 = ec2
        self._owns_kube = kube is None
        self.worker: Worker | None = None
        self.watcher: NodeDeletionWatcher | None = None
        self.interruptions: InterruptionPoller | None = None
        self.cache: ClusterCache | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._health: HealthServer | None = None

    async def __aenter__(self) -> KarpflowWorker:
        settings = self.settings
        if settings.health:
            # First: while Temporal is waited for, the liveness probe passes and readiness does not.
            self._health = HealthServer(
                settings.health_host,
                settings.health_port,
                lambda: self.ready,
                settings.metrics,
                reasons=self.not_ready,
            )
            await self._health.start()
        if self.client is None:
            self.client = await connect_temporal_patiently(settings, tracing_interceptors(settings))
        if settings.register_search_attributes:
            await ensure_search_attributes(self.client)
        if self.kube is None:
            self.kube = await connect_kubernetes(settings)
        if self.ec2 is None:
            self.ec2 = ec2_client(settings)
        # The cluster as the planner sees it: the controller's passes, and the interruption poller's
        # replacements and budgets. Started now when this worker runs either; else by the first pass
        # a controller (started elsewhere, or by `karpflow controller start`) gives it.
        self.cache = ClusterCache(self.kube, stale_after=settings.cache_stale_after, heap=self.heap)
        if settings.controller or settings.interruption_queue:
            self.cache.start()
        planning = PlanningActivities(
            self.cache,
            self.kube,
            self.client,
            task_queue=settings.task_queue,
            region=settings.aws_region,
            cluster=settings.cluster_name,
            instances=InstanceDescriptions(self.ec2),
            reservations=CapacityReservationReader(self.ec2),
            karpenter_coexistence=settings.karpenter_coexistence,
            approval_recheck=timedelta(seconds=settings.approval_recheck_interval),
            notify=settings.notify_webhook_secret is not None,
            options=plan_options(settings),
        )
        self.worker = Worker(
            self.client,
            task_queue=settings.task_queue,
            workflows=list(WORKFLOWS),
            activities=activities_for(self.kube, self.ec2, settings, planning),
            max_concurrent_activities=settings.max_concurrent_activities,
            max_concurrent_workflow_tasks=settings.max_concurrent_workflow_tasks,
            graceful_shutdown_timeout=timedelta(seconds=settings.graceful_shutdown),
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.sticky_queue_timeout),
            # Pollers follow the backlog: many terminations at once get picked up in parallel.
            workflow_task_poller_behavior=PollerBehaviorAutoscaling(),
            activity_task_poller_behavior=PollerBehaviorAutoscaling(),
            interceptors=worker_interceptors(),
        )
        self._tasks.append(asyncio.create_task(self.worker.run(), name="temporal-worker"))
        if settings.node_watcher:
            self.watcher = NodeDeletionWatcher(
                self.kube,
                self.client,
                settings.task_queue,
                settings.node_watcher_resync,
                retry_every=min(10.0, settings.node_watcher_retry),
                retry_first=timedelta(seconds=settings.node_watcher_retry),
                cluster=settings.cluster_name,
            )
            self._tasks.append(asyncio.create_task(self.watcher.run(), name="node-deletion-watcher"))
        if settings.interruption_queue:
            self.interruptions = InterruptionPoller(
                sqs_client(settings),
                settings.interruption_queue,
                self.kube,
                self.client,
                settings.task_queue,
                settings.cluster_name,
                concurrency=settings.interruption_concurrency,
                wait_seconds=settings.interruption_wait,
                cache=self.cache,
                options=plan_options(settings),
            )
            self._tasks.append(asyncio.create_task(self.interruptions.run(), name="interruption-poller"))
        if settings.controller:
            await self.start_controller()
            self._tasks.append(
                asyncio.create_task(
                    supervise_controller(self.client, settings, settings.controller_supervise_interval),
                    name="controller-supervisor",
                )
            )
        log.info(
            "worker running: task queue %s on %s/%s, cluster %s%s",
            settings.task_queue,
            self.client.service_client.config.target_host,
            self.client.namespace,
            settings.cluster_name,
            f", health on port {self.health_port}" if self.health_port else "",
        )
        return self

    async def start_controller(self) -> str:
        """Start the cluster's ControllerWorkflow unless it runs already or an operator stopped it
        (every worker does this, then checks again every supervise interval)."""
        assert self.client is not None
        # A run whose state cannot be read now is left to the supervision, which tries again.
        check = await ensure_controller(self.client, self.settings, start_without_state=False)
        workflow_id = controller_workflow_id(self.settings.cluster_name)
        if check.carry_problem:
            log.warning("controller %s not started yet: %s", workflow_id, check.carry_problem)
        elif check.stopped:
            log.info("controller %s is stopped; `karpflow controller start` starts it", workflow_id)
        elif check.started_run is not None:
            log.info("controller %s started (run %s)", workflow_id, check.started_run)
        else:
            log.info("controller %s running", workflow_id)
        return workflow_id

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    @property
    def ready(self) -> bool:
        return not self.not_ready()

    def not_ready(self) -> list[str]:
        """Why the worker is not ready (nothing when it is): a stale cluster cache is one reason."""
        reasons = []
        if self.worker is None or not self.worker.is_running:
            reasons.append("the Temporal worker is not running")
        if self.watcher is not None and not self.watcher.synced:
            reasons.append("the node-deletion watcher has not listed nodes yet")
        if self.cache is not None and self.cache.started:  # else it starts with a first pass
            if unsynced := self.cache.unsynced():
                reasons.append(f"the cluster cache has not listed {', '.join(unsynced)} yet")
            reasons.extend(f"the cluster cache is stale: {why}" for why in self.cache.stale())
        return reasons

    async def wait(self) -> None:
        """Until the Temporal worker stops (it raises if it failed)."""
        await self._tasks[0]

    async def shutdown(self) -> None:
        if self.worker is not None and self.worker.is_running:
            await self.worker.shutdown()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.cache is not None:
            await self.cache.stop()
            self.cache = None
        if self._health is not None:
            await self._health.stop()
            self._health = None
        if self._owns_kube and self.kube is not None:
            await self.kube.close()
            self.kube = None

    @property
    def health_port(self) -> int | None:
        return self._health.port if self._health is not None else None


async def serve(settings: WorkerSettings) -> None:
    """Run until SIGTERM or SIGINT, then shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with KarpflowWorker(settings, heap=HeapFreezer()) as running:
        stopped = asyncio.create_task(stop.wait())
        worker_done = asyncio.create_task(running.wait())
        done, _ = await asyncio.wait({stopped, worker_done}, return_when=asyncio.FIRST_COMPLETED)
        if stopped in done:
            log.info(
                "signal received: draining in-flight activities for up to %ss", settings.graceful_shutdown
            )
        else:
            worker_done.result()  # re-raise a fatal worker error
        stopped.cancel()


# -- the command ---------------------------------------------------------------------------------------


@click.command("worker")
@settings_options
def cli(**flags: Any) -> None:
    """Run the karpflow worker (workflows, activities, node-deletion watcher, health endpoint)."""
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        settings = WorkerSettings(**given)
    except ValidationError as err:
        click.echo(explain(err), err=True)
        sys.exit(2)
    configure_logging(settings)
    for line in unknown_variables(os.environ):
        log.warning("%s; it is ignored", line)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings))
    except TemporalUnreachable as err:
        click.echo(f"karpflow worker: {err}", err=True)
        exit_without_finalizing(1)
    exit_without_finalizing(0)  # shut down gracefully: all that is left is what can abort


def exit_without_finalizing(code: int) -> NoReturn:
    """End the worker process with `code`, skipping the interpreter's finalization.

    The Temporal core's native threads outlive the client and may call into Python while the
    interpreter finalizes, which aborts the process (SIGABRT, "PyGILState_Release: thread state must
    be current") instead of exiting with its code: about once in 60 exits after a failed connect,
    once in 30 after a SIGTERM (exit -6 where the kubelet expects 0). What finalization would do
    that matters is done here first: the tracer provider exports its last spans, the log handlers
    flush. (The worker, its connections and the event loop are closed by then.)
    """
    from opentelemetry import trace

    shutdown = getattr(trace.get_tracer_provider(), "shutdown", None)
    if callable(shutdown):
        shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    cli()
