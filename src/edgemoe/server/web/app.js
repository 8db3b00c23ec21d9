// Start-up: the model's name, the chat and the live view of the engine.
import { api } from "/ui/api.js";
import { Chat } from "/ui/chat.js";
import { LiveView } from "/ui/live.js";

async function describeModel() {
  const response = await api.fetch("/debug/engine");
  if (!response.ok) return null;
  const info = await response.json();
  document.getElementById("model").textContent = info.served_model_name || "(loading)";
  document.getElementById("random-badge").hidden = !info.random_weights;
  return info;
}

async function main() {
  const live = new LiveView(api);
  const chat = new Chat(api, () => live.modelName || "default");
  chat.attach();
  const info = await describeModel();
  if (info) live.modelName = info.served_model_name;
  live.start();
  window.edgemoe = { api, chat, live };  // for tests and the curious
}

main();
