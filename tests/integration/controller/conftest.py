"""The controller's acceptance tests share the workflow tests' world (tests/integration/workflows)."""

from tests.integration.workflows.conftest import (  # noqa: F401 - fixtures
    dev_client,
    karpflow,
    make_sim_stack,
    pytest_configure,
    sim_stack,
    temporal_address,
    worker_identity_objects,
)
