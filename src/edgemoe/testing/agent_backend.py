"""A scripted engine for driving real coding-agent CLIs without a model (test-only).

`make agents-smoke` starts `edgemoe serve` with the environment variables
`EDGEMOE_ENGINE_FACTORY=edgemoe.testing.agent_backend:engine_from_env` and
`EDGEMOE_SCRIPTED_BACKEND=SPEC.json`; the engine process then builds this engine
instead of loading weights (see `edgemoe.engine.service.build_engine`). The spec is
`{"marker": "…", "record": "prompts.jsonl"}`, optionally with `"cut_call": true` (or a
count, N), `"parallel": true` or `"thinking": true`: see the sections below.

What it answers, from the rendered prompt (the demo model's Qwen3 template, Hermes
tool format):

- a prompt whose `<tool_response>` holds `edgemoe-smoke-42-MARKER` (the output of the
  command below): a final answer quoting it — the agent ran the tool and sent back
  its result;
- a prompt that offers a shell tool (`Bash`, `bash`, `shell`, `shell_command`,
  `exec_command`, …): one call of it running `echo edgemoe-smoke-$((6*7))-MARKER`, with
  the arguments shaped by the tool's schema (a string command, or an argv array);
- anything else (titles, summaries, quota probes): "OK.".

Cut calls (`cut_call`): the first N answers that would be the shell call are instead cut by
a length limit inside the command's string value (the agents' reactions: docs/agents.md,
"A call cut by a length limit"): the output is the call's text up to
`touch edgemoe-cut-MARKER; ec` of the command `touch edgemoe-cut-MARKER; echo …` and the
request finishes with finish_reason "length" (no EOS), so the server returns the call with
`{}` arguments. Should anything run that truncated command, the file `edgemoe-cut-MARKER`
appears in the agent's folder: the smoke test looks for it. Later prompts are answered as
above, so an agent that retries, or reports and is asked again, can finish.

Parallel calls (`parallel`): the shell call is instead two calls in one answer (two Hermes blocks),
the second running `echo edgemoe-smoke-$((6*9))-MARKER` (prints `edgemoe-smoke-54-MARKER`); the
answer comes once both outputs are back and quotes both. A prompt carrying only one of them gets
a call of the missing one alone (decision "missing_call"), so an agent that returns one result per
turn can still finish.

Thinking (`thinking`): the shell call and the final answer start with a `<think>…</think>` block
naming the decision and the marker (`reasoning_text`), as a Qwen3 model writes it when the prompt
leaves thinking on (the demo template then opens nothing; with thinking off it writes an empty
block, and the answer has none). The record says whether it thought (`thinks`), so the smoke test
can find that reasoning again in the next prompt: the agent sent it back and the template kept it.

Every prompt is appended to the record file with the decision taken (and the request's
`max_tokens`, which shows an agent retrying with a higher limit), so the smoke test can
check what the agent sent. No torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgemoe.detokenizer import TextStream
from edgemoe.messages import EngineReady, RequestOutput, SamplingParams
from edgemoe.tokenizer import TokenizerBundle

SPEC_ENV = "EDGEMOE_SCRIPTED_BACKEND"
FACTORY = "edgemoe.testing.agent_backend:engine_from_env"  # for EDGEMOE_ENGINE_FACTORY
SHELL_TOOLS = ("bash", "shell", "shell_command", "exec_command", "run_shell_command", "local_shell")
TOKENS_PER_STEP = 8
MAX_MODEL_LEN = 262_144  # agents' system prompts and tool lists run to tens of thousands of tokens

_TOOLS_BLOCK = re.compile(r"<tools>\n(.*?)\n</tools>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def tool_responses(prompt: str) -> list[str]:
    """The tool results a rendered prompt carries (the Qwen3 template's `<tool_response>` blocks)."""
    return _TOOL_RESPONSE.findall(prompt)


def expected_output(marker: str) -> str:
    """What the scripted command prints (its text never appears in the command itself)."""
    return f"edgemoe-smoke-42-{marker}"


def command(marker: str) -> str:
    return f"echo edgemoe-smoke-$((6*7))-{marker}"


def second_output(marker: str) -> str:
    """What the parallel scenario's second command prints."""
    return f"edgemoe-smoke-54-{marker}"


def second_command(marker: str) -> str:
    return f"echo edgemoe-smoke-$((6*9))-{marker}"


def reasoning_text(decision: str, marker: str) -> str:
    """The thinking scenario's reasoning before a `decision`: unique, so the next prompt shows where it went."""
    return f"edgemoe-think-{decision}-{marker}: the user wants the smoke-test command run and its output quoted."


def thinking_is_on(prompt: str) -> bool:
    """Whether the demo (Qwen3) template left thinking on: with it off, the prompt ends in an empty block."""
    return not prompt.endswith("<think>\n\n</think>\n\n")


def cut_file(marker: str) -> str:
    """The file the cut call's command would create, were its truncated text ever run."""
    return f"edgemoe-cut-{marker}"


def cut_command(marker: str) -> str:
    return f"touch {cut_file(marker)}; {command(marker)}"


def cut_call_text(call_text: str, cmd: str) -> str:
    """`call_text` (a Hermes call running `cmd`) cut inside the command's string value.

    The cut falls after the `touch …;` and two letters of `echo`: a runnable prefix, so
    running it by mistake leaves the file behind (an argv array is cut inside its last string).
    """
    start = call_text.index(json.dumps(cmd)) + 1  # past the value's opening quote
    prefix = cmd[:cmd.index("; echo") + len("; ec")]
    return call_text[:start] + json.dumps(prefix)[1:-1]


@dataclass
class _Request:
    plan: list[int]
    params: SamplingParams
    stream: TextStream
    prompt_len: int
    cut: bool = False  # the plan ends by a length limit, not EOS
    output: list[int] = field(default_factory=list)


class AgentScriptEngine:
    """An `EngineLike` playing the script above; one output of up to 8 tokens per step."""

    def __init__(self, tokenizer: TokenizerBundle, marker: str, record: Path, cut_calls: int = 0,
                 parallel: bool = False, thinking: bool = False) -> None:
        self.tokenizer = tokenizer
        self.marker = marker
        self.record = record
        self.cuts_left = cut_calls
        self.parallel = parallel
        self.thinking = thinking
        self.eos = sorted(tokenizer.eos_token_ids)[:1]
        self.requests: dict[str, _Request] = {}

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> str:
        if len(prompt_ids) >= MAX_MODEL_LEN:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens, the context length is {MAX_MODEL_LEN}")
        prompt = self.tokenizer.decode(prompt_ids)
        decision, text = self.answer(prompt)
        thinks = self.thinking and decision != "plain" and thinking_is_on(prompt)
        if thinks:
            text = f"<think>\n{reasoning_text(decision, self.marker)}\n</think>\n\n{text}"
        with self.record.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"request_id": request_id, "decision": decision, "prompt": prompt, "output": text,
                                "max_tokens": params.max_tokens, "thinks": thinks}) + "\n")
        cut = decision == "cut_call"
        plan = self.tokenizer.encode(text, add_special_tokens=False) + ([] if cut else self.eos)
        stream = TextStream.for_request(self.tokenizer.tokenizer, params)
        self.requests[request_id] = _Request(plan, params, stream, len(prompt_ids), cut)
        return request_id

    def answer(self, prompt: str) -> tuple[str, str]:
        """(decision, model output) for a rendered prompt."""
        wanted = expected_output(self.marker)
        if self.parallel:
            return self._parallel_answer(prompt)
        if any(wanted in block for block in tool_responses(prompt)):
            return "answer", f"The command printed {wanted}."
        tool = shell_tool(prompt)
        if tool is None:
            return "plain", "OK."
        if self.cuts_left > 0:
            self.cuts_left -= 1
            cmd = cut_command(self.marker)
            return "cut_call", cut_call_text(_call_text(tool, cmd), cmd)
        return "tool_call", _call_text(tool, command(self.marker))

    def _parallel_answer(self, prompt: str) -> tuple[str, str]:
        """Both commands' outputs back: the answer; none: both calls at once; one: the other alone."""
        outputs = {command(self.marker): expected_output(self.marker),
                   second_command(self.marker): second_output(self.marker)}
        results = tool_responses(prompt)
        missing = [cmd for cmd, out in outputs.items() if not any(out in block for block in results)]
        if not missing:
            return "answer", "The commands printed {} and {}.".format(*outputs.values())
        tool = shell_tool(prompt)
        if tool is None:
            return "plain", "OK."
        calls = "\n".join(_call_text(tool, cmd) for cmd in missing)
        return ("parallel_calls" if len(missing) == 2 else "missing_call"), calls

    def abort(self, request_id: str) -> RequestOutput | None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        return self._output(request_id, req, [], req.stream.finish().text, "abort", None)

    def has_work(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        return [self._advance(rid, req) for rid, req in list(self.requests.items())]

    def _advance(self, rid: str, req: _Request) -> RequestOutput:
        tokens: list[int] = []
        text = ""
        reason: tuple[str, str | None] | None = None
        while reason is None and len(tokens) < TOKENS_PER_STEP:
            token = req.plan[min(len(req.output), len(req.plan) - 1)]
            req.output.append(token)
            tokens.append(token)
            if token in self.eos:
                reason = ("stop", None)
                break
            delta = req.stream.push(token)
            text += delta.text
            if delta.stopped:
                reason = ("stop", req.stream.stop_reason)
            elif req.params.max_tokens is not None and len(req.output) >= req.params.max_tokens:
                reason = ("length", None)
            elif req.cut and len(req.output) >= len(req.plan):
                reason = ("length", None)  # as if max_tokens had run out here
        if reason is None:
            return self._output(rid, req, tokens, text, None, None)
        del self.requests[rid]
        return self._output(rid, req, tokens, text + req.stream.finish().text, *reason)

    @staticmethod
    def _output(rid: str, req: _Request, tokens: list[int], text: str, finish: str | None,
                stop: str | None) -> RequestOutput:
        return RequestOutput(request_id=rid, token_ids=tokens, text=text, finished=finish is not None,
                             finish_reason=finish, stop_reason=stop, num_prompt_tokens=req.prompt_len,
                             num_output_tokens=len(req.output))


def _call_text(tool: dict[str, Any], cmd: str) -> str:
    call = {"name": tool["name"], "arguments": shell_arguments(tool, cmd)}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def shell_tool(prompt: str) -> dict[str, Any] | None:
    """The first shell-like function the prompt's `<tools>` block offers."""
    match = _TOOLS_BLOCK.search(prompt)
    if match is None:
        return None
    for line in match.group(1).split("\n"):
        try:
            tool = json.loads(line)
        except json.JSONDecodeError:
            continue
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and str(function.get("name", "")).lower() in SHELL_TOOLS:
            return function
    return None


def shell_arguments(tool: dict[str, Any], cmd: str) -> dict[str, Any]:
    """Arguments for running `cmd` with this tool, shaped by its JSON schema."""
    props = (tool.get("parameters") or {}).get("properties") or {}
    key = next((k for k in ("command", "cmd") if k in props), "command")
    args: dict[str, Any] = {key: ["bash", "-lc", cmd] if props.get(key, {}).get("type") == "array" else cmd}
    if "description" in props:
        args["description"] = "Print the smoke-test marker"
    return args


def build_agent_backend(settings: dict[str, Any], spec_path: str) -> tuple[AgentScriptEngine, EngineReady]:
    """The engine and its ready message, for `edgemoe.engine.service.build_engine`."""
    from edgemoe.assets.demo import demo_model_path

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    model_dir = Path(settings["model"]) if settings.get("model") else demo_model_path()
    tokenizer = TokenizerBundle.load(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    engine = AgentScriptEngine(tokenizer, str(spec["marker"]), Path(spec["record"]), int(spec.get("cut_call", 0)),
                               bool(spec.get("parallel")), bool(spec.get("thinking")))
    ready = EngineReady(
        model_dir=str(model_dir.resolve()), model_type=str(config.get("model_type", "qwen3_moe")),
        max_model_len=MAX_MODEL_LEN, vocab_size=int(config.get("vocab_size", 151936)),
        eos_token_ids=sorted(tokenizer.eos_token_ids), pid=os.getpid(),
    )
    return engine, ready


def engine_from_env(settings: dict[str, Any]) -> tuple[AgentScriptEngine, EngineReady]:
    """The `EDGEMOE_ENGINE_FACTORY` entry point: the spec path comes from `EDGEMOE_SCRIPTED_BACKEND`."""
    spec = os.environ.get(SPEC_ENV)
    if not spec:
        raise ValueError(f"{SPEC_ENV} must name the scripted backend's spec file")
    return build_agent_backend(settings, spec)
