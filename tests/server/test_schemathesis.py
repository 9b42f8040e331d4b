"""Hostile input, generated: schemathesis sends requests built from /openapi.json (valid and
invalid ones) to a real server and fails on any 5xx or any answer the document does not
describe. The example count is bounded so the run stays short; the context is small so
that no generated request decodes for long.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import ServerProcess, starts_process

EXAMPLES = 25  # per operation and phase


@pytest.fixture(scope="module")
@starts_process
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path_factory.mktemp("schemathesis"), "--ctx", "64")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(api_server: ServerProcess) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(api_server.base + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


ADMIN_EXAMPLES = 6  # each may reload the model: fewer, but the same checks

_SETTINGS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": list(HealthCheck),
    "derandomize": True,  # the same requests every run: a failure here is reproducible
}


def _check(case: schemathesis.Case) -> None:
    # valid-looking requests may still be refused on purpose: a model name that does not
    # exist (404), a prompt longer than the context (400): those are documented answers
    case.call_and_validate(excluded_checks=[positive_data_acceptance])


@schema.exclude(path_regex="^/admin/").parametrize()
@settings(max_examples=EXAMPLES, **_SETTINGS)
def test_no_5xx_and_every_answer_documented(case: schemathesis.Case) -> None:
    _check(case)


@schema.include(path_regex="^/admin/").parametrize()
@settings(max_examples=ADMIN_EXAMPLES, **_SETTINGS)
def test_admin_routes_too(case: schemathesis.Case) -> None:
    _check(case)
