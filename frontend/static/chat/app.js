// The chat page: conversations, the message log, the composer, and the streams behind
// the answers. Writes go through the REST API; answers are read over the transport the
// person picked (SSE or WebSocket), which both speak the same event protocol.

import { ApiError, conversations, idempotencyKey, messages, readiness, unanswered } from "./api.js";
import { decorate } from "./branches.js";
import { AssistantBubble, userBubble } from "./bubble.js";
import { Drafts } from "./drafts.js";
import { emptyState } from "./empty.js";
import { describe, unreachable } from "./errors.js";
import { followFeed } from "./feed.js";
import { Notice } from "./notice.js";
import { SendButton } from "./sendbutton.js";
import { installShortcuts } from "./shortcuts.js";
import { Sidebar } from "./sidebar.js";
import { MessageStream } from "./stream.js";
import { themeSwitch } from "./theme.js";
import { heartbeat } from "./transports/heartbeat.js";

const config = JSON.parse(document.getElementById("chat-config").textContent);
heartbeat.configure(config.pingInterval);

const $ = (id) => document.getElementById(id);
const app = $("app");
const log = $("log");
const input = $("composer-input");
const sendButton = new SendButton($("send"), stop);
const reasonLine = $("composer-reason");
const notice = $("notice");
const drafts = new Drafts(input);
const titleLine = $("conversation-title");
const ttftLine = $("ttft");
const maxTokensInput = $("max-tokens");
const simulationInput = $("simulation");
const modelPicker = $("model");

const TRANSPORT_KEY = "chat.transport";
const READY_POLL_MS = 5000;

const state = {
  conversationId: null,
  // Answers being followed, by message id, in any conversation: switching conversations
  // must not drop a reader (the server would end the answer as abandoned).
  live: new Map(),
  ready: true,
  sending: false,
  // A regenerate, edit or branch switch of this tab is on its way (its feed event is ours).
  branching: false,
  // The answers this tab has asked to Continue, until the answer to that request is in.
  continuing: new Set(),
  loads: 0,
  // The sidebar's next page of conversations (a path), while one is being fetched.
  nextPage: null,
  loadingPage: false,
  search: "",
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
// One banner above the composer. A failure to reach the server clears itself once the
// server answers again; any banner can be dismissed.
const notices = new Notice(notice);

function showNotice(text) {
  notices.show(text);
}

function showError(error) {
  notices.show(describe(error), { unreachable: unreachable(error) });
}

// --- sidebar ---------------------------------------------------------------------------
const sidebar = new Sidebar($("conversation-list"), {
  rename: async (id, title) => {
    try {
      sidebar.upsert(await conversations.rename(id, title));
    } catch (error) {
      showError(error);
      sidebar.render();
    }
    showTitle();
  },
  remove: async (id) => {
    try {
      await conversations.remove(id);
    } catch (error) {
      showError(error);
      return;
    }
    for (const [messageId, entry] of state.live) {
      if (entry.conversationId === id) {
        entry.stream.close();
        state.live.delete(messageId);
      }
    }
    sidebar.forget(id);
    if (state.conversationId === id) location.hash = "";
  },
  more: () => loadConversations(state.nextPage),
});

/** The first page of conversations, or (`next`) the page after those shown. */
async function loadConversations(next = null) {
  if (state.loadingPage && next) return;
  state.loadingPage = true;
  const search = state.search;
  try {
    const page = await conversations.page(next, search);
    if (search !== state.search) return; // typed on meanwhile: a newer list is coming
    if (next) sidebar.append(page.results, Boolean(page.next));
    else sidebar.reset(page.results, Boolean(page.next));
    sidebar.select(state.conversationId);
    state.nextPage = page.next;
    showTitle();
  } catch (error) {
    showError(error);
  } finally {
    state.loadingPage = false;
  }
}

/** A conversation got a message (or a title): fetch that one entry, not the list. */
async function conversationChanged(id) {
  try {
    sidebar.upsert(await conversations.get(id));
    sidebar.select(state.conversationId);
    showTitle();
  } catch (error) {
    if (error.status === 404) {
      // Deleted since (in another tab): as its deletion's own event does, not an error.
      conversationGone(id);
      return;
    }
    showError(error);
  }
}

function conversationGone(id) {
  sidebar.forget(id);
  if (id === state.conversationId) location.hash = "";
}

function showTitle(conversation = sidebar.find(state.conversationId)) {
  const title = state.conversationId
    ? (conversation && conversation.title) || "Untitled"
    : "New conversation";
  titleLine.textContent = title;
  document.title = `${title} - Chat`;
}

// The conversations with an answer this tab follows carry the streaming marker.
function markStreaming() {
  sidebar.setStreaming([...state.live.values()].map((entry) => entry.conversationId));
  sidebar.select(state.conversationId);
}

const searchInput = $("search");
let searchTimer = null;
searchInput.addEventListener("input", () => {
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => {
    state.search = searchInput.value.trim();
    loadConversations();
  }, 250);
});

