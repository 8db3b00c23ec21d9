"""GLM-4.5's chat template (GLM-4.5 / 4.5-Air / 4.6 MoE checkpoints), in our own words.

Rendering matches zai-org's published `chat_template.jinja` (it ships in the Hugging Face
model repos, not in github.com/zai-org/GLM-4.5) character for character for the same
messages. Checked, over tools / calls with dict and JSON-string arguments / tool results /
system and developer turns / reasoning_content / enable_thinking on, off and unset, with
transformers' own renderer too, against two copies: GLM-4.5-Air's template as embedded in
its GGUF (printed whole by llama-server in an ik_llama.cpp issue thread), and
ggml-org/llama.cpp `models/templates/GLM-4.6.jinja` (GLM-4.6's: it differs only in reading
missing tool-call arguments as `{}`). Not llama.cpp's `glm_4_5.jinja`: that one is edited
(no `ensure_ascii=False`, string arguments rendered as `raw_arguments`). What it renders:

- `[gMASK]<sop>`, then with tools a `<|system|>` block `# Tools` listing each tool as one
  JSON line inside `<tools>`, and showing the call format
  `<tool_call>{function-name}\\n<arg_key>…</arg_key>\\n<arg_value>…</arg_value>…</tool_call>`;
- `<|user|>\\nTEXT`, `<|system|>\\nTEXT`; with `enable_thinking` false each user turn ends
  with `/nothink` (unless it already does);
- `<|assistant|>` then `\\n<think>REASONING</think>` for a turn after the last user turn
  that has reasoning (`reasoning_content`, or a `<think>` block inside its content), else
  `\\n<think></think>`; then `\\nCONTENT` (stripped) if any; then per tool call
  `\\n<tool_call>NAME\\n` + `<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n` per argument
  (a string as it is, anything else as JSON) + `</tool_call>`;
- tool results: `<|observation|>` once per run of tool messages, then
  `\\n<tool_response>\\nRESULT\\n</tool_response>` each;
- other roles are not rendered; the generation prompt is `<|assistant|>`, or
  `<|assistant|>\\n<think></think>` with thinking off (the model then writes `\\n` first).

NOTE: it never names the role "developer", so `server/templates.py` renders developer
messages as system ones, as it does for the published template.
"""

from __future__ import annotations

GLM4_5_CHAT_TEMPLATE = r"""{%- macro text_of(content) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content is iterable and content is not mapping -%}
        {%- for part in content -%}
            {%- if part is mapping and part.type == 'text' -%}
                {{- part.text -}}
            {%- elif part is string -%}
                {{- part -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- content -}}
    {%- endif -%}
{%- endmacro -%}
{{- '[gMASK]<sop>' -}}
{%- if tools -%}
    {{- '<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' -}}
    {%- for tool in tools -%}
        {{- tool | tojson(ensure_ascii=False) -}}
        {{- '\n' -}}
    {%- endfor -%}
    {{- '</tools>\n\nFor each function call, output the function name and arguments ' -}}
    {{- 'within the following XML format:\n' -}}
    {{- '<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n' -}}
    {{- '<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>' -}}
{%- endif -%}
{%- set thinking_off = enable_thinking is defined and not enable_thinking -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set text = text_of(m.content) -%}
        {{- '<|user|>\n' + text -}}
        {%- if thinking_off and not text.endswith('/nothink') -%}
            {{- '/nothink' -}}
        {%- endif -%}
    {%- elif m.role == 'assistant' -%}
        {%- set content = text_of(m.content) -%}
        {%- set reasoning = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set reasoning = m.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
        {{- '<|assistant|>' -}}
        {%- if loop.index0 > ns.last_user and reasoning -%}
            {{- '\n<think>' + reasoning.strip() + '</think>' -}}
        {%- else -%}
            {{- '\n<think></think>' -}}
        {%- endif -%}
        {%- if content.strip() -%}
            {{- '\n' + content.strip() -}}
        {%- endif -%}
        {%- for call in m.tool_calls or [] -%}
            {%- set fn = call.function if call.function else call -%}
            {{- '\n<tool_call>' + fn.name + '\n' -}}
            {%- for key, value in fn.arguments.items() -%}
                {{- '<arg_key>' ~ key ~ '</arg_key>\n<arg_value>' -}}
                {{- value if value is string else value | tojson(ensure_ascii=False) -}}
                {{- '</arg_value>\n' -}}
            {%- endfor -%}
            {{- '</tool_call>' -}}
        {%- endfor -%}
    {%- elif m.role == 'tool' -%}
        {%- if m.content is string -%}
            {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
                {{- '<|observation|>' -}}
            {%- endif -%}
            {{- '\n<tool_response>\n' + m.content + '\n</tool_response>' -}}
        {%- else -%}
            {{- '<|observation|>' -}}
            {%- for result in m.content -%}
                {{- '\n<tool_response>\n' ~ (result.output if result.output is defined else result) -}}
                {{- '\n</tool_response>' -}}
            {%- endfor -%}
        {%- endif -%}
    {%- elif m.role == 'system' -%}
        {{- '<|system|>\n' + text_of(m.content) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' -}}
    {%- if thinking_off -%}
        {{- '\n<think></think>' -}}
    {%- endif -%}
{%- endif -%}"""
