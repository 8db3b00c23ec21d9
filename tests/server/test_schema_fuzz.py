"""Schemathesis over every operation of the server's own OpenAPI document (`/openapi.json`):
generated requests, valid and invalid, must never get a 5xx, and every response must
match the document (status, content type, headers, body schema).

Generated values are kept small by capping the numbers that set the amount of work
(`max_tokens`, `n`, …) in a copy of the document before generating from it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from ops_support import start_ops_server
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from server_harness import ServerHarness

from edgemoe.server.app import create_app
from edgemoe.server.config import ServerConfig
from edgemoe.server.engine_client import EngineClient, EngineLink
from edgemoe.tokenizer import TokenizerBundle

# Field → the largest value generated for it (integers only).
CAPS = {"max_tokens": 8, "max_completion_tokens": 8, "max_output_tokens": 8, "min_tokens": 4, "n": 2,
        "best_of": 2, "top_logprobs": 2, "logprobs": 2, "budget_tokens": 8, "limit": 20}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
EXAMPLES = 15  # per operation and mode


def cap_integers(node: Any, cap: int) -> None:
    """Set `maximum` on every integer branch of a (sub)schema."""
    if not isinstance(node, dict):
        return
    if node.get("type") == "integer" or (isinstance(node.get("type"), list) and "integer" in node["type"]):
        node["maximum"] = min(cap, node.get("maximum", cap))
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in node.get(key, []):
            cap_integers(branch, cap)


def keep_values_small(node: Any) -> Any:
    """Cap the CAPS fields wherever they appear (bodies and query parameters)."""
    if isinstance(node, dict):
        for name, sub in (node.get("properties") or {}).items():
            if name in CAPS:
                cap_integers(sub, CAPS[name])
        if node.get("in") == "query" and node.get("name") in CAPS:
            cap_integers(node.get("schema"), CAPS[node["name"]])
        for value in node.values():
            keep_values_small(value)
    elif isinstance(node, list):
        for value in node:
            keep_values_small(value)
    return node


def test_caps_reach_nested_branches() -> None:
    doc = {"properties": {"n": {"anyOf": [{"type": "integer", "maximum": 64}, {"type": "null"}]},
                          "max_tokens": {"type": "integer"}}}
    keep_values_small(doc)
    assert doc["properties"]["n"]["anyOf"][0]["maximum"] == 2 and doc["properties"]["max_tokens"]["maximum"] == 8


@pytest.fixture(scope="module")
def fuzz_server(demo_dir: Path, demo_tokenizer: TokenizerBundle) -> Iterator[ServerHarness]:
    harness = start_ops_server(demo_dir, demo_tokenizer, api_key="fuzz-key")
    yield harness
    harness.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: ServerHarness) -> Any:
    r = httpx.get(f"{fuzz_server.base_url}/openapi.json", headers={"Authorization": "Bearer fuzz-key"})
    assert r.status_code == 200
    return schemathesis.openapi.from_dict(keep_values_small(r.json()))


def cases() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) for every documented operation, read from an app that is never
    served; invalid inputs (negative mode) only where there is a body or a query to break."""
    client = EngineClient(EngineLink.in_dir(Path(tempfile.gettempdir())))  # never started
    doc = create_app(ServerConfig(), client).openapi()
    out = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            has_input = "requestBody" in op or any(p.get("in") == "query" for p in op.get("parameters", []))
            for mode in GenerationMode if has_input else [GenerationMode.POSITIVE]:
                out.append((method.upper(), path, mode))
    return out


@pytest.mark.parametrize(("method", "path", "mode"), cases(), ids=lambda v: getattr(v, "value", v))
def test_every_endpoint_keeps_its_promises(
    method: str, path: str, mode: GenerationMode, api_schema: Any, fuzz_server: ServerHarness,
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def run(case: Any) -> None:
        response = case.call(base_url=fuzz_server.base_url, headers={"Authorization": "Bearer fuzz-key"}, timeout=60)
        case.validate_response(response, checks=CHECKS)

    run()
