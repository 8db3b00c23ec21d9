"""Command line: argparse → config objects → the command. Nothing else lives here.

Engine flags are generated from the config dataclasses (`edgemoe.config`), so the flag
`--foo-bar`, the field and the `LLM(foo_bar=...)` keyword cannot drift apart. Every
flag's help ends with its default (`Help`), taken from the same dataclasses.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgemoe import __version__
from edgemoe.config import setting_fields, three_state

DESCRIPTION = """\
edgemoe serves Mixture-of-Experts language models (Qwen3-MoE, OLMoE, Mixtral, ...) from one
GPU plus host RAM: the experts live in host memory, the ones in use are cached in GPU
slots, and misses are copied over PCIe or computed on the CPU. It speaks the OpenAI and
Anthropic HTTP APIs (coding agents work against it unchanged), shows a web page with a
chat and a live view of the expert cache, and chats in the terminal."""

EPILOG = """\
getting started:
  edgemoe serve                          the demo model (random weights) on http://127.0.0.1:1919;
                                         open that address for the web page
  edgemoe serve --model ~/models/Qwen3-30B-A3B --gpu-memory 16GiB
  edgemoe chat                           chat in the terminal (in-process; --url for a server)
  edgemoe plan --model random:qwen3-30b-a3b --gpu-memory 16GiB
                                         memory plan and predicted speed, before any download
  edgemoe launch claude                  a server plus Claude Code pointed at it (or codex, opencode)

