"""How `scripts/agents_smoke.py` judges its cut-call, parallel-calls and thinking scenarios, from
what a run left behind: the recorded prompts, the agent's output, its exit status and the
server's access log. Pure functions, so tests can feed made-up runs.

- cut-call: the backend cuts the first N shell calls by a length limit inside the command; the
  agent must crash on nothing, never run the truncated command, never see the cut call's raw
  text, and recover or report the limit as it was seen to (`EXPECTED_CUT_OUTCOME`).
- parallel-calls: the backend asks for two shell calls in one answer; the agent must run both
  and send both results back (in one request or over two), and print the answer quoting both.
- thinking: the shell call and the answer start with a `<think>` block; the agent must get
  through the turn with every follow-up request accepted. What each agent did with the
  reasoning (sent it back or not) and how the template rendered it are recorded, and held to
  what was seen (`EXPECTED_REASONING_ECHO`), so a change on either side shows.
"""

from __future__ import annotations

import re
from typing import Any

from edgemoe.testing.agent_backend import (
    command,
    cut_file,
    expected_output,
    reasoning_text,
    second_command,
    second_output,
    tool_responses,
)

# A Python traceback, a Rust panic, or a Node stack frame / unhandled rejection.
CRASH = re.compile(r"Traceback \(most recent call last\)|panicked at|^\s+at .+:\d+:\d+\)?$"
                   r"|UnhandledPromiseRejection|Uncaught \w*Error", re.MULTILINE)
# The server's access log: `edgemoe: HOST:PORT "POST /v1/messages" 200 …`.
_ACCESS = re.compile(r'"([A-Z]+ \S+)" (\d{3})\b')
_ASSISTANT_TURN = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)

# What each agent does with its reasoning in the next request, and so what the next prompt
# shows (with the versions docs/agents.md names): "kept" when the reasoning comes back and the
# template renders it as the `<think>` block before the call, "dropped" when it does not come back.
EXPECTED_REASONING_ECHO: dict[str, str] = {"claude": "kept", "codex": "kept", "opencode": "kept"}

Prompts = list[dict[str, Any]]


def tool_results(prompts: Prompts) -> list[str]:
    """The distinct tool results the agent sent back, in order (each prompt resends the earlier ones)."""
    seen: list[str] = []
    for p in prompts:
        for block in tool_responses(p["prompt"]):
            if block not in seen:
                seen.append(block)
    return seen


def server_errors(log: str) -> list[str]:
    """The requests the server answered with a 4xx/5xx status, and any traceback it logged."""
    bad = [f"{req} {status}" for req, status in _ACCESS.findall(log) if int(status) >= 400]
    return bad + ["server traceback"] * ("Traceback (most recent call last)" in log)


def _common_problems(code: int | None, decisions: list[str], crash: str | None, errors: list[str]) -> list[str]:
    problems = ["ran into the timeout"] * (code is None) + [f"exit {code}"] * (code not in (0, None))
    problems += [f"crashed ({crash})"] * bool(crash) + [f"server answered {e}" for e in errors]
    return problems + ["the model never answered (no tool result came back)"] * ("answer" not in decisions)


def _crash(out: str, err: str) -> str | None:
    match = CRASH.search(out + "\n" + err)
    return match.group(0).strip() if match else None


# --------------------------------------------------------------------------- cut-call

# What each CLI does with a shell call cut by a length limit (arguments `{}`, finish_reason
# "length"), as observed with the versions docs/agents.md names:
# - recovers: its own argument check fails, the error goes back as the tool's result, it asks
#   again and gets on with the turn (it asks again after every cut, however many: it never
#   gives up, nor raises its output limit);
# - reports: it ends the turn with an error naming the limit, exit status non-zero, runs nothing.
EXPECTED_CUT_OUTCOME = {"claude": "recovers", "codex": "reports", "opencode": "recovers"}
_LIMIT_ERROR = re.compile(r"max_output_tokens|max_tokens|incomplete response|output token limit", re.IGNORECASE)


def cut_outcome(code: int | None, decisions: list[str], printed: bool, output: str) -> str:
    """recovers | reports | loops (ran into the timeout) | other."""
    if code is None:
        return "loops"
    if code == 0 and "answer" in decisions and printed:
        return "recovers"
    if code != 0 and "answer" not in decisions and _LIMIT_ERROR.search(output):
        return "reports"
    return "other"


def cut_call_problems(agent: str, outcome: str, crash: str | None, ran_cut: bool, tail_seen: bool,
                      cuts_served: int, cuts: int) -> list[str]:
    """Why the cut-call run fails; none: PASS."""
    problems = [f"crashed ({crash})"] * bool(crash) + ["ran the truncated command"] * ran_cut
    if tail_seen:  # the server drops a cut call's raw tail (docs/api.md, "Calls cut by a length limit")
        problems.append("the cut call's raw text reached the agent")
    if cuts_served == 0:
        problems.append("no request offered the shell tool: nothing was cut")
    if outcome != EXPECTED_CUT_OUTCOME.get(agent):
        problems.append(f"{outcome}, expected {EXPECTED_CUT_OUTCOME.get(agent)}")
    if outcome == "recovers" and cuts_served != cuts:
        problems.append(f"recovered after {cuts_served} of {cuts} cut calls")
    return problems


