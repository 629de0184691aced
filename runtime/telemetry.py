"""Logs and traces: JSON (or text) log lines that say which workflow and activity they are about, and
Temporal's OpenTelemetry interceptor with the chosen exporter."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Interceptor

from runtime.settings import WorkerSettings


class TemporalContextFilter(logging.Filter):
    """Adds the workflow / activity ids to every record logged inside an activity (any logger), and
    flattens what `workflow.logger` attaches, so every line says which workflow it is about."""

    def filter(self, record: logging.LogRecord) -> bool:
        context: dict[str, Any] = {}
        if activity.in_activity():
            info = activity.info()
            context = {
                "workflow_id": info.workflow_id,
                "run_id": info.workflow_run_id,
                "workflow_type": info.workflow_type,
                "activity_id": info.activity_id,
                "activity_type": info.activity_type,
                "attempt": info.attempt,
            }
        elif isinstance(wf := getattr(record, "temporal_workflow", None), dict):
            context = {
                "workflow_id": wf.get("workflow_id"),
                "run_id": wf.get("run_id"),
                "workflow_type": wf.get("workflow_type"),
            }
        fields = {k: v for k, v in context.items() if v is not None}
        record.karpflow = fields
        # Text lines: workflow.logger / activity.logger already appended their context to the message.
        sdk_context = hasattr(record, "temporal_workflow") or hasattr(record, "temporal_activity")
        record.karpflow_text = "" if sdk_context or not fields else f" {fields}"
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "karpflow", {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(settings: WorkerSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(TemporalContextFilter())
    if settings.log_format == "json":
        formatter: logging.Formatter = JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s%(karpflow_text)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    for noisy in ("botocore", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # workflow.logger appends its context to the message; the JSON lines carry it as fields instead.
    workflow.logger.workflow_info_on_message = settings.log_format == "text"
    activity.logger.activity_info_on_message = settings.log_format == "text"


def tracing_interceptors(settings: WorkerSettings) -> list[Interceptor]:
    """Temporal's OpenTelemetry interceptor with the chosen exporter; none by default."""
    if settings.otel_exporter == "none":
        return []
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    from temporalio.contrib.opentelemetry import TracingInterceptor

    exporter: SpanExporter
    if settings.otel_exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otel_endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": "karpflow-worker"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return [TracingInterceptor()]