'edgemoe COMMAND --help' describes each command; docs/ in the source tree has a page per command."""


class Help(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and ends every flag's help with its default
    (unless the help already says what it is)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or action.nargs == 0 or not action.option_strings:
            return text  # said already, kept elsewhere (`_with_default`), a switch, or a positional
        shown = " ".join(map(str, action.default)) if isinstance(action.default, list) else action.default
        shown = "none" if shown is None else shown
        return f"{text} (default: {shown})".strip()


def _with_default(help_text: str | None, default: Any) -> str:
    """Help for a flag whose default argparse cannot see (SUPPRESS keeps the dataclass's)."""
    text = help_text or ""
    if "default" in text:
        return text
    return f"{text} (default: {'none' if default is None else default})".strip()


def _flag_type(annotation: Any) -> type:
    text = str(annotation)
    if "int" in text:
        return int
    if "float" in text:
        return float
    return str


def prompt_shape(text: str) -> tuple[int, int]:
    """argparse type: "TOKENSxEXPERTS" (e.g. 32x16) → (tokens, experts a call)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a prompt shape is TOKENSxEXPERTS, e.g. 32x16 (got {text!r})")
    return int(parts[0]), int(parts[1])


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse names the flag and exits 2 otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def positive_float(text: str, zero: bool = False) -> float:
    """argparse type: a finite number > 0 (`zero`: >= 0)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (value >= 0 if zero else value > 0) or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a {'non-negative' if zero else 'positive'} number, got {text}")
    return value


def non_negative(text: str) -> float:
    return positive_float(text, zero=True)


def result_dir(text: str) -> str:
    """argparse type: a folder results can be written to, made now (not after a run of minutes)."""
    try:
        Path(text).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write results to {text!r}: {e.strerror or e}") from None
    return text


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per engine setting, named after the field."""
    group = parser.add_argument_group("engine")
    for f in setting_fields():
        flag = "--" + f.name.replace("_", "-")
        if three_state(f):  # unset: decided at start-up; --foo / --no-foo say so
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                               help=f.metadata.get("help"))
            continue
        if "bool" in str(f.type):
            group.add_argument(flag, dest=f.name, action="store_true", default=argparse.SUPPRESS,
                               help=f.metadata.get("help"))
            continue
        group.add_argument(
            flag,
            dest=f.name,
            type=_flag_type(f.type),
            default=argparse.SUPPRESS,  # unset flags keep the dataclass default
            choices=f.metadata.get("choices"),
            help=_with_default(f.metadata.get("help"), f.default),
        )


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ServerConfig field (`edgemoe.server.config`), named after the field."""
    from dataclasses import fields

    from edgemoe.server.config import ServerConfig

    group = parser.add_argument_group("server")
    for f in fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        if "bool" in str(f.type):
            group.add_argument(flag, dest=f.name, action="store_true", default=argparse.SUPPRESS,
                               help=f.metadata.get("help"))  # a switch: off unless given
            continue
        group.add_argument(
            flag,
            dest=f.name,
            type=f.metadata.get("parse") or _flag_type(f.type),
            default=argparse.SUPPRESS,
            choices=f.metadata.get("choices"),
            help=_with_default(f.metadata.get("help"), f.default),
        )


def server_settings(args: argparse.Namespace) -> dict[str, Any]:
    from edgemoe.server.config import server_setting_names

    names = set(server_setting_names())
    return {k: v for k, v in vars(args).items() if k in names}


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    names = {f.name for f in setting_fields()}
    return {k: v for k, v in vars(args).items() if k in names}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgemoe", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"edgemoe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="the HTTP server (OpenAI + Anthropic APIs) and the web page at /")
    add_server_flags(serve)
    serve.add_argument("--api-key-file", default=None, metavar="PATH",
                       help="read the API key from this file (the key alone; default: $EDGEMOE_API_KEY)")
    add_engine_flags(serve)

    from edgemoe.chat import add_chat_parser

    add_chat_parser(sub, add_engine_flags)

    gen = sub.add_parser("generate", help="generate from one or more prompts, in-process")
    add_engine_flags(gen)
    gen.add_argument("--prompt", action="append", required=True, help="a prompt (repeatable)")
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message with the chat template")
    gen.add_argument("--max-tokens", type=int, default=64, help="most tokens generated per prompt")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep this share of probability")
    gen.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: off)")
    gen.add_argument("--sample-seed", type=int, default=None, help="per-request sampling seed (default: none)")

    conv = sub.add_parser("convert", help="quantise a checkpoint's experts once, written in a standard layout")
    conv.add_argument("--model", required=True, help="model directory (Hugging Face layout; may be quantised)")
    conv.add_argument("--expert-dtype", required=True, choices=("fp8", "int8", "int4", "mxfp4", "bf16"),
                      help="fp8: Qwen FP8 blocks; int8/int4: compressed-tensors; mxfp4: gpt-oss; bf16: dequantised")
    conv.add_argument("--out", required=True, help="output directory (new or empty)")

    from edgemoe.ctl import add_ctl_parser
    from edgemoe.launch import add_launch_parser
    from edgemoe.plan import add_plan_parser

    add_plan_parser(sub)
    add_launch_parser(sub, add_engine_flags)
    add_ctl_parser(sub)

    bench = sub.add_parser("bench", help="benchmarks (decode, agent, bw); results under bench/results/")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    dec = bench_sub.add_parser("decode", help="prefill and decode tok/s")
    add_engine_flags(dec)
    dec.add_argument("--prompt-tokens", type=positive_int, nargs="+", default=[128, 512])
    dec.add_argument("--decode-tokens", type=positive_int, default=64, help="tokens timed after the first")
    dec.add_argument("--batch-sizes", type=positive_int, nargs="+", default=[1, 4])
    dec.add_argument("--profile", action="store_true",
                     help="also break decode steps down by region (CUDA events) and count launches/host syncs")
    dec.add_argument("--profile-steps", type=positive_int, default=16, help="decode steps profiled per run")
    dec.add_argument("--out", default="bench/results", type=result_dir, help="result folder")
    agent = bench_sub.add_parser("agent", help="replay a synthetic coding-agent session against a server")
    add_engine_flags(agent)
    agent.add_argument("--url", default=None, help="a running server; default: start one per --cache-types value")
    agent.add_argument("--cache-types", nargs="+", default=["radix", "none"], help="servers to start (without --url)",
                       choices=next(f.metadata["choices"] for f in setting_fields() if f.name == "cache_type"))
    agent.add_argument("--turns", type=positive_int, default=20)
    agent.add_argument("--system-tokens", type=positive_int, default=8000, help="system prompt + tools size")
    agent.add_argument("--tool-result-tokens", type=positive_int, default=1800)
    agent.add_argument("--max-tokens", type=positive_int, default=64, help="tokens generated per turn")
    agent.add_argument("--session-seed", type=int, default=0, help="seed of the synthetic session")
    agent.add_argument("--out", default="bench/results", type=result_dir, help="result folder")
    qe = bench_sub.add_parser("quant-error", help="relative error of each MoE layer's output per expert format")
    add_engine_flags(qe)
    qe.add_argument("--formats", nargs="+", default=["fp8", "int8", "int4", "mxfp4"],
                    choices=("bf16", "fp8", "int8", "int4", "mxfp4"))
    qe.add_argument("--prompts", type=positive_int, default=4)
    qe.add_argument("--prompt-tokens", type=positive_int, default=64)
    qe.add_argument("--out", default="bench/results", type=result_dir, help="result folder")
    mq = bench_sub.add_parser("moe-quant", help="fused MoE kernels over quantised slot banks (GPU)")
    mq.add_argument("--formats", nargs="+", default=["bf16", "fp8", "int8", "int4", "mxfp4"],
                    choices=("bf16", "fp8", "int8", "int4", "mxfp4"))
    mq.add_argument("--hidden", type=positive_int, default=2048)
    mq.add_argument("--intermediate", type=positive_int, default=768)
    mq.add_argument("--slots", type=positive_int, default=64, help="experts in the slot banks the routing draws from")
    mq.add_argument("--prefill-tokens", type=positive_int, default=4096)
    mq.add_argument("--reps", type=positive_int, default=200)
    mq.add_argument("--out", default="bench/results", type=result_dir, help="result folder")
    bw = bench_sub.add_parser("bw", help="host memory, CPU expert kernel and host-device copy bandwidth")
    bw.add_argument("--threads", type=positive_int, default=None, help="CPU expert threads (default: physical cores)")
    bw.add_argument("--kernels", nargs="+", default=None, help="CPU expert kernels (default: all this CPU runs + torch)")
    bw.add_argument("--weights", nargs="+", default=["bf16", "int8", "fp8", "int4", "mxfp4"],
                    choices=("bf16", "int8", "fp8", "int4", "mxfp4"),
                    help="CPU expert weight formats measured (bf16 always runs)")
    bw.add_argument("--read-gib", type=positive_float, default=1.0, help="buffer size for the host read bandwidth")
    bw.add_argument("--pool-mib", type=positive_int, default=1024, help="expert pool the calls rotate through (> caches)")
    bw.add_argument("--hidden", type=positive_int, default=2048, help="expert shape: hidden size H (Qwen3-30B-A3B)")
    bw.add_argument("--intermediate", type=positive_int, default=768, help="expert shape: intermediate size I")
    bw.add_argument("--seconds", type=non_negative, default=0.5, help="minimum time per measurement")
    bw.add_argument("--prompt-shapes", nargs="*", type=prompt_shape, default=[(32, 16), (16, 32)],
                    metavar="TOKENSxEXPERTS",
                    help="prompt-shaped calls on the blocked kernels: tokens each x experts a call (a prompt chunk's "
                         "CPU share of a layer; default: %(default)s); none: skip")
    bw.add_argument("--out", default="bench/results", type=result_dir, help="result folder")
    _format_all(parser)
    return parser