def cut_call_verdict(agent: str, prompts: Prompts, out: str, err: str, code: int | None, marker: str,
                     cuts: int, ran_cut: bool) -> tuple[list[str], str]:
    """(problems, detail) of a cut-call run; `cuts`: the calls the backend was to cut; `ran_cut`: the
    file the cut command's text would create was found. No problems: PASS."""
    decisions = [p["decision"] for p in prompts]
    outcome = cut_outcome(code, decisions, expected_output(marker) in out, out + err)
    # The cut text named the file; it reaches the agent only if the server passed the raw tail on.
    tail_seen = any(cut_file(marker) in p["prompt"] for p in prompts) or cut_file(marker) in out + err
    problems = cut_call_problems(agent, outcome, _crash(out, err), ran_cut, tail_seen,
                                 decisions.count("cut_call"), cuts)
    results = [r[:100] for r in tool_results(prompts)]
    detail = (f"{outcome}: exit {code}, {len(decisions)} requests ({decisions.count('cut_call')} cut), "
              f"tool results {results}, raw tail reached the agent: {tail_seen}")
    return problems, detail


# --------------------------------------------------------------------------- parallel-calls


def results_per_request(prompts: Prompts, marker: str) -> list[int]:
    """For each request after the two calls, how many of the two outputs it newly carried."""
    wanted = (expected_output(marker), second_output(marker))
    counts: list[int] = []
    seen: set[str] = set()
    for p in prompts:
        blocks = tool_responses(p["prompt"])
        new = {w for w in wanted if any(w in b for b in blocks)} - seen
        if new:
            counts.append(len(new))
            seen |= new
    return counts


def calls_in_one_turn(prompts: Prompts, marker: str) -> bool:
    """Whether a later prompt renders both calls in one assistant turn, as the model wrote them."""
    cmds = (command(marker), second_command(marker))
    return any(all(c in turn for c in cmds) for p in prompts for turn in _ASSISTANT_TURN.findall(p["prompt"]))


def parallel_verdict(prompts: Prompts, out: str, err: str, code: int | None, marker: str,
                     log: str) -> tuple[list[str], str]:
    """(problems, detail) of a parallel-calls run; no problems: PASS."""
    decisions = [p["decision"] for p in prompts]
    printed = [w in out for w in (expected_output(marker), second_output(marker))]
    problems = _common_problems(code, decisions, _crash(out, err), server_errors(log))
    problems += ["no request offered the shell tool"] * ("parallel_calls" not in decisions)
    problems += ["the answer quoting both outputs was not printed"] * (not all(printed))
    per_request = results_per_request(prompts, marker)
    detail = (f"exit {code}, requests {decisions}, results per request {per_request} "
              f"({'one turn' if per_request == [2] else 'over several turns'}), both calls in one assistant turn "
              f"of the history: {calls_in_one_turn(prompts, marker)}, answer printed: {all(printed)}")
    return problems, detail


# --------------------------------------------------------------------------- thinking


def reasoning_echo(prompts: Prompts, marker: str) -> str:
    """What the requests after the thinking shell call show of its reasoning.

    kept: rendered back as the `<think>` block right before the call, as the model wrote it;
    elsewhere: present, but not so; dropped: absent; none: no request came after it.
    """
    first = next((i for i, p in enumerate(prompts) if p["decision"] == "tool_call" and p.get("thinks")), None)
    later = prompts[first + 1:] if first is not None else []
    if not later:
        return "none"
    text = reasoning_text("tool_call", marker)
    if any(f"<think>\n{text}\n</think>\n\n<tool_call>" in p["prompt"] for p in later):
        return "kept"
    return "elsewhere" if any(text in p["prompt"] for p in later) else "dropped"


def history_verbatim(prompts: Prompts) -> bool:
    """Whether the next prompt holds the thinking call's output byte for byte (the prefix cache reuses it)."""
    calls = [i for i, p in enumerate(prompts) if p["decision"] == "tool_call" and p.get("thinks")]
    return bool(calls) and any(prompts[calls[0]]["output"] in p["prompt"] for p in prompts[calls[0] + 1:])


def thinking_verdict(agent: str, prompts: Prompts, out: str, err: str, code: int | None, marker: str,
                     log: str) -> tuple[list[str], str]:
    """(problems, detail) of a thinking run; no problems: PASS."""
    decisions = [p["decision"] for p in prompts]
    thought = [p["decision"] for p in prompts if p.get("thinks")]
    printed = expected_output(marker) in out
    echo = reasoning_echo(prompts, marker)
    problems = _common_problems(code, decisions, _crash(out, err), server_errors(log))
    problems += ["the shell call came without thinking (thinking off?)"] * ("tool_call" not in thought)
    problems += ["the answer was not printed"] * (not printed)
    problems += ["a raw <think> tag reached the agent's output"] * ("<think>" in out + err)
    if echo != EXPECTED_REASONING_ECHO.get(agent):
        problems.append(f"reasoning {echo}, expected {EXPECTED_REASONING_ECHO.get(agent)}")
    shown = any(reasoning_text(d, marker) in out + err for d in ("tool_call", "answer"))
    detail = (f"exit {code}, requests {decisions}, thought before {thought}, reasoning sent back: {echo}, "
              f"call turn re-rendered verbatim: {history_verbatim(prompts)}, reasoning shown to the user: {shown}, "
              f"answer printed: {printed}")
    return problems, detail