// A new conversation is created with its first message, so no empty ones pile up.
function newConversation() {
  // At once, not on the hashchange that setting the hash would queue: what is typed and
  // sent right after the click belongs to the new conversation, not the one left.
  if (location.hash) history.pushState(null, "", location.pathname + location.search);
  openConversation(null);
  input.focus();
}
$("new-conversation").addEventListener("click", newConversation);

$("open-sidebar").addEventListener("click", () => setSidebarOpen(true));
$("close-sidebar").addEventListener("click", () => setSidebarOpen(false));
$("sidebar-backdrop").addEventListener("click", () => setSidebarOpen(false));

function setSidebarOpen(open) {
  app.classList.toggle("sidebar-open", open);
  $("open-sidebar").setAttribute("aria-expanded", String(open));
  if (open) $("new-conversation").focus();
}

// --- the message log -------------------------------------------------------------------
/**
 * The route in the URL's hash: a conversation id, `null` for a new conversation (no hash,
 * `#` or `#/`), or `undefined` for any other fragment - an in-page anchor, not a route,
 * which leaves the open conversation as it is.
 */
function routeFromHash() {
  const hash = location.hash;
  if (hash === "" || hash === "#" || hash === "#/") return null;
  const match = /^#\/c\/([0-9a-f-]{36})$/.exec(hash);
  return match ? match[1] : undefined;
}

// The skip link moves focus, not the URL: a changed hash would read as another route.
document.querySelector(".skip-link").addEventListener("click", (e) => {
  e.preventDefault();
  input.focus();
});

// --- following the newest text ---------------------------------------------------------
// The log stays at the bottom until the person scrolls up (by any means: wheel, touch,
// keys, the scroll bar, find in page); then new text does not move what they are reading,
// and "Jump to latest" or scrolling back to the bottom follows again. Following is a state
// changed only by such a move, never derived from where the log happens to be: its height
// changes with no one scrolling (text arriving, the thinking block folding, a group of
// blocks laid out at its real size instead of its placeholder's, a font), and a height
// that shrinks pulls the scroll position up with it (clamped, or by scroll anchoring). So
// a move up counts as the person's only while the height did not shrink; the page's own
// moves are remembered as they are made. Any change of a message's size (observed, after
// layout, once a frame) keeps a followed log at its bottom.
const jumpButton = $("jump-to-latest");
const scroller = { stuck: true, top: 0, height: 0 };

function remember() {
  scroller.top = log.scrollTop;
  scroller.height = log.scrollHeight;
}

function atBottom() {
  return log.scrollHeight - log.scrollTop - log.clientHeight < 2;
}

function pin() {
  log.scrollTop = log.scrollHeight;
  remember();
}

const sizes = new ResizeObserver(() => {
  if (scroller.stuck) pin();
});

/** Put messages at the end of the log, kept at its bottom while it is followed. */
function addToLog(...nodes) {
  log.append(...nodes);
  for (const node of nodes) sizes.observe(node);
}

/** A message's node in the log, or null. */
function messageNode(messageId) {
  return log.querySelector(`[data-message-id="${CSS.escape(messageId)}"]`);
}

function scrollToLatest() {
  scroller.stuck = true;
  pin();
  jumpButton.hidden = true;
}

/** An answer's text changed on screen (at most once per frame). */
function rendered() {
  if (!scroller.stuck) jumpButton.hidden = false;
}

log.addEventListener("scroll", () => {
  if (log.scrollTop < scroller.top - 1 && log.scrollHeight >= scroller.height) {
    scroller.stuck = false;
  } else if (atBottom()) {
    scroller.stuck = true;
    jumpButton.hidden = true;
  }
  remember();
}, { passive: true });
jumpButton.addEventListener("click", () => {
  scrollToLatest();
  input.focus();
});

