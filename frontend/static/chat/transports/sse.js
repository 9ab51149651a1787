// Server-Sent Events: one EventSource per message stream, opened at a cursor with ?after=.
//
// EventSource would reconnect by itself, but on its own schedule and only for some
// failures; the stream closes it on the first error and reopens from its own cursor, so
// both transports recover the same way.

const TYPES = ["start", "delta", "reasoning", "tool_call", "done"];

export function openSse(messageId, after, sink) {
  const source = new EventSource(`/api/messages/${encodeURIComponent(messageId)}/stream/?after=${after}`, {
    withCredentials: true,
  });
  let closed = false;
  const deliver = (e) => {
    if (!closed) sink.event(JSON.parse(e.data));
  };
  for (const type of TYPES) source.addEventListener(type, deliver);
  // `event: error` frames and connection errors share the name "error": only the frames
  // carry data.
  source.addEventListener("error", (e) => {
    if (closed) return;
    if (typeof e.data === "string") {
      deliver(e);
      return;
    }
    closed = true;
    source.close();
    sink.lost("the event stream was interrupted");
  });
  source.addEventListener("open", () => {
    if (!closed) sink.opened();
  });
  return {
    close() {
      closed = true;
      source.close();
    },
  };
}
