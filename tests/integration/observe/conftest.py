"""The simulated cluster fixtures (`sim_stack`, `make_sim_stack`); see sim/testing.py."""

from sim.testing import make_sim_stack, pytest_configure, sim_stack  # noqa: F401