/**
 * Show a conversation as the server has it, at its newest text. After a change of branch
 * (`changeBranch`): `asked`, the answer asked for and when (`{id, at}`), whose time to
 * first token is measured as a sent message's is; `keep`, a message to keep where the one
 * it replaced was on screen (`{id, bottom}`: the version stepped to, where the version
 * shown before ended), so stepping through versions does not move them away.
 */
async function openConversation(id, { asked = null, keep = null } = {}) {
  const load = ++state.loads;
  state.conversationId = id;
  drafts.open(id);
  setSidebarOpen(false);
  sidebar.select(id);
  log.replaceChildren();
  sizes.disconnect();
  ttftLine.textContent = "";
  notices.clear();
  updateControls();
  showTitle();
  if (!id) {
    showEmpty();
    return;
  }
  let loaded;
  try {
    loaded = await conversations.messages(id);
  } catch (error) {
    if (load !== state.loads) return;
    if (error.status === 404) showNotice("This conversation does not exist.");
    else showError(error);
    return;
  }
  if (load !== state.loads) return;
  if (sidebar.find(id)) showTitle();
  else conversations.get(id).then((c) => load === state.loads && showTitle(c), () => {});
  if (!loaded.length) showEmpty();
  for (const message of loaded) {
    if (message.role !== "assistant") {
      const node = userBubble(message);
      decorate(node, message, branchActions);
      addToLog(node);
      continue;
    }
    const followed = state.live.get(message.id);
    let node;
    if (followed) {
      node = followed.bubble.node;
    } else if (message.status === "streaming") {
      // Replay the whole log: the persisted content may lag behind the stream. Its stored
      // seq covers the segments before a Continue: their ends are not this stream's end.
      // Its events come at once up to where it is: its thinking is timed only when this tab
      // asked for it just now (a regenerate, an edit), else said by its record at the end.
      const startedAt = asked && asked.id === message.id ? asked.at : null;
      const replay = { ...message, content: "", reasoning: "", tool_calls: [] };
      const bubble = assistantBubble(replay, { timed: startedAt !== null });
      node = bubble.node;
      follow(bubble, id, { settled: message.last_seq, startedAt });
    } else {
      node = assistantBubble(message).node;
    }
    decorate(node, message, branchActions);
    addToLog(node);
    if (message.termination && message.termination.ttft_ms != null) showTtft(message.termination.ttft_ms);
  }
  const kept = keep && messageNode(keep.id);
  if (kept) {
    log.scrollTop += kept.getBoundingClientRect().bottom - keep.bottom;
    remember();
    scroller.stuck = atBottom();
    jumpButton.hidden = true;
  } else {
    scrollToLatest();
  }
  updateControls();
}

/** The empty state of a conversation without messages; an example prompt is sent. */
function showEmpty() {
  addToLog(
    emptyState(config, (prompt) => {
      input.value = prompt;
      drafts.save();
      send();
    }),
  );
}

function assistantBubble(message, options) {
  return new AssistantBubble(message, config, { continue: continueAnswer, rendered }, options);
}

function showTtft(ms) {
  ttftLine.textContent = `First token ${Math.round(ms)} ms`;
}

/** Follow an answer (`stream.js` for `after`, `settled` and `first`); `startedAt` is when
 * the person asked, for the TTFT. */
function follow(bubble, conversationId, { after = 0, settled = after, startedAt = null, first = null } = {}) {
  let askedAt = startedAt;
  const finish = () => {
    state.live.delete(bubble.id);
    markStreaming();
    updateControls();
    // The conversation's entry after its answer: activity time, a title the engine wrote.
    conversationChanged(conversationId);
  };
  const stream = new MessageStream(bubble.id, transport, {
    event: (event) => {
      if (event.type === "delta" && askedAt !== null) {
        if (state.conversationId === conversationId) showTtft(performance.now() - askedAt);
        askedAt = null;
      }
      bubble.event(event);
    },
    connection: (connection, detail) => {
      bubble.connection(connection, detail);
      if (connection === "live") recovered();
    },
    ended: (record) => {
      bubble.ended(record);
      finish();
    },
    settled: (message) => {
      bubble.settled(message);
      finish();
    },
    failed: (message) => {
      bubble.failed(message);
      finish();
    },
  }, { after, settled, first });
  state.live.set(bubble.id, { bubble, stream, conversationId });
  stream.start();
  markStreaming();
  updateControls();
}

