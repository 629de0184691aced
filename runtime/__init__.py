"""The worker process's parts, each in a room of its own: settings (flags and environment),
telemetry (logs and traces), connections (Temporal, Kubernetes, AWS) and the health endpoint.
worker.py assembles them."""
