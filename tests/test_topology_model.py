"""The topology's stateful model (tests/topology_model.py) with a bounded number of random
examples; ``scripts/topology_model_soak.py`` runs many more."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.topology_model import TopologyModel

pytestmark = pytest.mark.timeout(300)


def test_the_topology_keeps_t1_to_t4_and_delivers_every_change_once():
    TopologyModel.TestCase.settings = settings(
        max_examples=40, stateful_step_count=30, deadline=None, derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    TopologyModel.TestCase().runTest()