async function continueAnswer(bubble) {
  bubble.continueButton.disabled = true;
  const conversationId = state.conversationId;
  const askedAt = performance.now();
  let answer;
  state.continuing.add(bubble.id);
  try {
    answer = await messages.continue(bubble.id);
  } catch (error) {
    stopWhenStarted.delete(bubble.id);
    bubble.continueButton.disabled = false;
    showError(error);
    // It may have reached the server though no answer came back: the conversation is
    // drawn as the server has it (a continued answer followed there), so the page never
    // shows less than was said, and a next Continue goes on from what really was.
    if (unanswered(error) && state.conversationId === conversationId) openConversation(conversationId);
    return;
  } finally {
    state.continuing.delete(bubble.id);
  }
  // Drawn again meanwhile (the feed came back) after the Continue began: followed there.
  if (!state.live.has(bubble.id)) {
    bubble.setStreaming();
    follow(bubble, conversationId, { after: answer.after, startedAt: askedAt });
    // Drawn again from before the Continue: drawn once more, with this bubble in it.
    if (!bubble.node.isConnected && state.conversationId === conversationId) {
      openConversation(conversationId);
    }
  }
  if (stopWhenStarted.delete(bubble.id)) requestStop(bubble.id);
}

// --- versions: regenerate, edit, switch ------------------------------------------------
/** Run a change of branch, then show the conversation's branch as the server has it
 * (a new answer in it is followed like any streaming answer; `keep` as for
 * `openConversation`). True when it worked. */
async function changeBranch(change, keep = null) {
  // One at a time: a second click (a double-click on Regenerate) while one is on its way
  // would make a second version, streaming beside the first.
  if (state.branching) return false;
  const id = state.conversationId;
  const at = performance.now();
  state.branching = true;
  notices.clear();
  try {
    const created = await change();
    const asked = created && created.message ? { id: created.message.id, at } : null;
    if (state.conversationId === id) await openConversation(id, { asked, keep });
    return true;
  } catch (error) {
    showError(error);
    return false;
  } finally {
    state.branching = false;
  }
}

// The branch shown below each version this tab stepped away from (its last message), so
// stepping back to a version shows what was shown under it, as the products people know
// do, rather than that version's newest answers (the server's choice for a version alone).
const shownBelow = new Map();

function lastShownNode() {
  const shown = log.querySelectorAll("article.message[data-message-id]");
  return shown.length ? shown[shown.length - 1] : null;
}

function lastShown() {
  const last = lastShownNode();
  return last ? last.dataset.messageId : null;
}

/** The answer shown last, which a message sent here goes after (null: none shown). */
function answerShownLast() {
  const last = lastShownNode();
  return last && last.classList.contains("assistant") ? last.dataset.messageId : null;
}

/** Leaving the branch through version `messageId` (a new version of it, or another one). */
function leaving(messageId) {
  const leaf = lastShown();
  if (leaf) shownBelow.set(messageId, leaf);
}

const branchActions = {
  regenerate: (messageId) => {
    leaving(messageId);
    return changeBranch(() => messages.regenerate(messageId));
  },
  edit: async (messageId, content) => {
    leaving(messageId);
    const edited = await changeBranch(() => messages.edit(messageId, content, generationParams()));
    // The simulation settings are for one message, an edited one too: never the next ones.
    if (edited) simulationInput.value = "";
    return edited;
  },
  switchTo: (messageId, from) => {
    const shown = messageNode(from);
    const keep = shown ? { id: messageId, bottom: shown.getBoundingClientRect().bottom } : null;
    leaving(from);
    const target = shownBelow.get(messageId) || messageId;
    return changeBranch(() => conversations.switchTo(state.conversationId, target), keep);
  },
};

// --- other tabs ------------------------------------------------------------------------
// What this person did elsewhere: the sidebar follows, and the open conversation shows a
// message sent from another tab (and follows its answer) or a branch switched there.
function shownHere(messageId) {
  return state.live.has(messageId) || messageNode(messageId);
}

