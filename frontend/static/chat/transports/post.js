// The stream a POST answers with (one request per answer): its first `created` event says
// what the server made; the events after it are the answer's, as the SSE transport gets
// them. It is the stream's first connection; when it drops, the stream goes on over its
// transport from its cursor, as after any lost connection.

/** The response ended before its `created` event: what the server made is not known. */
export class StreamLost extends Error {}

function* frames(buffer) {
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

/** `{created, connection}` from a 200 `text/event-stream` response; `connection.attach(sink)`
 * delivers the events after `created` (held until then) as a transport does. */
export async function openedPost(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  const buffer = { text: "" };
  const held = [];
  let sink = null;
  let closed = false;
  let created = null;
  const deliver = (frame) => {
    if (sink) sink.event(frame.data);
    else held.push(frame.data);
  };
  const pump = async () => {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || closed) break;
        buffer.text += decoder.decode(value, { stream: true });
        for (const frame of frames(buffer)) {
          if (frame.name === "created" && created === null) created = frame.data;
          else deliver(frame);
        }
        if (created !== null && !pump.resolved) {
          pump.resolved = true;
          pump.resolve();
        }
      }
    } catch {
      // A dropped response: the stream takes over from its cursor.
    }
    if (!pump.resolved) {
      pump.resolved = true;
      pump.reject(new StreamLost("the server ended the answer's stream before saying what it created"));
    }
    if (!closed && sink) sink.lost("the event stream was interrupted");
    closed = true;
  };
  const ready = new Promise((resolve, reject) => Object.assign(pump, { resolve, reject }));
  pump();
  await ready;
  const connection = {
    attach(target) {
      sink = target;
      if (closed) {
        for (const event of held.splice(0)) target.event(event);
        target.lost("the event stream was interrupted");
      } else {
        target.opened();
        for (const event of held.splice(0)) target.event(event);
      }
      return {
        close() {
          closed = true;
          reader.cancel().catch(() => {});
        },
      };
    },
  };
  return { created, connection };
}
