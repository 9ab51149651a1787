// Server-Sent Events: one request per message stream, opened at a cursor with ?after=.
//
// Read with fetch (`eventstream.js`) rather than EventSource, which would reconnect by
// itself on its own schedule, and hides the server's heartbeats: a stream that fails or
// goes silent is closed and reported, and the stream reopens it from its own cursor, so
// both transports recover the same way.

import { INTERRUPTED, lostReason, readFrames } from "./eventstream.js";
import { heartbeat } from "./heartbeat.js";

const TYPES = new Set(["start", "delta", "reasoning", "tool_call", "error", "done"]);

export function openSse(messageId, after, sink) {
  const url = `/api/messages/${encodeURIComponent(messageId)}/stream/?after=${after}`;
  const aborted = new AbortController();
  let closed = false;
  let reading = null;
  const lose = (reason) => {
    if (closed) return;
    closed = true;
    sink.lost(reason);
  };
  (async () => {
    let response;
    // The server answers a stream's request at once: no answer for as long as three
    // heartbeats is a connection gone silent (a kept-alive one the network dropped, which
    // the browser would otherwise wait on for minutes).
    let unanswered = false;
    const answerDue = setTimeout(() => {
      unanswered = true;
      aborted.abort();
    }, heartbeat.limitMs);
    try {
      response = await fetch(url, {
        credentials: "same-origin",
        cache: "no-store",
        headers: { Accept: "text/event-stream" },
        signal: aborted.signal,
      });
    } catch {
      lose(unanswered ? "no answer from the server" : INTERRUPTED);
      return;
    } finally {
      clearTimeout(answerDue);
    }
    if (closed) return;
    if (response.status !== 200 || !response.body) {
      // A finished message read to its end (204), a refusal: the stream asks the REST API.
      response.body?.cancel().catch(() => {});
      lose(INTERRUPTED);
      return;
    }
    sink.opened();
    reading = readFrames(response, (frame) => {
      if (!closed && TYPES.has(frame.name)) sink.event(frame.data);
    });
    try {
      await reading.done;
      lose(INTERRUPTED);
    } catch (error) {
      lose(lostReason(error));
    }
  })();
  return {
    close() {
      closed = true;
      aborted.abort();
      if (reading) reading.cancel();
    },
  };
}
