// The user's feed (WebSocket, `subscribe` to `"topic": "user"`): what this person's other
// tabs and clients did, so this tab stays in step. One socket of its own, kept open and
// reopened with backoff; delivery is at most once, so after a reconnect `reconnected` asks
// the page to fetch what it shows again.

export function followFeed({ event, reconnected }) {
  let delay = 500;
  let opened = false;
  const open = () => {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/ws/chat/`);
    socket.addEventListener("open", () => {
      socket.send(JSON.stringify({ type: "subscribe", topic: "user" }));
      delay = 500;
      if (opened) reconnected();
      opened = true;
    });
    socket.addEventListener("message", (e) => {
      const frame = JSON.parse(e.data);
      if (frame.type === "feed") event(frame);
      else if (frame.type === "error" && frame.code === "feed_lagging") reconnected();
    });
    socket.addEventListener("close", () => {
      setTimeout(open, delay);
      delay = Math.min(delay * 2, 10000);
    });
  };
  if ("WebSocket" in window) open();
}