followFeed({
  event: (frame) => {
    const open = frame.conversation === state.conversationId;
    if (frame.event === "conversation.deleted") {
      conversationGone(frame.conversation);
      return;
    }
    if (frame.event === "conversation.created" || frame.event === "conversation.updated") {
      conversationChanged(frame.conversation);
      return;
    }
    conversationChanged(frame.conversation);
    if (!open || state.sending || state.branching) return;
    if (frame.event === "message.created" && shownHere(frame.message_id)) return;
    if (
      frame.event === "message.continued" &&
      (state.live.has(frame.message_id) || state.continuing.has(frame.message_id))
    ) {
      return;
    }
    openConversation(state.conversationId);
  },
  reconnected: () => {
    loadConversations();
    if (state.conversationId && !state.sending && !state.branching) openConversation(state.conversationId);
  },
});

// --- the composer ----------------------------------------------------------------------
function streamingHere() {
  return [...state.live.values()].filter((entry) => entry.conversationId === state.conversationId);
}

function updateControls() {
  sendButton.show(streamingHere().length > 0, state.ready && !state.sending);
}

function generationParams() {
  const params = {};
  const maxTokens = maxTokensInput.value.trim();
  if (maxTokens) params.max_tokens = Number(maxTokens);
  const simulation = developerMode() ? simulationInput.value.trim() : "";
  if (simulation) params.simulation = JSON.parse(simulation);
  return params;
}

// A message whose post got no answer, even after its retries: sent again as it was (the
// same text, to the same place), it goes with the same key, so the server gives back what
// the first post made if it did reach it, instead of making the message twice.
let unansweredSend = null;

function unansweredAgain(target, content) {
  const same = unansweredSend && unansweredSend.target === target && unansweredSend.content === content;
  return same ? unansweredSend : null;
}

async function send() {
  const content = input.value;
  if (!content.trim() || !sendButton.sendable) return;
  let params;
  try {
    params = generationParams();
  } catch {
    showNotice("The simulation settings are not valid JSON.");
    return;
  }
  state.sending = true;
  updateControls();
  notices.clear();
  const startedIn = state.conversationId;
  // After the answer this tab shows, wherever another tab has moved the conversation since;
  // sent again as it was, after the answer it was sent after (the page may show the
  // message it made by now), with its key.
  const again = unansweredAgain(startedIn, content);
  const parentId = again ? again.parentId : startedIn ? answerShownLast() : null;
  const key = again ? again.key : idempotencyKey();
  try {
    const askedAt = performance.now();
    // A new conversation is made with its first message, or not at all: a refused
    // message leaves no empty conversation behind.
    // Over SSE, one request: the POST answers with the answer's stream, the created ids
    // first. Over WebSocket the answer is read on the socket, as every other.
    const oneStep = transport() === "sse";
    const { created: exchange, connection } = startedIn
      ? await messages.post(startedIn, content, params, oneStep, modelPicker.value, key, parentId)
      : await messages.start(content, params, oneStep, modelPicker.value, key);
    unansweredSend = null;
    const conversationId = exchange.message.conversation;
    drafts.sent(startedIn);
    // The simulation settings are for one message: they never stick to the next ones.
    simulationInput.value = "";
    if (state.conversationId === startedIn) {
      input.value = "";
      autosize();
      if (!startedIn) {
        state.conversationId = conversationId;
        drafts.open(conversationId);
        history.pushState(null, "", `#/c/${conversationId}`);
      }
      if (shownHere(exchange.message.id)) {
        // A retry whose first post made the message, already shown (a reload of the
        // conversation found it): it is not shown twice, and its answer is followed there.
        if (connection) connection.attach(ignored).close();
        conversationChanged(conversationId);
        return;
      }
      const bubble = assistantBubble({ ...exchange.message, content: "", reasoning: "", tool_calls: [] });
      for (const empty of log.querySelectorAll(".empty-state")) empty.remove();
      const question = userBubble(exchange.user_message);
      decorate(question, exchange.user_message, branchActions);
      decorate(bubble.node, exchange.message, branchActions);
      addToLog(question, bubble.node);
      scrollToLatest();
      follow(bubble, conversationId, { startedAt: askedAt, first: connection });
    } else if (connection) {
      // Sent from a conversation no longer shown: followed like any answer, so it is not
      // abandoned (the stream goes on as long as someone reads it).
      const bubble = assistantBubble({ ...exchange.message, content: "", reasoning: "", tool_calls: [] });
      follow(bubble, conversationId, { first: connection });
    }
    conversationChanged(conversationId);
  } catch (error) {
    unansweredSend = unanswered(error) ? { target: startedIn, content, parentId, key } : null;
    showError(error);
  } finally {
    state.sending = false;
    updateControls();
  }
}

