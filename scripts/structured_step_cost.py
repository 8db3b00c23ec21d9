"""What a structured request costs the engine's decode step (docs/api.md, "Cost"): a batch
decoded plain, then with one of its rows held to a strict tool set while it writes text
(no mask, but overlap completes each step before the next: its mask would need the last
token), then with that row inside a think block (no mask whatever comes: overlap goes on),
then with one row inside a JSON value (a mask built and copied every step), and with a
JSON row still inside its think block (its next mask picked on the device: overlap goes on).

Greedy, `ignore_eos`, every row `--tokens` long, one engine; the settings interleaved over
`--rounds` rounds after a warm-up run each (the median kept: a busy host moves single
runs). Prints one JSON line per (batch, setting) and writes them all to
$OUT/structured_step_cost.json when OUT is set.

    PYTHONPATH=src python3 scripts/structured_step_cost.py                       # CPU, demo model
    OUT=... PYTHONPATH=/tmp/site:src python3 scripts/structured_step_cost.py \\
        --model random:qwen3-30b-a3b --moe-backend resident --batch 1 8        # GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from edgemoe import LLM, SamplingParams, StructuredOutput
from edgemoe.structured.call_schema import call_schema

PROMPT = [151644, 872, 198, 3838, 374, 279]
OPEN_CALL = 151657  # <tool_call>: banned in the "calls" row, so it stays in free text
THINK_OPEN, THINK_CLOSE = 151667, 151668  # the "thinking" row's prompt opens a block it never closes
TOOLS = json.dumps(call_schema([("note", {"type": "object", "properties": {"text": {"type": "string"}}})]))
SETTINGS = {
    "plain": None,
    "calls row, text": StructuredOutput(schema=TOOLS, target="calls"),
    "calls row, thinking": StructuredOutput(schema=TOOLS, target="calls", reasoning="open"),
    "json row": StructuredOutput(schema=json.dumps({"type": "array", "items": {"type": "string"}})),
    "json row, thinking": StructuredOutput(schema=json.dumps({"type": "array", "items": {"type": "string"}}),
                                           reasoning="open"),
}


def params(spec: StructuredOutput | None, tokens: int, row: int) -> SamplingParams:
    bias = None
    if spec is not None and spec.target == "calls":
        bias = {OPEN_CALL: -100.0, THINK_CLOSE: -100.0}
    elif spec is not None and spec.reasoning == "open":
        bias = {THINK_CLOSE: -100.0}
    return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logit_bias=bias,
                          structured=spec if row == 0 else None)


def timed(llm: LLM, spec: StructuredOutput | None, batch: int, tokens: int) -> float:
    """Decode tokens a second over the batch (prefill of the short prompt included)."""
    plist = [params(spec, tokens, row) for row in range(batch)]
    thinking = spec is not None and spec.reasoning == "open"
    prompts = [PROMPT + [THINK_OPEN] if thinking and row == 0 else PROMPT for row in range(batch)]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, plist)
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="default: the demo model")
    ap.add_argument("--moe-backend", default=None)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    settings = {"moe_backend": args.moe_backend} if args.moe_backend else {}
    rows = []
    with LLM(args.model, **settings) as llm:
        for batch in args.batch:
            for spec in SETTINGS.values():
                timed(llm, spec, batch, 16)  # warm-up: graphs, the trie, the masks' cache
            rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
            for _ in range(args.rounds):
                for name, spec in SETTINGS.items():
                    rates[name].append(timed(llm, spec, batch, args.tokens))
            plain = statistics.median(rates["plain"])
            for name, runs in rates.items():
                rate = statistics.median(runs)
                row = {"batch": batch, "setting": name, "tok_s": round(rate, 1), "of_plain": round(rate / plain, 3),
                       "runs": [round(r, 1) for r in runs]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "structured_step_cost.json"), "w") as f:
            json.dump({"model": args.model or "demo", "tokens": args.tokens, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
