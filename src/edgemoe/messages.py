"""Structs that cross the process boundary (server <-> engine), in one place.

msgspec structs: cheap to encode over ZMQ, and plain enough to use in-process
(`edgemoe.LLM`) too. Nothing here imports torch.
"""

from __future__ import annotations

import math

import msgspec

# Request bounds the engine relies on (the HTTP layer checks them first, naming the
# client's own field names; see edgemoe.server.limits).
MAX_TOKEN_COUNT = 2**31 - 1  # max_tokens, min_tokens, top_k: int32 on the device
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_TEMPERATURE = 100.0
MAX_REPETITION_PENALTY = 10.0
MAX_STOP_STRINGS = 64
MAX_STOP_BYTES = 256
MAX_STOP_TOKEN_IDS = 64
# logit_bias: OpenAI's limits (entries, and the bias each may add to a logit).
MAX_LOGIT_BIAS = 300
LOGIT_BIAS_LIMIT = 100.0


class StructuredOutput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The output must be JSON: matching `schema` (a JSON Schema as JSON text), or any JSON
    object when it is None. `reasoning` says where the JSON starts (`structured/constraint.py`):
    "none" at the first token, "open" after the prompt's open `<think>` block closes,
    "start" after a `<think>` block the model may open first.

    `target="calls"`: the output is free, but inside each Hermes `<tool_call>` … `</tool_call>`
    the JSON must match `schema` (`structured/call_constraint.py`); `primed` is the call's
    text the prompt already ends with (after its `<tool_call>`), for a forced call;
    `one_call`: no call after the first (`parallel_tool_calls` false). A "value" target with
    `calls_schema` (the calls' schema) may instead be tool calls, chosen by its first token
    (`structured/value_or_calls.py`). `tool_format` says how calls are written: "hermes"
    (the call's JSON; the schema is its JSON Schema), "qwen3_coder" or "minimax_m2" (XML,
    the latter in `<minimax:tool_call>` blocks of invokes; the schema is the JSON list of
    the tools' [name, parameters, strict]: `structured/xml_tools.py`)."""

    schema: str | None = None
    reasoning: str = "none"
    target: str = "value"
    primed: str | None = None
    one_call: bool = False
    calls_schema: str | None = None
    tool_format: str = "hermes"


MAX_SCHEMA_BYTES = 256 * 1024  # a structured output's schema, as JSON text
MAX_PRIMED_BYTES = 4096  # a forced call's opening, already in the prompt


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How to pick tokens for one request. Defaults mean plain sampling at T=1.

    `temperature=0` is greedy. `max_tokens=None` means "until the context is full".
    `stop` strings are matched on the detokenised text across token boundaries and
    are excluded from the output; `stop_token_ids` end generation on that token.
    `min_tokens` masks every EOS id and stop token id until that many were generated, and
    a stop string ending within their text does not stop (vLLM's and SGLang's rule).
    `logit_bias` maps token ids to a number in [-100, 100] added to that token's logit
    before everything else (the min_tokens mask, penalties, filters, greedy argmax).
    `logprobs=N` returns the sampled token's logprob plus the top-N alternatives
    (raw model distribution, before logit_bias, penalties and filters).
    `structured` masks every token that would make the output other than the JSON it
    asks for (the engine compiles and checks its schema).
    """

    temperature: float = 1.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 256
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    logprobs: int | None = None
    skip_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        # One stop string as a plain str (vLLM takes both): iterated, "ab" would stop at "a" and at "b".
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise ValueError naming the field for any out-of-range value.

        NOTE: every number is bounded, not just signed: values past 64 bits cannot be
        encoded for the engine process, and stop strings cost every token a scan.
        """
        for ok, field, why in self._checks():
            if not ok:
                raise ValueError(f"{field} {why} (got {_shown(getattr(self, field))})")
        if self.logit_bias is not None:
            _check_logit_bias(self.logit_bias)
        if vocab_size is not None:
            bad = [t for t in self.stop_token_ids if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"stop_token_ids {_shown(bad[:5])} are outside the vocabulary [0, {vocab_size})")
            bad = [t for t in self.logit_bias or () if not 0 <= t < vocab_size]
            if bad:
                raise ValueError(f"logit_bias token ids {_shown(bad[:5])} are outside the vocabulary [0, {vocab_size})")

    def _checks(self) -> list[tuple[bool, str, str]]:
        count = MAX_TOKEN_COUNT
        return [
            (math.isfinite(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE, "temperature",
             f"must be between 0 and {MAX_TEMPERATURE}"),
            (-1 <= self.top_k <= MAX_TOKEN_COUNT, "top_k", f"must be -1 or 0 (off), or between 1 and {count}"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be greater than 0 and at most 1"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be between 0 and 1"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be between -2 and 2"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be between -2 and 2"),
            (0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY, "repetition_penalty",
             f"must be greater than 0 and at most {MAX_REPETITION_PENALTY}"),
            (self.seed is None or SEED_MIN <= self.seed <= SEED_MAX, "seed", "must be a 64-bit signed integer"),
            (self.max_tokens is None or 1 <= self.max_tokens <= count, "max_tokens", f"must be between 1 and {count}"),
            (0 <= self.min_tokens <= count, "min_tokens", f"must be between 0 and {count}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens", "must be <= max_tokens"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be between 0 and 20"),
            (len(self.stop) <= MAX_STOP_STRINGS, "stop", f"may hold at most {MAX_STOP_STRINGS} stop strings"),
            (all(self.stop), "stop", "may not contain an empty string"),
            (all(len(s.encode("utf-8", "surrogatepass")) <= MAX_STOP_BYTES for s in self.stop), "stop",
             f"may only hold strings of at most {MAX_STOP_BYTES} bytes of UTF-8"),
            (len(self.stop_token_ids) <= MAX_STOP_TOKEN_IDS, "stop_token_ids",
             f"may hold at most {MAX_STOP_TOKEN_IDS} ids"),
            (all(0 <= t <= MAX_TOKEN_COUNT for t in self.stop_token_ids), "stop_token_ids",
             f"must be token ids between 0 and {count}"),
            (self.structured is None or self.structured.reasoning in ("none", "open", "start"), "structured",
             "reasoning must be 'none', 'open' or 'start'"),
            (self.structured is None or max(len((self.structured.schema or "").encode()),
                                            len((self.structured.calls_schema or "").encode())) <= MAX_SCHEMA_BYTES,
             "structured", f"schema may be at most {MAX_SCHEMA_BYTES} bytes of JSON"),
            (self.structured is None or self.structured.target in ("value", "calls"), "structured",
             "target must be 'value' or 'calls'"),
            (self.structured is None or self.structured.tool_format in ("hermes", "qwen3_coder", "minimax_m2"),
             "structured", "tool_format must be 'hermes', 'qwen3_coder' or 'minimax_m2'"),
            (self.structured is None or len((self.structured.primed or "").encode()) <= MAX_PRIMED_BYTES,
             "structured", f"primed may be at most {MAX_PRIMED_BYTES} bytes"),
        ]


def _check_logit_bias(bias: object) -> None:
    """Raise ValueError unless `bias` maps at most MAX_LOGIT_BIAS int token ids to finite
    numbers within ±LOGIT_BIAS_LIMIT (`edgemoe.LLM` callers may pass anything)."""
    if not isinstance(bias, dict):
        raise ValueError(f"logit_bias must be a mapping of token ids to numbers (got {_shown(bias)})")
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias may hold at most {MAX_LOGIT_BIAS} entries (got {len(bias)})")
    for token, value in bias.items():
        if not _is_int(token) or not 0 <= token <= MAX_TOKEN_COUNT:
            raise ValueError(f"logit_bias keys must be token ids between 0 and {MAX_TOKEN_COUNT} (got {_shown(token)})")
        number = _is_int(value) or (isinstance(value, float) and math.isfinite(value))
        if not number or not -LOGIT_BIAS_LIMIT <= value <= LOGIT_BIAS_LIMIT:  # type: ignore[operator]
            raise ValueError(f"logit_bias values must be numbers between {-LOGIT_BIAS_LIMIT:g} and "
                             f"{LOGIT_BIAS_LIMIT:g} (got {_shown(value)} for token {token})")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """A value for an error message, short whatever the client sent."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, list) and len(value) > 8:
        return f"{len(value)} items"
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "…"


class TokenLogprob(msgspec.Struct, array_like=True):
    """One generated token's logprob and the top alternatives (id, logprob)."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = msgspec.field(default_factory=list)


class RequestOutput(msgspec.Struct, kw_only=True):
    """What one engine step produced for one request: an increment, never a total.

    `text` is the newly final text (stop strings excluded). On the last increment
    `finished` is true and `finish_reason` is "stop" (EOS, stop string or stop token:
    `stop_reason` says which string/id, None for EOS), "length" (max_tokens or context
    full), "abort" or "error" (`error` says why).
    """

    request_id: str
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""
    logprobs: list[TokenLogprob] | None = None
    finished: bool = False
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0


# --------------------------------------------------------------------------- process protocol
# server -> engine: `EngineRequest` commands; engine -> server: `EngineEvent`s. Both are
# tagged unions so one msgpack decoder per direction reads every message.


class AddRequest(msgspec.Struct, tag="add", kw_only=True):
    """Start generating for `prompt_ids`. The engine answers with `EngineOutputs`
    increments for `request_id`, or one `EngineError` naming it if the request is refused."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


class AbortRequest(msgspec.Struct, tag="abort"):
    """Stop these requests (unknown or finished ids are ignored)."""

    request_ids: list[str]


class ShutdownEngine(msgspec.Struct, tag="shutdown"):
    """Finish the loop and exit the engine process with status 0."""


class StatsRequest(msgspec.Struct, tag="stats"):
    """Send an `EngineStats` snapshot now (after the current step). `experts`: include the
    per-expert map, and keep marking expert activity for a few seconds (the live view)."""

    experts: bool = False


EngineRequest = AddRequest | AbortRequest | ShutdownEngine | StatsRequest


class EngineReady(msgspec.Struct, tag="ready", kw_only=True):
    """Sent once, when the model is loaded and the loop accepts requests.

    `model_dir` is the resolved checkpoint directory (the demo model's path when none
    was given; a random preset's tokenizer directory), so the server can load the
    tokenizer and template without torch. `model_name` is the model's default served
    name ("" = the directory's name); `random_weights` marks seeded random weights.
    """

    model_dir: str
    model_type: str
    max_model_len: int
    vocab_size: int
    eos_token_ids: list[int]
    pid: int
    model_name: str = ""
    random_weights: bool = False


class EngineOutputs(msgspec.Struct, tag="outputs"):
    """Every increment one engine step produced, batched into one message."""

    outputs: list[RequestOutput]


class EngineError(msgspec.Struct, tag="error", kw_only=True):
    """A failure. With `request_id`: that request only (`invalid` = the input was bad,
    e.g. the prompt is too long; otherwise an internal error). With `fatal`: the engine
    is going away (failed to load, or crashed) and every request is lost."""

    message: str
    request_id: str | None = None
    invalid: bool = False
    fatal: bool = False


class ExpertCacheStats(msgspec.Struct, kw_only=True):
    """Expert traffic since the engine started (cumulative counters)."""

    hits: int = 0
    misses: int = 0
    experts_cpu: int = 0  # experts computed on the CPU instead of copied
    bytes_copied: int = 0
    tokens: int = 0
    hit_rate_by_layer: list[float] = msgspec.field(default_factory=list)
    misses_per_token: float = 0.0


class ExpertMap(msgspec.Struct, kw_only=True):
    """What each expert of each MoE layer did since the previous map: `cells[i][e]` for model
    layer `layers[i]` is "0" not on the device, "1" in a device slot (resident), "2" hit
    (served from a slot), "3" miss (copied in), "4" computed on the host CPU."""

    layers: list[int]
    num_experts: int
    cells: list[str]


class EngineStats(msgspec.Struct, tag="stats", kw_only=True):
    """A snapshot of the engine: scheduler queues, KV pool, prefix cache, experts, memory.

    Counters are cumulative since the engine started. KV pages: every page is free,
    held by the prefix cache (`kv_pages_cached`, of which `kv_pages_evictable` are
    referenced by no request), or owned by a running request; idle, free + cached == total.
    """

    time: float  # the engine's wall clock (time.time()) when taken
    requests_running: int = 0
    requests_waiting: int = 0
    kv_pages_total: int = 0
    kv_pages_free: int = 0
    kv_pages_cached: int = 0
    kv_pages_evictable: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_query_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    moe_backend: str | None = None
    expert_cache: ExpertCacheStats | None = None
    memory_plan: dict[str, int | float | str | bool | None] = msgspec.field(default_factory=dict)
    device_memory_allocated: int | None = None
    device_memory_reserved: int | None = None
    host_memory_rss: int | None = None
    experts: ExpertMap | None = None  # only while a live view watches


EngineEvent = EngineReady | EngineOutputs | EngineError | EngineStats
