// The REST API, with the session cookie and Django's CSRF token on unsafe requests.

import { StreamLost, openedPost } from "./transports/post.js";

export class ApiError extends Error {
  constructor(status, body) {
    const error = body && body.error ? body.error : null;
    super(error ? error.message : `request failed (${status})`);
    this.status = status;
    this.code = error ? error.code : "error";
    // The offending field of a validation error; `message` then starts with "<field>: ".
    this.field = error && error.field ? error.field : null;
  }
}

/** The sign-in page, coming back to exactly this place (the hash names the conversation). */
export function signIn() {
  const here = location.pathname + location.search + location.hash;
  window.location.assign(`/accounts/login/?next=${encodeURIComponent(here)}`);
}

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === "csrftoken") return decodeURIComponent(rest.join("="));
  }
  return "";
}

function send(method, path, body, accept, extra = {}) {
  const headers = { ...extra, Accept: accept };
  if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  return fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}

export async function request(method, path, body, headers = {}) {
  return answerOf(await send(method, path, body, "application/json", headers));
}

/**
 * A POST that starts an answer, asked for its stream (one request per answer): resolves
 * with `{created, connection}` once the server said what it created (the 201's body), with
 * the response still streaming the answer's events (`connection`, see
 * `transports/post.js`). A refusal throws as `request` does.
 */
export async function startStreaming(path, body, headers = {}) {
  const response = await send("POST", path, body, "text/event-stream", headers);
  const type = response.headers.get("content-type") || "";
  if (!response.ok || !type.startsWith("text/event-stream")) {
    return { created: await answerOf(response), connection: null };
  }
  return openedPost(response);
}

async function answerOf(response) {
  if (response.status === 401 || response.status === 403) {
    const data = await response.json().catch(() => null);
    if (response.status === 401 || (data && data.error && data.error.code === "not_authenticated")) {
      signIn();
    }
    throw new ApiError(response.status, data);
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

async function allPages(path) {
  const items = [];
  let next = path;
  while (next) {
    const data = await page(next);
    items.push(...data.results);
    next = data.next;
  }
  return items;
}

/** One page of a list: `{results, next}`, `next` a path on this origin or null. */
async function page(path) {
  const data = await request("GET", path);
  // Follow `next` on this origin only, whatever host name the server put in it.
  const url = data.next ? new URL(data.next, location.href) : null;
  return { results: data.results, next: url ? url.pathname + url.search : null };
}

export const conversations = {
  /** Newest activity first, a page at a time (`next` from the previous page). */
  page: (next, search = "") =>
    page(next || `/api/conversations/${search ? `?search=${encodeURIComponent(search)}` : ""}`),
  get: (id) => request("GET", `/api/conversations/${id}/`),
  rename: (id, title) => request("PATCH", `/api/conversations/${id}/`, { title }),
  remove: (id) => request("DELETE", `/api/conversations/${id}/`),
  messages: (id) => allPages(`/api/conversations/${id}/messages/`),
  /** Show the branch through `messageId` (down its latest answers). */
  switchTo: (id, messageId) => request("PATCH", `/api/conversations/${id}/`, { current_leaf: messageId }),
};

/** A new key for a message's post (`Idempotency-Key`): random, one per message. */
export function idempotencyKey() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

// How long a post that got no answer waits before each retry.
const RETRY_DELAYS_MS = [500, 1000, 2000, 4000];

/** Whether a post failed without an answer, so the server may or may not have made its
 * message: the network failed (fetch rejects with a TypeError), the stream broke before
 * it said what it created, or a proxy or a stopping server answered for the app. */
export function unanswered(error) {
  if (error instanceof ApiError) return [502, 503, 504].includes(error.status);
  return error instanceof TypeError || error instanceof StreamLost;
}

/**
 * A POST that starts an answer: `{created, connection}`; with `stream`, the
 * answer comes back in the same request (`startStreaming`), else `connection` is null and
 * the answer is read over the transport. Sent with `key` as its `Idempotency-Key`, and
 * sent again with it while it gets no answer: a retry gets what the first post made, so
 * a message that reached the server is never made twice.
 */
async function starting(path, body, stream, key) {
  const headers = { "Idempotency-Key": key };
  for (let attempt = 0; ; attempt++) {
    try {
      if (stream) return await startStreaming(path, body, headers);
      return { created: await request("POST", path, body, headers), connection: null };
    } catch (error) {
      if (!unanswered(error) || attempt >= RETRY_DELAYS_MS.length) throw error;
      await new Promise((resolve) => setTimeout(resolve, RETRY_DELAYS_MS[attempt]));
    }
  }
}

export const messages = {
  /** After `parentId`, the answer shown last (null: the conversation's current leaf, as
   * another tab may have moved it). */
  post: (conversationId, content, params, stream, model, key, parentId) =>
    starting(
      `/api/conversations/${conversationId}/messages/`,
      { content, params, model, parent_id: parentId },
      stream,
      key,
    ),
  /** The first message of a new conversation: made together, or not at all. */
  start: (content, params, stream, model, key) =>
    starting("/api/messages/", { content, params, model }, stream, key),
  get: (id) => request("GET", `/api/messages/${id}/`),
  cancel: (id) => request("POST", `/api/messages/${id}/cancel/`),
  continue: (id) => request("POST", `/api/messages/${id}/continue/`),
  /** A new version of an answer, or of a question with its answer. `stop`: an answer of
   * the branch being replaced that is still streaming is stopped first, as people expect
   * of a Regenerate or an Edit (without it the server refuses, 409). */
  // Each with a key of its own, so a retry of one that got no answer makes one version.
  regenerate: (id) =>
    starting(`/api/messages/${id}/regenerate/`, { stop: true }, false, idempotencyKey()).then(
      ({ created }) => created,
    ),
  edit: (id, content, params) =>
    starting(`/api/messages/${id}/edit/`, { content, params, stop: true }, false, idempotencyKey()).then(
      ({ created }) => created,
    ),
};

export async function readiness() {
  const response = await fetch("/readyz", { headers: { Accept: "application/json" }, cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  return { ok: response.ok, body };
}
