// The chat: streamed Chat Completions, rendered as markdown; thinking collapsed, tool calls shown.
// Stop aborts the fetch: the server sees the client go and aborts the request in the engine.
import { errorMessage, readEvents } from "/ui/api.js";
import { renderMarkdown } from "/ui/markdown.js";

const $ = (id) => document.getElementById(id);

function number(id, parse) {
  const text = $(id).value.trim();
  if (text === "") return undefined;
  const value = parse(text);
  return Number.isFinite(value) ? value : undefined;
}

// One assistant turn on screen: thinking (collapsed), the answer, tool calls, a footer.
class Turn {
  constructor(container) {
    this.reasoning = "";
    this.content = "";
    this.toolCalls = [];
    this.node = document.createElement("article");
    this.node.className = "msg assistant streaming";
    this.thinking = document.createElement("details");
    this.thinking.className = "thinking";
    this.thinking.hidden = true;
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    this.thinkingBody = document.createElement("div");
    this.thinkingBody.className = "md";
    this.thinking.append(summary, this.thinkingBody);
    this.body = document.createElement("div");
    this.body.className = "md content";
    this.tools = document.createElement("div");
    this.tools.className = "tools";
    this.footer = document.createElement("footer");
    this.footer.textContent = "…";
    this.node.append(this.thinking, this.body, this.tools, this.footer);
    container.append(this.node);
    this.frame = 0;
  }

  add(delta) {
    if (delta.reasoning_content) this.reasoning += delta.reasoning_content;
    if (delta.content) this.content += delta.content;
    for (const call of delta.tool_calls || []) {
      const slot = (this.toolCalls[call.index] ||= { name: "", arguments: "" });
      if (call.function && call.function.name) slot.name = call.function.name;
      if (call.function && call.function.arguments) slot.arguments += call.function.arguments;
    }
    if (!this.frame) this.frame = requestAnimationFrame(() => this.render());
  }

  render() {
    this.frame = 0;
    this.thinking.hidden = !this.reasoning;
    this.thinking.querySelector("summary").textContent = `Thinking (${this.reasoning.length} characters)`;
    renderMarkdown(this.thinkingBody, this.reasoning);
    renderMarkdown(this.body, this.content);
    this.tools.replaceChildren(...this.toolCalls.map(toolCallNode));
    this.node.scrollIntoView({ block: "end" });
  }

  finish(text, state) {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.render();
    this.node.classList.remove("streaming");
    if (state) this.node.classList.add(state);
    this.footer.textContent = text;
  }
}

function toolCallNode(call) {
  const box = document.createElement("div");
  box.className = "toolcall";
  const title = document.createElement("div");
  title.className = "toolname";
  title.textContent = "tool call: " + (call.name || "…");
  const args = document.createElement("pre");
  try { args.textContent = JSON.stringify(JSON.parse(call.arguments), null, 2); }
  catch { args.textContent = call.arguments; }
  box.append(title, args);
  return box;
}

export class Chat {
  constructor(api, modelName) {
    this.api = api;
    this.modelName = modelName;
    this.history = [];  // {role, content, reasoning_content?, tool_calls?}
    this.controller = null;
  }

  attach() {
    $("composer").addEventListener("submit", (e) => { e.preventDefault(); this.send(); });
    $("input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); this.send(); }
    });
    $("stop").addEventListener("click", () => this.stop());
    $("clear").addEventListener("click", () => this.clear());
  }

  clear() {
    this.stop();
    this.history = [];
    $("messages").replaceChildren();
  }

  stop() {
    if (this.controller) this.controller.abort();
  }

  settings() {
    const body = {
      max_tokens: number("max_tokens", (t) => parseInt(t, 10)),
      temperature: number("temperature", parseFloat),
      top_p: number("top_p", parseFloat),
      top_k: number("top_k", (t) => parseInt(t, 10)),
      seed: number("seed", (t) => parseInt(t, 10)),
    };
    const thinking = $("thinking").value;
    if (thinking) body.chat_template_kwargs = { enable_thinking: thinking === "on" };
    return body;
  }

  messages() {
    const system = $("system").value.trim();
    return (system ? [{ role: "system", content: system }] : []).concat(this.history);
  }

  addUser(text) {
    $("empty-hint")?.remove();
    const node = document.createElement("article");
    node.className = "msg user";
    const body = document.createElement("div");
    body.className = "md";
    renderMarkdown(body, text);
    node.append(body);
    $("messages").append(node);
  }

  async send() {
    const text = $("input").value.trim();
    if (!text || this.controller) return;
    $("input").value = "";
    this.addUser(text);
    this.history.push({ role: "user", content: text });
    const turn = new Turn($("messages"));
    this.controller = new AbortController();
    $("send").disabled = true;
    $("stop").hidden = false;
    const started = performance.now();
    let first = null, usage = null, finish = null;
    try {
      const response = await this.api.fetch("/v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
          model: this.modelName(), messages: this.messages(), stream: true,
          stream_options: { include_usage: true }, ...this.settings(),
        }),
        signal: this.controller.signal,
      });
      if (!response.ok) throw new Error(await errorMessage(response));
      await readEvents(response, (data) => {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message || "the server failed this request");
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices || []) {
          if (first === null) first = performance.now();
          turn.add(choice.delta || {});
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      });
      turn.finish(footer(finish, usage, started, first), finish === "length" ? "cut" : "");
      this.remember(turn);
    } catch (err) {
      if (err.name === "AbortError") {
        turn.finish("stopped", "stopped");
        this.remember(turn);
      } else {
        turn.finish("error: " + err.message, "failed");
        this.history.pop();  // the question can be asked again
      }
    } finally {
      this.controller = null;
      $("send").disabled = false;
      $("stop").hidden = true;
      $("input").focus();
    }
  }

  remember(turn) {
    const message = { role: "assistant", content: turn.content };
    if (turn.reasoning) message.reasoning_content = turn.reasoning;
    if (turn.toolCalls.length) {
      message.tool_calls = turn.toolCalls.map((c, i) => ({
        id: "call_" + i, type: "function", function: { name: c.name, arguments: c.arguments || "{}" },
      }));
    }
    this.history.push(message);
  }
}

function footer(finish, usage, started, first) {
  const parts = [];
  if (finish) parts.push(finish);
  if (usage) {
    parts.push(`${usage.prompt_tokens} prompt tokens` +
      (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens
        ? ` (${usage.prompt_tokens_details.cached_tokens} cached)` : ""));
    parts.push(`${usage.completion_tokens} generated`);
    const seconds = (performance.now() - (first ?? started)) / 1000;
    if (usage.completion_tokens > 1 && seconds > 0) parts.push(`${(usage.completion_tokens / seconds).toFixed(1)} tok/s`);
  }
  if (first !== null) parts.push(`first token ${Math.round(first - started)} ms`);
  return parts.join(" · ");
}
