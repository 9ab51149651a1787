// The REST API, with the session cookie and Django's CSRF token on unsafe requests.

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.error ? body.error.message : `request failed (${status})`;
    super(detail);
    this.status = status;
    this.code = body && body.error ? body.error.code : "error";
  }
}

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === "csrftoken") return decodeURIComponent(rest.join("="));
  }
  return "";
}

export async function request(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401 || response.status === 403) {
    const data = await response.json().catch(() => null);
    if (response.status === 401 || (data && data.error && data.error.code === "not_authenticated")) {
      window.location.assign(`/accounts/login/?next=${encodeURIComponent(location.pathname)}`);
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
    const page = await request("GET", next);
    items.push(...page.results);
    // Follow `next` on this origin only, whatever host name the server put in it.
    const url = page.next ? new URL(page.next, location.href) : null;
    next = url ? url.pathname + url.search : null;
  }
  return items;
}

export const conversations = {
  list: () => allPages("/api/conversations/"),
  create: () => request("POST", "/api/conversations/", {}),
  rename: (id, title) => request("PATCH", `/api/conversations/${id}/`, { title }),
  remove: (id) => request("DELETE", `/api/conversations/${id}/`),
  messages: (id) => allPages(`/api/conversations/${id}/messages/`),
};

export const messages = {
  post: (conversationId, content, params) =>
    request("POST", `/api/conversations/${conversationId}/messages/`, { content, params }),
  get: (id) => request("GET", `/api/messages/${id}/`),
  cancel: (id) => request("POST", `/api/messages/${id}/cancel/`),
  continue: (id) => request("POST", `/api/messages/${id}/continue/`),
};

export async function readiness() {
  const response = await fetch("/readyz", { headers: { Accept: "application/json" }, cache: "no-store" });
  const body = await response.json().catch(() => ({}));
  return { ok: response.ok, body };
}
