"""The simulated cluster fixtures, and the workflow tests' world (`karpflow`: a secure stack, a
worker identity with deploy/base's RBAC, the dev server) for the tests that run a worker."""

from sim.testing import make_sim_stack, pytest_configure, sim_stack  # noqa: F401
from tests.integration.workflows.conftest import (  # noqa: F401
    dev_client,
    karpflow,
    temporal_address,
    worker_identity_objects,
)
