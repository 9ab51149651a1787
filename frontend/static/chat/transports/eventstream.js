// Reading a `text/event-stream` response with fetch: the stream a POST answers with, and a
// message's stream. EventSource hides the server's `: ping` comments, so a connection that
// went silent without closing could not be told from a quiet answer; read here, every
// byte counts as a sign of life (`heartbeat.js`).

import { heartbeat } from "./heartbeat.js";

/** Add `text`, read from the stream, to `buffer.text` with every line ending as "\n".
 * The format lets a line end in "\r\n", "\r" or "\n" (a proxy may rewrite them). A "\r"
 * ends its line at once; one that ended the last text (`buffer.cr`) may have its "\n"
 * at the start of this one. */
export function append(buffer, text) {
  if (!text) return;
  const rest = buffer.cr && text.startsWith("\n") ? text.slice(1) : text;
  buffer.cr = text.endsWith("\r");
  buffer.text += rest.replace(/\r\n?/g, "\n");
}

/** The complete events at the start of `buffer.text` (taken out of it), as
 * `{name, data}` with `data` parsed; comments and `id:`/`retry:` lines are skipped. */
export function* frames(buffer) {
  let end;
  while ((end = buffer.text.indexOf("\n\n")) !== -1) {
    const block = buffer.text.slice(0, end);
    buffer.text = buffer.text.slice(end + 2);
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (data.length) yield { name, data: JSON.parse(data.join("\n")) };
  }
}

/** The server's silence, as the error a read of the stream ends with. */
export class Silent extends Error {}

export const INTERRUPTED = "the event stream was interrupted";

/** Why a stream whose read ended (`readFrames`'s `done`, with its error if any) is lost. */
export function lostReason(error) {
  return error instanceof Silent ? error.message : INTERRUPTED;
}

/**
 * Read `response`'s events, calling `onFrame` with each. `done` resolves when the body
 * ends or `cancel()` was called, and rejects when the connection failed, or with `Silent`
 * after `heartbeat.limitMs` without a byte.
 */
export function readFrames(response, onFrame) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const buffer = { text: "", cr: false };
  let lastAt = Date.now();
  let silent = false;
  const watchdog = setInterval(() => {
    if (Date.now() - lastAt <= heartbeat.limitMs) return;
    silent = true;
    reader.cancel().catch(() => {});
  }, 1000);
  const done = (async () => {
    try {
      for (;;) {
        const { value, done: ended } = await reader.read();
        if (ended) break;
        lastAt = Date.now();
        append(buffer, decoder.decode(value, { stream: true }));
        for (const frame of frames(buffer)) onFrame(frame);
      }
    } finally {
      clearInterval(watchdog);
    }
    if (silent) throw new Silent("no heartbeat from the server");
  })();
  return {
    done,
    cancel() {
      reader.cancel().catch(() => {});
    },
  };
}
