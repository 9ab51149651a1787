// WebSocket: one socket per tab (/ws/chat/), one subscription per followed message.
//
// The socket is opened on demand and closed when nothing is followed. A socket that has
// been silent for several server heartbeats counts as lost: every subscription is told,
// and each stream resubscribes from its own cursor when it retries.

import { heartbeat } from "./heartbeat.js";

const STREAM_TYPES = new Set(["start", "delta", "reasoning", "tool_call", "error", "done"]);

class ChatSocket {
  constructor() {
    this.socket = null;
    this.subscriptions = new Map(); // message id -> {after, sink}
    this.watchdog = null;
    this.lastFrameAt = 0;
  }

  subscribe(messageId, after, sink) {
    this.subscriptions.set(messageId, { after, sink });
    const socket = this.ensureSocket();
    if (socket.readyState === WebSocket.OPEN) this.sendSubscribe(messageId);
    return {
      // `ended`: the server ended this subscription with its `done`; only the stream
      // knows which `done` that is (an earlier segment's is followed by a Continue's).
      close: (ended = false) => {
        const current = this.subscriptions.get(messageId);
        if (!current || current.sink !== sink) return;
        if (!ended) this.send({ type: "unsubscribe", message_id: messageId });
        this.forget(messageId);
      },
    };
  }

  ensureSocket() {
    if (this.socket && this.socket.readyState <= WebSocket.OPEN) return this.socket;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/chat/`);
    this.socket = socket;
    socket.addEventListener("open", () => {
      if (this.socket !== socket) return;
      this.lastFrameAt = Date.now();
      this.startWatchdog();
      for (const id of this.subscriptions.keys()) this.sendSubscribe(id);
    });
    socket.addEventListener("message", (e) => {
      if (this.socket !== socket) return;
      this.lastFrameAt = Date.now();
      this.dispatch(JSON.parse(e.data));
    });
    socket.addEventListener("close", () => {
      if (this.socket === socket) this.lost("the connection closed");
    });
    return socket;
  }

  sendSubscribe(messageId) {
    const entry = this.subscriptions.get(messageId);
    if (!entry) return;
    this.send({ type: "subscribe", message_id: messageId, after: entry.after, ref: messageId });
  }

  send(frame) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(frame));
  }

  dispatch(frame) {
    const id = frame.message_id || frame.ref;
    const entry = id ? this.subscriptions.get(id) : undefined;
    if (!entry) return;
    if (STREAM_TYPES.has(frame.type) && typeof frame.seq === "number") {
      entry.after = Math.max(entry.after, frame.seq);
      entry.sink.event(frame);
    } else if (frame.type === "subscribed") {
      entry.sink.opened();
      entry.sink.subscribed(frame.status);
    } else if (frame.type === "error" && frame.code === "stream_failed") {
      // The server could not follow this message for now: resume it like a lost socket.
      this.subscriptions.delete(id);
      entry.sink.lost(frame.message);
    } else if (frame.type === "error") {
      this.forget(id);
      entry.sink.failed(frame.message || "the server refused the subscription");
    }
  }

  forget(messageId) {
    this.subscriptions.delete(messageId);
    if (this.subscriptions.size === 0) this.closeSocket();
  }

  startWatchdog() {
    clearInterval(this.watchdog);
    this.watchdog = setInterval(() => {
      if (this.subscriptions.size && Date.now() - this.lastFrameAt > heartbeat.limitMs) {
        this.lost("no heartbeat from the server");
      }
    }, 1000);
  }

  /** Close the socket and tell every subscription it was lost. */
  lost(reason) {
    const entries = [...this.subscriptions.values()];
    this.subscriptions.clear();
    this.closeSocket();
    for (const entry of entries) entry.sink.lost(reason);
  }

  closeSocket() {
    clearInterval(this.watchdog);
    const socket = this.socket;
    this.socket = null;
    if (socket && socket.readyState <= WebSocket.OPEN) socket.close(1000);
  }
}

export const chatSocket = new ChatSocket();

export function openWs(messageId, after, sink) {
  return chatSocket.subscribe(messageId, after, sink);
}