def _format_all(parser: argparse.ArgumentParser) -> None:
    """`Help` for the parser and every subcommand's, however deep."""
    parser.formatter_class = Help
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _format_all(child)


def run_generate(args: argparse.Namespace, settings: dict[str, Any]) -> int:
    from edgemoe import LLM, SamplingParams
    from edgemoe.config import EngineConfig
    from edgemoe.engine.model_source import resolve_model

    params = SamplingParams(
        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        max_tokens=args.max_tokens, seed=args.sample_seed,
    )
    # Everything a person typed is checked before the (slow) load: sampling, settings, --model.
    params.validate()
    if not all(args.prompt) and not args.chat:  # an empty raw prompt has no token to start from
        raise ValueError("--prompt is empty: give the text to continue (or --chat, which wraps it in a turn)")
    resolve_model(EngineConfig.from_kwargs(**settings).model.model)
    with LLM(progress=True, **settings) as llm:
        for prompt in args.prompt:
            if args.chat:
                prompt = _chat_prompt(llm.tokenizer, prompt)
            print(f"### {prompt!r}")
            for delta in llm.stream(prompt, params):
                print(delta.text, end="", flush=True)
            print(f"\n### finish_reason={delta.finish_reason}")
    return 0


def _chat_prompt(tokenizer: Any, text: str) -> str:
    from edgemoe.server.templates import ChatTemplate

    if not tokenizer.chat_template:
        raise ValueError("--chat: the model has no chat template (chat_template.jinja or tokenizer_config.json)")
    name = str(tokenizer.chat_template_path or "<chat_template>")  # errors name the file
    template = ChatTemplate(tokenizer.chat_template, bos_token=None, eos_token=None, name=name)
    try:
        return template.render([{"role": "user", "content": text}], add_generation_prompt=True)
    except ValueError as e:  # the template's own words (raise_exception, an undefined name)
        raise ValueError(f"--chat: {name}: the chat template failed: {e}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if argv[:1] == ["launch"] and "--" in argv:  # `launch AGENT [flags] -- ARGS`: ARGS are the agent's
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if args.command == "launch":
        args.agent_args = passthrough
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="edgemoe: %(message)s")
    try:
        if args.command == "generate":
            return run_generate(args, engine_settings(args))
        if args.command == "serve":
            from edgemoe.serve import run_serve
            from edgemoe.server.api_key import resolve_api_key
            from edgemoe.server.config import ServerConfig

            settings = server_settings(args)
            settings["api_key"] = resolve_api_key(settings.get("api_key"), args.api_key_file, os.environ)
            return run_serve(ServerConfig(**settings), engine_settings(args))
        if args.command == "chat":
            from edgemoe.chat import run_chat

            return run_chat(args, engine_settings(args))
        if args.command == "plan":
            from edgemoe.plan import run_plan

            return run_plan(args)
        if args.command == "launch":
            from edgemoe.launch import run_launch

            return run_launch(args, engine_settings(args))
        if args.command == "convert":
            from edgemoe.convert import run_convert

            return run_convert(args)
        if args.command == "ctl":
            from edgemoe.ctl import run_ctl

            return run_ctl(args)
        if args.command == "bench" and args.bench == "bw":
            from edgemoe.bench.bandwidth import run_bw_bench

            return run_bw_bench(args)
        if args.command == "bench" and args.bench == "quant-error":
            from edgemoe.bench.quant_error import run_quant_error

            return run_quant_error(args, engine_settings(args))
        if args.command == "bench" and args.bench == "moe-quant":
            from edgemoe.bench.moe_quant import run_moe_quant_bench

            return run_moe_quant_bench(args)
        if args.command == "bench" and args.bench == "agent":
            from edgemoe.bench.agent import run_agent_bench

            return run_agent_bench(args, engine_settings(args))
        if args.command == "bench":
            from edgemoe.bench.decode import run_decode_bench

            return run_decode_bench(args, engine_settings(args))
    except (ValueError, FileNotFoundError, FileExistsError, TypeError) as e:
        print(f"edgemoe {args.command}: error: {e}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2



if __name__ == "__main__":
    sys.exit(main())
