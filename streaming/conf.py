"""The app's settings: one ``STREAMING`` dict, read through ``streaming_settings``.

Like DRF's ``api_settings``: every key has a documented default here, a project sets only
what it changes, and ``override_settings(STREAMING=...)`` takes effect at once. Backends
are chosen the way ``CACHES`` chooses a cache: ``{"BACKEND": "dotted.path.Class", ...}``,
the rest of the dict passed to the class as keyword arguments (lower-cased), so a third
backend needs no code change here.

``from_environ`` is what ``chatsite.settings`` builds the dict from: the variable
``STREAM_<KEY>`` sets ``STREAMING["<KEY>"]`` (``STREAM_STALL_TIMEOUT=5``), and
``REDIS_URL``/``ENGINE_URL`` pick the Redis and vLLM backends. docs/configuration.md
lists every key; a test checks that it lists exactly these, with these defaults.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from typing import Any

from django.core.signals import setting_changed
from django.utils.module_loading import import_string

ENV_PREFIX = "STREAM_"

# Every tuning value of the app, with its default. docs/configuration.md explains each.
DEFAULTS: dict[str, Any] = {
    # No token for this long ends a segment as `stalled`; also the engine's read timeout.
    "STALL_TIMEOUT": 30.0,
    # How long a generation keeps running after its last reader left (0 = abort at once).
    "ABANDON_GRACE": 10.0,
    # SSE `: ping` comments / WS heartbeats while nothing else is sent.
    "PING_INTERVAL": 15.0,
    # SSE `retry:` hint for EventSource reconnects, in milliseconds.
    "RETRY_MS": 1000,
    # Write-behind period for partial content, in seconds.
    "FLUSH_INTERVAL": 1.0,
    # Text produced within this many seconds of a generation's last log write becomes one
    # log event (a segment's start and its first text are never held back).
    "COALESCE_WINDOW": 0.015,
    # Readers write at most one frame per interval (merge-on-read), in seconds.
    "MIN_WRITE_INTERVAL": 0.02,
    # Unsent bytes a connection may hold in the server before its reader pauses.
    "SEND_BUFFER_LIMIT": 64 * 1024,
    # How long a connection may stay over that limit before it is closed (client resumes).
    "SLOW_CONSUMER_TIMEOUT": 30.0,
    # How long a finished message's log is kept for resumes, in seconds.
    "LOG_TTL": 24 * 3600,
    # Process heartbeat period, and how long without one before the reaper steps in.
    "HEARTBEAT_INTERVAL": 2.0,
    "HEARTBEAT_TIMEOUT": 10.0,
    # Continue interrupted answers automatically after reaping them.
    "AUTO_CONTINUE_INTERRUPTED": False,
    # On SIGTERM, how long running generations may take before being interrupted.
    "SHUTDOWN_DEADLINE": 20.0,
    # After generations ended on SIGTERM, how long readers get to send their last events.
    "SHUTDOWN_READER_FLUSH": 3.0,
    # Stamp each delta with the engine's emit time ("t"), for the benchmark's latency figures.
    "EMIT_STAMPS": False,
    # How long a final record the database refuses is retried (one it cannot reach is
    # retried until it can: generation.Generation._persist_final).
    "PERSIST_RETRY_SECONDS": 120.0,
    # Events a process keeps per message for its local readers; one further behind reads
    # back from the log, so a stalled client cannot pin a whole answer in memory.
    "HUB_MAX_EVENTS": 512,
    # Events read from the log at once by a reader that is behind or replays a finished
    # answer: bounds the memory a reader costs and the size of one merged frame.
    "LOG_READ_EVENTS": 512,
    # How long deleting a conversation or the admin's Stop waits for answers to end.
    "STOP_WAIT": 5.0,
    # The largest WebSocket frame a client may send, in characters, and how many messages
    # one socket may follow at once.
    "WS_MAX_FRAME_CHARS": 64 * 1024,
    "WS_MAX_SUBSCRIPTIONS": 64,
    # How long a process keeps an API token's user after looking it up (0: never). A
    # deleted token or a changed user is dropped at once everywhere, through control.
    "TOKEN_CACHE_SECONDS": 30.0,
    # How often a WebSocket opened with a session checks that the session still stands
    # (one that expired by age is closed); a logout closes its sockets at once anyway.
    "SESSION_RECHECK": 300.0,
    # Titles written by the engine after a conversation's first answer: "auto" (every
    # engine but the simulated one), true or false; the request's size and time limits.
    "TITLES": "auto",
    "TITLE_MAX_TOKENS": 16,
    "TITLE_TIMEOUT": 20.0,
    # The event log, reader presence, control and engines: {"BACKEND": path, **options}.
    "LOG": {"BACKEND": "streaming.streamlog.memory.MemoryStreamLog"},
    "PRESENCE": {"BACKEND": "streaming.presence.memory.MemoryPresence"},
    "CONTROL": {"BACKEND": "streaming.control.memory.MemoryControl"},
    "ENGINES": {"default": {"BACKEND": "streaming.engines.simulated.SimulatedEngine"}},
}

BACKEND_KEYS = ("LOG", "PRESENCE", "CONTROL", "ENGINES")
# The service variables ``from_environ`` reads besides ``STREAM_<KEY>``.
SERVICE_VARIABLES = (
    "REDIS_URL",
    "ENGINE_URL",
    "ENGINE_MODEL",
    "ENGINE_API_KEY",
    "ENGINE_CONNECT_TIMEOUT",
    "ENGINE_MODELS",
)


def environment_variables() -> set[str]:
    """Every variable ``from_environ`` reads."""
    tuning = {ENV_PREFIX + key for key in DEFAULTS if key not in BACKEND_KEYS}
    return tuning | set(SERVICE_VARIABLES)


def _parse(name: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            value = raw.strip().lower()
            if value in {"1", "true", "yes", "on"}:
                return True
            if value in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {type(default).__name__}") from None
    return raw


def from_environ(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The ``STREAMING`` dict the environment asks for (only what it sets)."""
    env = os.environ if environ is None else environ
    known = environment_variables()
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX) and n not in known):
        # Said, not refused: the prefix is common enough that another program's variable
        # may carry it; a typo of one of ours must not go unnoticed.
        warnings.warn(
            f"{name} is not a setting of this server (a typo of a STREAM_ variable?); "
            "docs/configuration.md lists them",
            stacklevel=2,
        )
    config: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        if key in BACKEND_KEYS:
            continue
        raw = env.get(ENV_PREFIX + key, "")
        if raw.strip():
            config[key] = _parse(ENV_PREFIX + key, raw, default)
    redis_url = env.get("REDIS_URL", "")
    if redis_url:
        config["LOG"] = {
            "BACKEND": "streaming.streamlog.redis.RedisStreamLog",
            "LOCATION": redis_url,
        }
        config["PRESENCE"] = {
            "BACKEND": "streaming.presence.redis.RedisPresence",
            "LOCATION": redis_url,
        }
        config["CONTROL"] = {
            "BACKEND": "streaming.control.redis.RedisControl",
            "LOCATION": redis_url,
        }
    engine_url = env.get("ENGINE_URL", "")
    if engine_url:
        config["ENGINES"] = {"default": _vllm(env, config, engine_url, env.get("ENGINE_MODEL", ""))}
    more = env.get("ENGINE_MODELS", "").strip()
    if more:
        # {"model name": "http://server", ...}: more models, each on its own server.
        try:
            servers = json.loads(more)
        except ValueError:
            servers = None
        if not isinstance(servers, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in servers.items()
        ):
            raise ValueError('ENGINE_MODELS: expected {"model name": "http://server", ...}')
        engines = dict(config.get("ENGINES") or DEFAULTS["ENGINES"])
        for model, url in servers.items():
            engines[f"model:{model}"] = _vllm(env, config, url, model)
        config["ENGINES"] = engines
    return config


