"""karpflow beside a simulated Karpenter: the workflow tests' world and the interruption queue."""

from tests.integration.interruption.conftest import queue  # noqa: F401 - fixtures
from tests.integration.workflows.conftest import (  # noqa: F401 - fixtures
    dev_client,
    karpflow,
    make_sim_stack,
    pytest_configure,
    sim_stack,
    temporal_address,
    worker_identity_objects,
)
