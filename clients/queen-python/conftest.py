"""Fixtures for driving Queen's Python client against Comb.

COMB_URL names the server (the Rust test `queen_python` starts PostgreSQL and `comb serve`
with an encryption key and runs this suite with each installed client version). COMB_TOKEN,
when set, is the bearer token every client of the suite carries (the server then requires
tokens). COMB_READ_TOKEN, when set, is a reader's token: only then is `test_refusals.py`
collected (the answers a client without the right token gets), and it is run alone.
COMB_TEST_BACKEND=citus says the server runs on a Citus cluster: the tests of the actions
Comb does not run there assert their refusal (`comb_client.ON_CITUS`).
"""

import importlib.metadata
import os
import uuid

import pytest

from comb_client import ON_CITUS
from comb_client import http as http_client

CLIENT_VERSION = importlib.metadata.version("queen-mq")

# The refusals are only true of a server requiring tokens: collected only when asked.
collect_ignore = [] if os.environ.get("COMB_READ_TOKEN") else ["test_refusals.py"]


def pytest_report_header(config):
    tokens = "with a token" if os.environ.get("COMB_TOKEN") else "without a token"
    backend = "Citus" if ON_CITUS else "PostgreSQL"
    return f"queen-mq {CLIENT_VERSION}, server {os.environ.get('COMB_URL')} on {backend} ({tokens})"


@pytest.fixture
def url():
    value = os.environ.get("COMB_URL")
    if not value:
        pytest.fail("COMB_URL must name the Comb server under test")
    return value


@pytest.fixture
def http(url):
    """Plain HTTP to the server, carrying the suite's token (for what Queen's client lacks)."""
    with http_client(url) as client:
        yield client


@pytest.fixture
def name():
    """A queue name of its own for each test."""
    return "py-" + uuid.uuid4().hex[:12]