def _vllm(env: Mapping[str, str], config: dict[str, Any], url: str, model: str) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "BACKEND": "streaming.engines.vllm.VLLMEngine",
        "LOCATION": url,
        "MODEL": model,
        # The engine's read timeout is the stall timeout.
        "READ_TIMEOUT": config.get("STALL_TIMEOUT", DEFAULTS["STALL_TIMEOUT"]),
    }
    if env.get("ENGINE_API_KEY"):
        engine["API_KEY"] = env["ENGINE_API_KEY"]
    if env.get("ENGINE_CONNECT_TIMEOUT", "").strip():
        engine["CONNECT_TIMEOUT"] = float(env["ENGINE_CONNECT_TIMEOUT"])
    return engine


class StreamingSettings:
    """Attribute access to ``settings.STREAMING`` over ``DEFAULTS``; unknown keys raise.

    A value is looked up once and then kept as a plain attribute (as DRF's ``api_settings``
    does), so the per-token code that reads settings pays an attribute lookup, not a call.
    """

    def __init__(self) -> None:
        self._cached: set[str] = set()

    def _user(self) -> dict[str, Any]:
        from django.conf import settings

        return dict(getattr(settings, "STREAMING", {}) or {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in DEFAULTS:
            raise AttributeError(f"STREAMING has no setting {name!r}")
        value = self._user().get(name, DEFAULTS[name])
        setattr(self, name, value)  # __getattr__ is not called for it again
        self._cached.add(name)
        return value

    def reload(self) -> None:
        for name in self._cached:
            delattr(self, name)
        self._cached.clear()

    def check(self) -> None:
        """Raise ``ImproperlyConfigured`` for a key that is not a setting (a typo)."""
        from django.core.exceptions import ImproperlyConfigured

        unknown = sorted(set(self._user()) - set(DEFAULTS))
        if unknown:
            raise ImproperlyConfigured(f"STREAMING has no setting {unknown[0]!r}")


streaming_settings = StreamingSettings()


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "STREAMING":
        streaming_settings.reload()


setting_changed.connect(_reload)


def build_backend(config: Mapping[str, Any], **extra: Any) -> Any:
    """An instance of ``config["BACKEND"]``, given the other keys (lower-cased) and ``extra``."""
    options = {k.lower(): v for k, v in config.items() if k != "BACKEND"}
    if "BACKEND" not in config:
        raise ValueError(f"a backend needs a BACKEND path: {dict(config)!r}")
    backend = import_string(config["BACKEND"])
    return backend(**options, **extra)
