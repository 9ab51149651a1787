// The chat page: conversations, the message log, the composer, and the streams behind
// the answers. Writes go through the REST API; answers are read over the transport the
// person picked (SSE or WebSocket), which both speak the same event protocol.

import { ApiError, conversations, messages, readiness } from "./api.js";
import { AssistantBubble, userBubble } from "./bubble.js";
import { Sidebar } from "./sidebar.js";
import { MessageStream } from "./stream.js";
import { chatSocket } from "./transports/ws.js";

const config = JSON.parse(document.getElementById("chat-config").textContent);
chatSocket.configure(config.pingInterval);

const $ = (id) => document.getElementById(id);
const app = $("app");
const log = $("log");
const input = $("composer-input");
const sendButton = $("send");
const stopButton = $("stop");
const reasonLine = $("composer-reason");
const notice = $("notice");
const titleLine = $("conversation-title");
const ttftLine = $("ttft");
const maxTokensInput = $("max-tokens");
const simulationInput = $("simulation");

const TRANSPORT_KEY = "chat.transport";
const READY_POLL_MS = 5000;

const state = {
  conversationId: null,
  // Answers being followed, by message id, in any conversation: switching conversations
  // must not drop a reader (the server would end the answer as abandoned).
  live: new Map(),
  ready: true,
  sending: false,
  loads: 0,
};

// --- transport switch ------------------------------------------------------------------
function transport() {
  return localStorage.getItem(TRANSPORT_KEY) === "ws" ? "ws" : "sse";
}

for (const radio of document.querySelectorAll('input[name="transport"]')) {
  radio.checked = radio.value === transport();
  radio.addEventListener("change", () => {
    if (radio.checked) localStorage.setItem(TRANSPORT_KEY, radio.value);
  });
}

// --- notices ---------------------------------------------------------------------------
function showNotice(text) {
  notice.textContent = text;
  notice.hidden = !text;
}

function describe(error) {
  return error instanceof ApiError ? error.message : "The server could not be reached.";
}

// --- sidebar ---------------------------------------------------------------------------
const sidebar = new Sidebar($("conversation-list"), {
  rename: async (id, title) => {
    try {
      await conversations.rename(id, title);
    } catch (error) {
      showNotice(describe(error));
    }
    await refreshConversations();
  },
  remove: async (id) => {
    try {
      await conversations.remove(id);
    } catch (error) {
      showNotice(describe(error));
    }
    for (const [messageId, entry] of state.live) {
      if (entry.conversationId === id) {
        entry.stream.close();
        state.live.delete(messageId);
      }
    }
    if (state.conversationId === id) location.hash = "";
    await refreshConversations();
  },
});

async function refreshConversations() {
  try {
    const list = await conversations.list();
    sidebar.show(list, state.conversationId);
    const current = list.find((c) => c.id === state.conversationId);
    titleLine.textContent = current ? current.title || "Untitled" : "New conversation";
  } catch (error) {
    showNotice(describe(error));
  }
}

// A new conversation is created with its first message, so no empty ones pile up.
$("new-conversation").addEventListener("click", () => {
  if (location.hash) location.hash = "";
  else openConversation(null);
  input.focus();
});

$("open-sidebar").addEventListener("click", () => setSidebarOpen(true));
$("close-sidebar").addEventListener("click", () => setSidebarOpen(false));

function setSidebarOpen(open) {
  app.classList.toggle("sidebar-open", open);
  $("open-sidebar").setAttribute("aria-expanded", String(open));
  if (open) $("new-conversation").focus();
}

// --- the message log -------------------------------------------------------------------
function conversationFromHash() {
  const match = /^#\/c\/([0-9a-f-]{36})$/.exec(location.hash);
  return match ? match[1] : null;
}

function nearBottom() {
  return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
}

function keepScrolled(action) {
  const stick = nearBottom();
  action();
  if (stick) log.scrollTop = log.scrollHeight;
}

async function openConversation(id) {
  const load = ++state.loads;
  state.conversationId = id;
  setSidebarOpen(false);
  sidebar.select(id);
  log.replaceChildren();
  ttftLine.textContent = "";
  showNotice("");
  updateControls();
  if (!id) {
    titleLine.textContent = "New conversation";
    return;
  }
  let loaded;
  try {
    loaded = await conversations.messages(id);
  } catch (error) {
    if (load === state.loads) showNotice(error.status === 404 ? "This conversation does not exist." : describe(error));
    return;
  }
  if (load !== state.loads) return;
  const title = sidebar.conversations.find((c) => c.id === id);
  titleLine.textContent = title ? title.title || "Untitled" : titleLine.textContent;
  for (const message of loaded) {
    if (message.role !== "assistant") {
      log.append(userBubble(message));
      continue;
    }
    const followed = state.live.get(message.id);
    if (followed) {
      log.append(followed.bubble.node);
    } else if (message.status === "streaming") {
      // Replay the whole log: the persisted content may lag behind the stream.
      const bubble = assistantBubble({ ...message, content: "" });
      log.append(bubble.node);
      follow(bubble, id, 0, null);
    } else {
      log.append(assistantBubble(message).node);
    }
    if (message.termination && message.termination.ttft_ms != null) showTtft(message.termination.ttft_ms);
  }
  log.scrollTop = log.scrollHeight;
  updateControls();
}

function assistantBubble(message) {
  return new AssistantBubble(message, config, { continue: continueAnswer });
}

