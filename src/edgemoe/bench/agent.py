"""`edgemoe bench agent`: replay a synthetic coding-agent session against a server.

A session is a system prompt with tool definitions (~`--system-tokens`), then turns
that alternate user requests, assistant tool calls with tool results (code-like text of
~`--tool-result-tokens`), and assistant answers that are the model's real output fed
back. Each turn resends the whole conversation, as agents do. Per turn it records the
time to first token, prompt tokens, cached tokens (`usage.prompt_tokens_details`) and
the tokens actually prefilled. Without `--url` it starts `edgemoe serve` itself once per
`--cache-types` value, so the same session runs with and without the prefix cache.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from edgemoe.bench.results import plot_lines, write_result
from edgemoe.bench.server_proc import running_server

WORDS = (
    "def class return self value index buffer parse token cache page expert layer slot "
    "request stream event config error result offset length window batch route weight"
).split()


def code_text(rng: random.Random, approx_tokens: int) -> str:
    """Deterministic code-like text of roughly `approx_tokens` tokens (~4 chars each)."""
    lines, size = [], 0
    while size < approx_tokens * 4:
        indent = "    " * rng.randrange(0, 3)
        w = rng.sample(WORDS, 4)
        line = f"{indent}{w[0]}_{w[1]} = {w[2]}({w[3]}, {rng.randrange(1000)})"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
        "required": ["path"]}}}
    for name, desc in [("read_file", "Read a file"), ("grep", "Search files"), ("edit_file", "Edit a file")]
]


def session_step(rng: random.Random, turn: int, tool_tokens: int) -> list[dict[str, Any]]:
    """New messages appended before turn `turn`'s request."""
    if turn % 2 == 0:
        return [{"role": "user", "content": f"Step {turn}: please look at {rng.choice(WORDS)}.py and fix it."}]
    call_id = f"call_{turn}"
    call = {"id": call_id, "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/{rng.choice(WORDS)}.py"})}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": code_text(rng, tool_tokens)},
    ]


class ContextFull(Exception):
    """The server refused the turn: prompt longer than the context."""


def stream_turn(client: Any, url: str, model: str, messages: list, max_tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage = None, [], {}
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as r:
        if r.status_code != 200:
            body_text = r.read().decode(errors="replace")
            if "context_length_exceeded" in body_text:
                raise ContextFull(json.loads(body_text)["error"]["message"])
            raise RuntimeError(f"HTTP {r.status_code}: {body_text[:500]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                piece = delta.get("content") or delta.get("reasoning_content") or ""
                if (piece or delta.get("tool_calls")) and ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(delta.get("content") or "")
    total = time.perf_counter() - t0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft_s": ttft if ttft is not None else total, "total_s": total, "text": "".join(text),
            "prompt_tokens": usage.get("prompt_tokens", 0), "cached_tokens": cached,
            "prefilled_tokens": usage.get("prompt_tokens", 0) - cached}


def run_session(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import httpx

    rng = random.Random(args.session_seed)
    system = "You are a coding agent.\n" + code_text(rng, args.system_tokens)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    rows = []
    with httpx.Client() as client:
        for turn in range(args.turns):
            messages += session_step(rng, turn, args.tool_result_tokens)
            try:
                row = stream_turn(client, url, "edgemoe", messages, args.max_tokens)
            except ContextFull as e:
                print(f"turn {turn:3d}: the conversation no longer fits the context ({e}); session ends")
                break
            messages.append({"role": "assistant", "content": row.pop("text")})
            rows.append({"turn": turn, **row})
            print(f"turn {turn:3d}: prompt {row['prompt_tokens']:6d}  cached {row['cached_tokens']:6d}  "
                  f"prefilled {row['prefilled_tokens']:6d}  ttft {row['ttft_s']:7.3f}s")
    return rows


def run_agent_bench(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    import httpx

    from edgemoe.ctl import server_url

    if args.url is not None and settings:
        raise ValueError(f"--url talks to a running server; engine flags ({', '.join(sorted(settings))}) "
                         "belong to `edgemoe serve` there")
    given = server_url(args.url) if args.url is not None else None
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        if given is not None:
            runs["server"] = run_session(given, args)
        else:
            for cache_type in args.cache_types:
                print(f"== cache_type={cache_type}")
                with running_server({**settings, "cache_type": cache_type}) as url:
                    runs[cache_type] = run_session(url, args)
    except (RuntimeError, TimeoutError, httpx.HTTPError) as e:  # a server's own messages are above
        where = f" (--url {given})" if given is not None else ""
        print(f"edgemoe bench agent: {type(e).__name__}: {e}{where}", file=sys.stderr)
        return 1
    params = {k: getattr(args, k) for k in ("turns", "system_tokens", "tool_result_tokens", "max_tokens", "session_seed")}
    path = write_result(args.out, "agent", {"settings": settings, "params": params, "runs": runs})
    series = {f"prefilled ({k})": [(r["turn"], r["prefilled_tokens"]) for r in v] for k, v in runs.items()}
    series |= {f"prompt ({k})": [(r["turn"], r["prompt_tokens"]) for r in v] for k, v in runs.items() if k == next(iter(runs))}
    png = plot_lines(path, "edgemoe bench agent", "turn", "tokens", series)
    ttft = {k: [(r["turn"], r["ttft_s"]) for r in v] for k, v in runs.items()}
    plot_lines(path.with_name(path.stem + "-ttft.json"), "time to first token", "turn", "seconds", ttft)
    for k, v in runs.items():
        print(f"{k}: {session_summary(v)}")
    print(f"wrote {path} and {png}")
    return 0 if all(runs.values()) else 1


def session_summary(rows: list[dict[str, Any]]) -> str:
    """Prefilled share over the session and over turns after the first (what a prefix
    cache saves), and the mean TTFT."""
    if not rows:
        return "no turn completed (see the message above)"
    pre, prompt = sum(r["prefilled_tokens"] for r in rows), sum(r["prompt_tokens"] for r in rows)
    later = [r for r in rows if r["turn"] > 0]
    tail = ""
    if later:
        pre_l, prompt_l = sum(r["prefilled_tokens"] for r in later), sum(r["prompt_tokens"] for r in later)
        tail = f" ({pre_l / prompt_l:.1%} in turns after the first)"
    return (f"prefilled {pre} of {prompt} prompt tokens{tail}; "
            f"mean TTFT {sum(r['ttft_s'] for r in rows) / len(rows):.3f}s")
