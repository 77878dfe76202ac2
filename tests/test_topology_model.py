"""The topology's stateful model (tests/topology_model.py) with a bounded number of random
examples (deterministic: the same ones every run); ``scripts/topology_model_soak.py`` runs
as many as asked, with fresh randomness."""

from __future__ import annotations

import pytest

from tests.topology_model import TopologyModel, model_settings

pytestmark = pytest.mark.timeout(300)


def test_the_topology_keeps_t1_to_t4_and_delivers_every_change_once():
    TopologyModel.TestCase.settings = model_settings(examples=150, steps=40, derandomize=True)
    TopologyModel.TestCase().runTest()