function showTtft(ms) {
  ttftLine.textContent = `First token ${Math.round(ms)} ms`;
}

/** Follow an answer from `after`; `startedAt` is when the person asked, for the TTFT. */
function follow(bubble, conversationId, after, startedAt) {
  let askedAt = startedAt;
  const finish = () => {
    state.live.delete(bubble.id);
    updateControls();
  };
  const stream = new MessageStream(bubble.id, after, transport, {
    event: (event) => {
      if (event.type === "delta" && askedAt !== null) {
        if (state.conversationId === conversationId) showTtft(performance.now() - askedAt);
        askedAt = null;
      }
      keepScrolled(() => bubble.event(event));
    },
    connection: (connection, detail) => bubble.connection(connection, detail),
    ended: (record) => {
      keepScrolled(() => bubble.ended(record));
      finish();
    },
    settled: (message) => {
      keepScrolled(() => bubble.settled(message));
      finish();
    },
    failed: (message) => {
      bubble.failed(message);
      finish();
    },
  });
  state.live.set(bubble.id, { bubble, stream, conversationId });
  stream.start();
  updateControls();
}

async function continueAnswer(bubble) {
  bubble.continueButton.disabled = true;
  const askedAt = performance.now();
  let answer;
  try {
    answer = await messages.continue(bubble.id);
  } catch (error) {
    bubble.continueButton.disabled = false;
    showNotice(describe(error));
    return;
  }
  bubble.setStreaming();
  follow(bubble, state.conversationId, answer.after, askedAt);
}

// --- the composer ----------------------------------------------------------------------
function streamingHere() {
  return [...state.live.values()].filter((entry) => entry.conversationId === state.conversationId);
}

function updateControls() {
  const streaming = streamingHere().length > 0;
  stopButton.hidden = !streaming;
  sendButton.disabled = !state.ready || state.sending || streaming;
}

function generationParams() {
  const params = {};
  const maxTokens = maxTokensInput.value.trim();
  if (maxTokens) params.max_tokens = Number(maxTokens);
  const simulation = simulationInput.value.trim();
  if (config.simulation && simulation) params.simulation = JSON.parse(simulation);
  return params;
}

async function send() {
  const content = input.value;
  if (!content.trim() || sendButton.disabled) return;
  let params;
  try {
    params = generationParams();
  } catch {
    showNotice("The simulation settings are not valid JSON.");
    return;
  }
  state.sending = true;
  updateControls();
  showNotice("");
  try {
    let conversationId = state.conversationId;
    if (!conversationId) {
      conversationId = (await conversations.create()).id;
      state.conversationId = conversationId;
      history.pushState(null, "", `#/c/${conversationId}`);
    }
    const askedAt = performance.now();
    const exchange = await messages.post(conversationId, content, params);
    input.value = "";
    autosize();
    if (state.conversationId === conversationId) {
      const bubble = assistantBubble({ ...exchange.message, content: "" });
      log.append(userBubble(exchange.user_message), bubble.node);
      log.scrollTop = log.scrollHeight;
      follow(bubble, conversationId, 0, askedAt);
    }
    refreshConversations();
  } catch (error) {
    showNotice(describe(error));
  } finally {
    state.sending = false;
    updateControls();
  }
}

function stop() {
  for (const entry of streamingHere()) {
    messages.cancel(entry.bubble.id).catch((error) => showNotice(describe(error)));
  }
}

function autosize() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  } else if (e.key === "Escape" && !stopButton.hidden) {
    e.preventDefault();
    stop();
  }
});
input.addEventListener("input", autosize);
stopButton.addEventListener("click", stop);

if (config.simulation) {
  for (const node of document.querySelectorAll(".simulation-only")) node.hidden = false;
}
maxTokensInput.max = String(config.maxTokensCap);
maxTokensInput.placeholder = String(config.defaultMaxTokens);

// --- readiness: is the engine reachable? -----------------------------------------------
function unreadyReason(body) {
  if (!body) return "Sending is paused: the server cannot be reached.";
  // /readyz names what is down in `down` and says why in `checks` (streaming/health.py).
  const down = body.down || [];
  if (down.includes("process")) return "Sending is paused: the server is restarting.";
  if (down.includes("engine")) {
    const detail = body.checks && body.checks.engine ? ` (${body.checks.engine})` : "";
    return `Sending is paused: the model engine is unreachable${detail}.`;
  }
  if (down.length) return `Sending is paused: the server cannot reach its ${down.join(" and ")}.`;
  return "Sending is paused: the server is not ready.";
}

async function checkReadiness() {
  let result = null;
  try {
    result = await readiness();
  } catch {
    result = null;
  }
  state.ready = Boolean(result && result.ok);
  const reason = state.ready ? "" : unreadyReason(result && result.body);
  reasonLine.textContent = reason;
  reasonLine.hidden = !reason;
  updateControls();
}

window.addEventListener("online", checkReadiness);
window.addEventListener("offline", checkReadiness);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) checkReadiness();
});
setInterval(() => {
  if (!document.hidden) checkReadiness();
}, READY_POLL_MS);

// --- start -----------------------------------------------------------------------------
window.addEventListener("hashchange", () => openConversation(conversationFromHash()));

await Promise.all([checkReadiness(), refreshConversations()]);
await openConversation(conversationFromHash());
document.documentElement.dataset.ready = "true";
