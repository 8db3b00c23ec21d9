"""`logit_bias` through the whole server (real engine, demo model, CPU) with the openai SDK:
it steers greedy and sampled output, applies only to its own request in a batch, leaves
logprobs describing the raw model, and every malformed map is a 400 naming the field."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from server_harness import ServerHarness

from edgemoe.assets.qwen3_tokenizer import bytes_to_unicode
from edgemoe.tokenizer import TokenizerBundle

USER = [{"role": "user", "content": "Tell me a story."}]
HELLO = 23811  # " hello" in the Qwen3 tokenizer (checked below)
# Greedy, thinking off (all output is content), a fixed length.
GREEDY: dict[str, Any] = {"model": "m", "temperature": 0, "max_tokens": 5, "reasoning_effort": "none",
                          "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def real(real_fp32: ServerHarness) -> ServerHarness:
    return real_fp32


def token_id(tokenizer: TokenizerBundle, raw: list[int] | None) -> int:
    """A logprob entry's `bytes` -> its token id (byte-level BPE piece, or an added token's text)."""
    assert raw is not None
    to_unicode = bytes_to_unicode()
    found = tokenizer.tokenizer.token_to_id("".join(to_unicode[b] for b in raw))
    if found is None:
        found = tokenizer.tokenizer.token_to_id(bytes(raw).decode())
    assert found is not None
    return found


def first_entry(client: openai.OpenAI, messages: list[dict[str, str]], **kwargs: Any) -> Any:
    out = client.chat.completions.create(messages=messages, logprobs=True, top_logprobs=3, **GREEDY, **kwargs)
    assert out.choices[0].logprobs is not None and out.choices[0].logprobs.content
    return out.choices[0].logprobs.content[0]


def test_plus_100_forces_a_token_in_chat_completions_and_n(real: ServerHarness, demo_tokenizer: TokenizerBundle) -> None:
    assert demo_tokenizer.tokenizer.encode(" hello", add_special_tokens=False).ids == [HELLO]
    client = real.openai()
    out = client.chat.completions.create(messages=USER, logit_bias={str(HELLO): 100}, **GREEDY)
    assert out.choices[0].message.content == " hello" * 5
    sampled = client.chat.completions.create(
        model="m", messages=USER, max_tokens=4, n=2, seed=3, temperature=1.0, reasoning_effort="none",
        logit_bias={str(HELLO): 100}, extra_body={"ignore_eos": True})
    assert [c.message.content for c in sampled.choices] == [" hello" * 4] * 2  # every choice gets the bias
    text = client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=3, temperature=0,
                                     logit_bias={str(HELLO): 100}, extra_body={"ignore_eos": True})
    assert text.choices[0].text == " hello" * 3


def test_minus_100_changes_the_greedy_first_token_and_logprobs_stay_raw(
    real: ServerHarness, demo_tokenizer: TokenizerBundle
) -> None:
    client = real.openai()
    plain = first_entry(client, USER)
    best, runner_up = (token_id(demo_tokenizer, t.bytes) for t in plain.top_logprobs[:2])
    assert token_id(demo_tokenizer, plain.bytes) == best
    banned = first_entry(client, USER, logit_bias={str(best): -100})
    assert token_id(demo_tokenizer, banned.bytes) != best
    assert token_id(demo_tokenizer, banned.bytes) in {token_id(demo_tokenizer, t.bytes) for t in plain.top_logprobs}
    # Forced to the runner-up: its logprob is still the model's own, below the raw best's.
    forced = first_entry(client, USER, logit_bias={str(runner_up): 100})
    assert token_id(demo_tokenizer, forced.bytes) == runner_up
    assert token_id(demo_tokenizer, forced.top_logprobs[0].bytes) == best
    assert forced.logprob < forced.top_logprobs[0].logprob


def test_a_bias_reaches_only_its_own_request_in_a_batch(real: ServerHarness) -> None:
    client = real.openai()
    prompts = [[{"role": "user", "content": f"Story number {i}, please."}] for i in range(4)]

    def run(biased: int | None) -> list[str]:
        def one(i: int) -> str:
            bias = {str(HELLO): 100} if i == biased else None
            out = client.chat.completions.create(messages=prompts[i], logit_bias=bias, **GREEDY)
            return out.choices[0].message.content or ""

        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(pool.map(one, range(len(prompts))))

    alone = run(None)
    together = run(2)
    assert together[2] == " hello" * 5 and alone[2] != together[2]
    assert [t for i, t in enumerate(together) if i != 2] == [t for i, t in enumerate(alone) if i != 2]


BAD_BIASES: list[tuple[str, Any, str]] = [
    ("not an object", [1, 2], "must be an object"),
    ("a word key", {"hello": 1}, "decimal integers"),
    ("a negative key", {"-1": 1}, "decimal integers"),
    ("a fractional key", {"1.5": 1}, "decimal integers"),
    ("a padded key", {" 7": 1}, "decimal integers"),
    ("a huge key", {"9" * 5000: 1}, "at most 2147483647"),
    ("above 100", {"7": 100.5}, "between -100 and 100"),
    ("below -100", {"7": -101}, "between -100 and 100"),
    ("a string value", {"7": "5"}, "between -100 and 100"),
    ("a boolean value", {"7": True}, "between -100 and 100"),
    ("a null value", {"7": None}, "between -100 and 100"),
    ("a huge integer value", {"7": 10**30}, "between -100 and 100"),
    ("one token twice", {"7": 1, "007": 2}, "once"),
    ("301 entries", {str(i): 1 for i in range(301)}, "at most 300"),
]


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize(("case", "bias", "says"), BAD_BIASES, ids=[c[0] for c in BAD_BIASES])
def test_malformed_maps_are_400_naming_logit_bias(real: ServerHarness, route: str, case: str, bias: Any,
                                                   says: str) -> None:
    client = real.openai()
    with pytest.raises(openai.BadRequestError) as info:
        if route == "chat":
            client.chat.completions.create(model="m", messages=USER, max_tokens=1, logit_bias=bias)
        else:
            client.completions.create(model="m", prompt="Hi", max_tokens=1, logit_bias=bias)
    assert info.value.status_code == 400 and info.value.param == "logit_bias", case
    assert says in info.value.message and "logit_bias" in info.value.message


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_values_are_400(real: ServerHarness, route: str, value: bytes) -> None:
    head = b'"messages": [{"role": "user", "content": "Hi"}]' if route.startswith("chat") else b'"prompt": "Hi"'
    body = b'{"model": "m", "max_tokens": 1, ' + head + b', "logit_bias": {"7": ' + value + b"}}"
    r = httpx.post(f"{real.base_url}/v1/{route}", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text


def test_the_vocabulary_is_the_one_the_model_samples_over(real: ServerHarness) -> None:
    client = real.openai()
    vocab = real.engine.vocab_size  # type: ignore[attr-defined]
    assert vocab > 151669  # past the tokenizer's own ids: the model still samples over them
    ok = client.chat.completions.create(messages=USER, logit_bias={str(vocab - 1): -100, "0": 5}, **GREEDY)
    assert ok.choices[0].finish_reason == "length"
    for route in ("chat", "completions"):
        with pytest.raises(openai.BadRequestError) as info:
            if route == "chat":
                client.chat.completions.create(model="m", messages=USER, max_tokens=1, logit_bias={str(vocab): 1})
            else:
                client.completions.create(model="m", prompt="Hi", max_tokens=1, logit_bias={str(vocab): 1})
        assert info.value.param == "logit_bias" and "outside the vocabulary" in info.value.message
    # Nothing refused above reached the engine or hurt it: plain requests still answer, and null is no bias.
    again = client.chat.completions.create(messages=USER, logit_bias=None, **GREEDY)
    assert again.choices[0].message.content == client.chat.completions.create(messages=USER, **GREEDY).choices[0].message.content
