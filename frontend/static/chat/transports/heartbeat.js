// How long a connection may stay silent before it counts as lost: three of the server's
// heartbeats (`STREAM_PING_INTERVAL`, from the page's config). A connection can go silent
// without closing (a NAT or proxy that dropped it, a laptop that slept): only the silence
// tells, and both transports listen for it.

export const heartbeat = {
  limitMs: 45000,
  configure(pingIntervalSeconds) {
    this.limitMs = Math.max(pingIntervalSeconds * 3, 5) * 1000;
  },
};
