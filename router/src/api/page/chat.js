// The chat page: streams /v1/chat/completions (SSE) into the conversation. Every piece of
// text reaches the document through textContent, never as HTML, so model output cannot
// inject markup or script. The page uses the public API only: with `--api-key` it shows
// nothing until the key is given, and sends it as `Authorization: Bearer`.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "minisgl-api-key";
const chat = { model: null, history: [], controller: null, pending: null };

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

// A failed response -> ApiError with the server's own message (OpenAI's error shape).
async function apiError(response) {
  let message = response.statusText;
  try {
    message = (await response.json()).error?.message ?? message;
  } catch (_) { /* not JSON: keep the status text */ }
  const retry = response.headers.get("Retry-After");
  if (retry) message += ` (retry after ${retry} s)`;
  return new ApiError(response.status, `${response.status}: ${message}`);
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// Text with ``` fences -> prose blocks and <pre><code> blocks, made of text nodes only.
// An unclosed fence (an answer still streaming) is a code block to the end.
function render(target, text) {
  const nodes = [];
  let prose = [];
  let code = null;
  const flush = () => {
    if (prose.length) nodes.push(el("div", "prose", prose.join("\n")));
    prose = [];
  };
  const closeCode = () => {
    const pre = el("pre");
    if (code.lang) pre.dataset.lang = code.lang;
    pre.append(el("code", "", code.lines.join("\n")));
    nodes.push(pre);
    code = null;
  };
  for (const line of text.split("\n")) {
    const fence = /^\s*```\s*(\S*)/.exec(line);
    if (fence && code === null) {
      flush();
      code = { lang: fence[1], lines: [] };
    } else if (fence) {
      closeCode();
    } else if (code !== null) {
      code.lines.push(line);
    } else {
      prose.push(line);
    }
  }
  if (code !== null) closeCode();
  flush();
  target.replaceChildren(...nodes);
}

function addTurn(role, text) {
  const turn = el("section", `turn ${role}`);
  const body = el("div", "body");
  turn.append(el("div", "role", role), body);
  render(body, text);
  $("log").append(turn);
  turn.scrollIntoView({ block: "end" });
  return { turn, body };
}

function note(turn, className, text) {
  const node = el("div", className, text);
  turn.append(node);
  return node;
}

// The `data:` payloads of an SSE body, one per event.
async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replaceAll("\r\n", "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const lines = buffer.slice(0, end).split("\n");
      buffer = buffer.slice(end + 2);
      const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim());
      if (data.length) yield data.join("\n");
    }
  }
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...chat.history);
  const body = { model: chat.model, messages, stream: true, stream_options: { include_usage: true } };
  const temperature = $("temperature").value;
  const maxTokens = $("max-tokens").value;
  if (temperature !== "") body.temperature = Number(temperature);
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  return body;
}

function stats(ttft, usage, decodeMs) {
  const parts = [`TTFT ${(ttft / 1000).toFixed(2)} s`];
  if (usage) {
    const n = usage.completion_tokens;
    if (n > 1 && decodeMs > 0) parts.push(`${((n - 1) / (decodeMs / 1000)).toFixed(1)} tok/s`);
    parts.push(`${n} tokens`);
  }
  return parts.join(" · ");
}

// A thinking model's reasoning (`reasoning_content`, with `--reasoning-parser`), shown apart
// from the answer in a block made on its first piece, open while it streams and folded
// once the answer starts. It is not sent back with the history, as OpenAI's API has it.
function reasoningBlock(answer) {
  let block = null;
  let text = "";
  return {
    add(piece) {
      if (block === null) {
        block = el("details", "reasoning");
        block.open = true;
        block.append(el("summary", "", "Thinking"), el("div", "prose"));
        answer.turn.insertBefore(block, answer.body);
      }
      text += piece;
      block.lastChild.textContent = text;
    },
    close() {
      if (block !== null) block.open = false;
    },
  };
}

// One answer: POST, stream the deltas into the turn, then the stats line.
async function stream(answer, controller) {
  const started = performance.now();
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(), body: JSON.stringify(requestBody()),
    signal: controller.signal,
  });
  if (!response.ok) throw await apiError(response);
  let first = null;
  let content = "";
  let usage = null;
  const thinking = reasoningBlock(answer);
  for await (const data of sseData(response.body)) {
    if (data === "[DONE]") break;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new ApiError(0, chunk.error.message);
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices?.[0]?.delta ?? {};
    if (!delta.reasoning_content && !delta.content) continue;
    first ??= performance.now();
    if (delta.reasoning_content) thinking.add(delta.reasoning_content);
    if (delta.content) {
      content += delta.content;
      thinking.close();
      render(answer.body, content);
    }
    answer.turn.scrollIntoView({ block: "end" });
  }
  const end = performance.now();
  note(answer.turn, "stats", stats((first ?? end) - started, usage, end - (first ?? end)));
  return content;
}

async function send(text) {
  if (chat.model === null) await loadModel();
  chat.history.push({ role: "user", content: text });
  const answer = addTurn("assistant", "");
  const controller = new AbortController();
  chat.controller = controller;
  setBusy(true);
  try {
    chat.history.push({ role: "assistant", content: await stream(answer, controller) });
  } catch (e) {
    chat.history.pop();  // the user turn got no answer: it leaves the context
    if (e.name === "AbortError") {
      note(answer.turn, "stats", "stopped");
    } else if (e.status === 401) {
      answer.turn.remove();
      askForKey(text);
      return;
    } else {
      note(answer.turn, "error", e.message);
    }
  } finally {
    if (chat.controller === controller) chat.controller = null;
    setBusy(chat.controller !== null);
  }
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

function askForKey(pendingText) {
  chat.pending = pendingText;
  $("key-form").hidden = false;
  $("key").focus();
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    if (!response.ok) throw await apiError(response);
    chat.model = (await response.json()).data[0].id;
    $("model").textContent = chat.model;
  } catch (e) {
    if (e.status === 401) return askForKey(null);
    $("model").textContent = e.message;
  }
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.controller) return;
  $("prompt").value = "";
  addTurn("user", text);
  send(text);
});

$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});

$("stop").addEventListener("click", () => chat.controller?.abort());

$("new-chat").addEventListener("click", () => {
  chat.controller?.abort();
  chat.history = [];
  $("log").replaceChildren();
  $("prompt").focus();
});

$("key-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("key").value);
  $("key").value = "";
  $("key-form").hidden = true;
  await loadModel();
  const pending = chat.pending;
  chat.pending = null;
  if (pending !== null && chat.model !== null) send(pending);
});

loadModel();
