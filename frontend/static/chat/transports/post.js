// The stream a POST answers with (one request per answer): its first `created` event says
// what the server made; the events after it are the answer's, as the SSE transport gets
// them. It is the stream's first connection; when it drops, the stream goes on over its
// transport from its cursor, as after any lost connection.

import { INTERRUPTED, lostReason, readFrames } from "./eventstream.js";

/** The response ended before its `created` event: what the server made is not known. */
export class StreamLost extends Error {}

/** `{created, connection}` from a 200 `text/event-stream` response; `connection.attach(sink)`
 * delivers the events after `created` (held until then) as a transport does. */
export async function openedPost(response) {
  const held = [];
  let sink = null;
  let closed = false;
  let created = null;
  let resolve;
  let reject;
  const ready = new Promise((yes, no) => {
    resolve = yes;
    reject = no;
  });
  const reading = readFrames(response, (frame) => {
    if (frame.name === "created" && created === null) {
      created = frame.data;
      resolve();
    } else if (sink) sink.event(frame.data);
    else held.push(frame.data);
  });
  reading.done
    .catch((error) => error)
    .then((error) => {
      // Ended, dropped or silent: the stream takes over from its cursor.
      if (created === null) {
        reject(new StreamLost("the server ended the answer's stream before saying what it created"));
      }
      if (!closed && sink) sink.lost(lostReason(error));
      closed = true;
    });
  await ready;
  const connection = {
    attach(target) {
      sink = target;
      if (closed) {
        for (const event of held.splice(0)) target.event(event);
        target.lost(INTERRUPTED);
      } else {
        target.opened();
        for (const event of held.splice(0)) target.event(event);
      }
      return {
        close() {
          closed = true;
          reading.cancel();
        },
      };
    },
  };
  return { created, connection };
}
