// Requests with the API key in a header, the key dialog, server-sent events over fetch().

const KEY_ITEM = "edgemoe.apiKey";  // sessionStorage: this tab only, gone when it closes

export const api = {
  key: sessionStorage.getItem(KEY_ITEM) || "",

  headers(extra) {
    const h = { ...(extra || {}) };
    if (this.key) h["Authorization"] = "Bearer " + this.key;
    return h;
  },

  // fetch() with the key; a 401 asks for the key (again) until one works or none is given.
  async fetch(path, options = {}) {
    let response = await fetch(path, { ...options, headers: this.headers(options.headers) });
    while (response.status === 401 && (await askKey(Boolean(this.key)))) {
      response = await fetch(path, { ...options, headers: this.headers(options.headers) });
    }
    return response;
  },
};

let pendingKey = null;

// Show the key dialog (one at a time); resolves true once a key was entered.
function askKey(wrong) {
  if (pendingKey) return pendingKey;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  const error = document.getElementById("key-error");
  error.hidden = !wrong;
  error.textContent = wrong ? "That key was refused." : "";
  pendingKey = new Promise((resolve) => {
    const form = document.getElementById("key-form");
    form.onsubmit = (event) => {
      event.preventDefault();
      api.key = input.value.trim();
      sessionStorage.setItem(KEY_ITEM, api.key);
      dialog.close();
      pendingKey = null;
      resolve(Boolean(api.key));
    };
    dialog.showModal();
    input.focus();
  });
  return pendingKey;
}

// Server-sent events from a fetch() body: calls onData(json text) per `data:` line;
// comments (": ping" heartbeats) and event names are skipped.
export async function readEvents(response, onData) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) onData(line.slice(5).trimStart());
      }
    }
  }
}

export async function errorMessage(response) {
  try {
    const body = await response.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch {
    return response.status + " " + response.statusText;
  }
}

