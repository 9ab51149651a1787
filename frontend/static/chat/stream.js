// Following one message's events from a cursor, across dropped connections.
//
// The cursor is the seq of the last event applied. Every (re)connection asks for what
// comes after it, and any event at or below it is dropped, so a resumed stream neither
// repeats nor loses text whichever transport carries it. Retries back off exponentially
// (with jitter, capped) and start at once when the browser comes back online. A stream
// that cannot reconnect asks the REST API whether the message has ended meanwhile.

import { messages } from "./api.js";
import { openSse } from "./transports/sse.js";
import { openWs } from "./transports/ws.js";

const FIRST_RETRY_MS = 300;
const MAX_RETRY_MS = 8000;

const TRANSPORTS = { sse: openSse, ws: openWs };

// The errors a resume gets when the log no longer holds what it missed: the text shown
// has a hole, which the stored message fills (docs/protocol.md).
const TEXT_MISSING = new Set(["resume_gap", "resume_unavailable"]);

export class MessageStream {
  /**
   * @param {string} messageId
   * @param {() => string} transport  "sse" or "ws", read at every (re)connection
   * @param {object} view  {event(e), connection(state, detail), ended(record), failed(message)}
   * @param {object} from
   * @param {number} from.after  the cursor: the seq of the last event already shown
   * @param {number} from.settled  the seq the segments before this one end at: a `done`
   *   at or below it ended an earlier segment (a Continue went on after it), not this
   *   stream (the server's rule too). Default: `after`.
   * @param {object|null} from.first  a connection already streaming this message (the POST
   *   that created it: `transports/post.js`), used for the first open instead of one made
   */
  constructor(messageId, transport, view, { after = 0, settled = after, first = null } = {}) {
    this.messageId = messageId;
    this.first = first;
    this.cursor = after;
    this.settled = settled;
    this.transport = transport;
    this.view = view;
    this.connection = null;
    this.attempt = 0;
    this.timer = null;
    this.finished = false;
    this.receivedSinceOpen = false;
    // Text was missed (`TEXT_MISSING`): the end is taken from the stored message.
    this.missing = false;
    this.onOnline = () => {
      if (this.timer !== null) this.retryNow();
    };
    // A browser that says it is offline has lost the connection, whatever the socket
    // still believes; waiting for TCP to notice can take minutes.
    this.onOffline = () => {
      if (this.connection === null || this.finished) return;
      this.connection.close();
      this.lost("the browser is offline");
    };
    window.addEventListener("online", this.onOnline);
    window.addEventListener("offline", this.onOffline);
  }

  start() {
    this.open();
    return this;
  }

  /** Stop following (the message stays as it is on the server). `ended`: the server
   * ended the stream itself (its `done`), so the connection has nothing to cancel. */
  close(ended = false) {
    this.finished = true;
    clearTimeout(this.timer);
    this.timer = null;
    window.removeEventListener("online", this.onOnline);
    window.removeEventListener("offline", this.onOffline);
    if (this.connection) this.connection.close(ended);
    this.connection = null;
  }

  open() {
    this.timer = null;
    this.receivedSinceOpen = false;
    const sink = {
      opened: () => this.opened(),
      event: (e) => this.apply(e),
      lost: (reason) => this.lost(reason),
      subscribed: (status) => this.subscribed(status),
      failed: (message) => this.fail(message),
    };
    if (this.first) {
      const first = this.first;
      this.first = null;
      this.connection = first.attach(sink);
      return;
    }
    const open = TRANSPORTS[this.transport()] || openSse;
    this.connection = open(this.messageId, this.cursor, sink);
  }

  opened() {
    if (!this.finished) this.view.connection("live");
  }

  apply(event) {
    if (this.finished || typeof event.seq !== "number" || event.seq <= this.cursor) return;
    this.cursor = event.seq;
    this.receivedSinceOpen = true;
    this.attempt = 0;
    if (event.type === "error" && event.error && TEXT_MISSING.has(event.error.code)) this.missing = true;
    this.view.event(event);
    if (event.type === "done" && event.seq > this.settled) {
      this.close(true);
      if (this.missing) this.settleFromStore();
      else this.view.ended(event);
    }
  }

  /** The answer ended with a hole in what was shown: it ends as the server stored it,
   * never partial and marked complete. If the store cannot be read now, it says so
   * (a reload shows it whole). */
  async settleFromStore() {
    let message;
    try {
      message = await messages.get(this.messageId);
    } catch {
      this.view.failed("part of its text did not arrive; reload to see all of it");
      return;
    }
    this.view.settled(message);
  }

  lost(reason) {
    if (this.finished) return;
    this.connection = null;
    this.view.connection("reconnecting", reason);
    // Nothing came through since the last attempt: the message may have ended meanwhile.
    if (!this.receivedSinceOpen && this.attempt > 0) this.checkEnded();
    this.schedule();
  }

  subscribed(status) {
    // A finished message with nothing after our cursor streams nothing more.
    if (status && status !== "streaming") this.checkEnded();
  }

  schedule() {
    const ceiling = Math.min(FIRST_RETRY_MS * 2 ** this.attempt, MAX_RETRY_MS);
    const delay = ceiling / 2 + Math.random() * (ceiling / 2);
    this.attempt += 1;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.open(), delay);
  }

  retryNow() {
    clearTimeout(this.timer);
    this.open();
  }

  async checkEnded() {
    let message;
    try {
      message = await messages.get(this.messageId);
    } catch (error) {
      if (error.status === 404) this.fail("this message no longer exists");
      return;
    }
    // Ended: shown as stored, whatever the stream had still to give (it keeps failing:
    // this is asked only after a retry that got nothing).
    if (this.finished || message.status === "streaming") return;
    this.close();
    this.view.settled(message);
  }

  fail(message) {
    if (this.finished) return;
    this.close();
    this.view.failed(message);
  }
}