// A stream's events nobody reads (`connection.attach` needs a sink).
const ignored = { opened() {}, event() {}, lost() {} };

// --- Stop ----------------------------------------------------------------------------
// A Stop that cannot reach the server is kept and sent again as soon as the server can be
// reached (the browser is online again, or readiness answers): it is never dropped.
const pendingStops = new Set();

/** Stop the answers streaming in this conversation; false when there were none. */
function stop() {
  const entries = streamingHere();
  for (const entry of entries) requestStop(entry.bubble.id);
  // A Continue still on its way: stopped as soon as it has started.
  const continuing = [...state.continuing].filter((id) => messageNode(id));
  for (const id of continuing) stopWhenStarted.add(id);
  return entries.length > 0 || continuing.length > 0;
}

// Continues asked to stop before their request was answered.
const stopWhenStarted = new Set();

async function requestStop(messageId) {
  const entry = state.live.get(messageId);
  if (!entry) {
    pendingStops.delete(messageId);
    return;
  }
  entry.bubble.stopping(false);
  try {
    await messages.cancel(messageId);
    pendingStops.delete(messageId);
  } catch (error) {
    if (error instanceof ApiError) {
      pendingStops.delete(messageId);
      showError(error);
    } else {
      pendingStops.add(messageId);
      entry.bubble.stopping(true);
    }
  }
}

/** The server answered again: retry what could not reach it, drop what said it could not. */
function recovered() {
  notices.clear({ unreachable: true });
  for (const messageId of [...pendingStops]) requestStop(messageId);
}

function autosize() {
  input.style.height = "auto";
  input.style.height = `${Math.min(input.scrollHeight, 240)}px`;
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
// On a touch keyboard Enter is the newline key (there is no Shift): the Send button sends.
const touchKeyboard = window.matchMedia("(hover: none) and (pointer: coarse)");
input.enterKeyHint = touchKeyboard.matches ? "enter" : "send";
input.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !touchKeyboard.matches) {
    e.preventDefault();
    send();
  }
});
input.addEventListener("input", autosize);
input.addEventListener("draft", autosize);

// The simulation settings are a developer tool: behind the Developer switch, which exists
// only while the simulated engine runs.
const developerSwitch = $("developer");
const DEVELOPER_KEY = "chat.developer";

function developerMode() {
  return config.simulation && developerSwitch.checked;
}

function showDeveloper() {
  for (const node of document.querySelectorAll(".developer-only")) node.hidden = !developerMode();
}

if (config.simulation) {
  for (const node of document.querySelectorAll(".simulation-only")) node.hidden = false;
  developerSwitch.checked = localStorage.getItem(DEVELOPER_KEY) === "on";
  developerSwitch.addEventListener("change", () => {
    localStorage.setItem(DEVELOPER_KEY, developerSwitch.checked ? "on" : "off");
    showDeveloper();
  });
}
showDeveloper();
// The model picker, when more than one model is served ("" is the default one).
for (const name of config.models) {
  const label = name === config.model ? `${name} (default)` : name;
  modelPicker.append(new Option(label, name === config.model ? "" : name));
}
modelPicker.closest(".model-picker").hidden = config.models.length < 2;
maxTokensInput.max = String(config.maxTokensCap);
maxTokensInput.placeholder = String(config.defaultMaxTokens);

// --- theme and shortcuts ---------------------------------------------------------------
themeSwitch($("theme"));
installShortcuts(
  $("shortcuts"),
  {
    newConversation,
    focusComposer: () => input.focus(),
    stop,
  },
  input,
);

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
  if (result) recovered();
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
window.addEventListener("hashchange", () => {
  const route = routeFromHash();
  if (route !== undefined) openConversation(route);
});

await Promise.all([checkReadiness(), loadConversations()]);
await openConversation(routeFromHash() ?? null);
document.documentElement.dataset.ready = "true";
