"""Fixtures shared by the oga test suite. Helpers (oracle, drivers) live in tests/helpers.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import oga as og  # noqa: E402
import oga.testing as ogt  # noqa: E402


@pytest.fixture
def model():
    """The default test model: vocab 64, EOS 1, block 4, 128 blocks, batch 8, context 128."""
    return ogt.create_test_model()


@pytest.fixture
def engine(model):
    return og.Engine(model)


@pytest.fixture
def buffer(engine):
    return engine.create_event_buffer(64)
