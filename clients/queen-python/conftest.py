"""Fixtures for driving Queen's Python client against Comb.

COMB_URL names the server (the Rust test `queen_python` starts PostgreSQL and `comb serve`
with an encryption key and runs this suite with each installed client version).
"""

import importlib.metadata
import os
import uuid

import pytest

CLIENT_VERSION = importlib.metadata.version("queen-mq")


def pytest_report_header(config):
    return f"queen-mq {CLIENT_VERSION}, server {os.environ.get('COMB_URL')}"


@pytest.fixture
def url():
    value = os.environ.get("COMB_URL")
    if not value:
        pytest.fail("COMB_URL must name the Comb server under test")
    return value


@pytest.fixture
def name():
    """A queue name of its own for each test."""
    return "py-" + uuid.uuid4().hex[:12]
