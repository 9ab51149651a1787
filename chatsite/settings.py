"""Settings, read from the environment.

Every variable is listed with its default in docs/configuration.md. Unset service URLs
select the embedded defaults (SQLite, in-memory stream log, presence and channel layer,
simulated engine) so the product runs on a fresh machine with nothing else installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from streaming.conf import from_environ

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY") or "insecure-dev-key-set-SECRET_KEY-in-production"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_prometheus",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "streaming",
]

# The usual stack (django-prometheus, security, WhiteNoise, sessions, common, CSRF, auth,
# messages, clickjacking), each marked synchronous-only: chatsite/middleware.py says why.
MIDDLEWARE = [
    "chatsite.middleware.PrometheusBeforeMiddleware",
    "chatsite.middleware.SecurityMiddleware",
    "chatsite.middleware.WhiteNoiseMiddleware",
    "chatsite.middleware.SessionMiddleware",
    "chatsite.middleware.CommonMiddleware",
    "chatsite.middleware.CsrfViewMiddleware",
    "chatsite.middleware.AuthenticationMiddleware",
    "chatsite.middleware.MessageMiddleware",
    "chatsite.middleware.XFrameOptionsMiddleware",
    "chatsite.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
# The routes Channels serves before Django sees a request (its ``urlpatterns``): Django's
# 404 handler asks them too, to name a URL that lacks only its slash.
CHANNELS_URLCONF = "chatsite.routing"
ASGI_APPLICATION = "chatsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "frontend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# WAL with synchronous=NORMAL: readers never block the writer and a commit
# costs no fsync, which is what lets hundreds of streams start per second on the
# embedded default. IMMEDIATE transactions
# take the write lock up front, so concurrent writers wait instead of failing "locked".
SQLITE_OPTIONS = {
    "timeout": 20,
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    # Under ASGI every request runs its sync part in its own thread: persistent per-thread
    # connections would pile up, so PostgreSQL connections come from a bounded pool.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": env_int("DATABASE_POOL_SIZE", 10),
            "timeout": env_float("DATABASE_POOL_TIMEOUT", 30.0),
        }
        # A pooled connection the server ended while it waited (a restart, a terminated
        # backend, a proxy's idle timeout) is replaced, not handed to a request whose
        # first statement would fail on it: one empty query as it leaves the pool. The
        # database threads keep theirs between calls and check them without a round trip
        # (streaming.database), so an answer's calls do not pay for it.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
        # A connection PostgreSQL stops answering on without closing it (a frozen proxy or
        # pooler) fails its call after DATABASE_WAIT_TIMEOUT (chatsite.backends.postgresql),
        # and one it never answers the handshake of after connect_timeout, instead of
        # holding a request until TCP gives up (libpq waits forever, psycopg 130 s).
        # A ``connect_timeout`` in DATABASE_URL's query replaces this one.
        DATABASES["default"]["OPTIONS"].setdefault("connect_timeout", 10)
        # Parameters bound by the server, and a statement a connection has run this many
        # times prepared there: PostgreSQL then plans each of an answer's statements once
        # per connection instead of on every run (planning was a third of its CPU per
        # answer). 0 turns preparing off, for a pooler that cannot keep prepared
        # statements (PgBouncer before 1.21 in transaction mode).
        prepare_threshold = env_int("DATABASE_PREPARE_THRESHOLD", 5)
        DATABASES["default"]["OPTIONS"].update(
            server_side_binding=True,
            prepare_threshold=prepare_threshold if prepare_threshold > 0 else None,
        )
    if os.environ.get("DATABASE_TEST_NAME"):
        DATABASES["default"]["TEST"] = {"NAME": os.environ["DATABASE_TEST_NAME"]}
    if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        # A SQLite URL (the Daphne processes tests start) needs the same options.
        DATABASES["default"]["OPTIONS"] = dict(SQLITE_OPTIONS)
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(VAR_DIR / "db.sqlite3"),
            "OPTIONS": dict(SQLITE_OPTIONS),
            # A file, not :memory:, so Daphne processes started by tests share it.
            "TEST": {"NAME": str(VAR_DIR / "test.sqlite3")},
        }
    }
# django-prometheus's wrappers of the same backends count queries, errors and latency
# (chatsite.backends: the same, with the instrumented cursor class built once).
_PROMETHEUS_DB_ENGINES = {
    "django.db.backends.postgresql": "chatsite.backends.postgresql",
    "django.db.backends.sqlite3": "chatsite.backends.sqlite3",
}
DATABASES["default"]["ENGINE"] = _PROMETHEUS_DB_ENGINES.get(
    DATABASES["default"]["ENGINE"], DATABASES["default"]["ENGINE"]
)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Threads that run database calls for async code (streaming.database); keep it below the
# pool size so request threads always find a connection.
DATABASE_THREADS = env_int("DATABASE_THREADS", 4)
# Seconds a call waits for PostgreSQL's answer before its connection is given up and the
# call fails (503 unavailable); 0: no bound, for a long migration (deploy/web.py setup).
DATABASE_WAIT_TIMEOUT = env_float("DATABASE_WAIT_TIMEOUT", 30.0)
# Django requests (REST, admin, pages) served at once per process. Django runs each one in
# a thread of its own; past this bound a request waits its turn on the event loop, holding
# no thread and no connection, so a burst of thousands of POSTs queues instead of piling
# thousands of threads onto the pool. Streams are not Django requests and never wait here.
REQUEST_CONCURRENCY = env_int("REQUEST_CONCURRENCY", 32)
# Allocations between young-generation garbage collections in a serving process, whose
# start-up objects are frozen out of collections (chatsite.collector); 0: Python's own.
GC_THRESHOLD = env_int("GC_THRESHOLD", 10_000)

# Redis (the event log, presence and control: the STREAMING backends below). No Channels
# layer is configured: nothing uses one (control has its own connection, tokens never
# travel through a layer), so no consumer opens a channel or a receive per connection.
REDIS_URL = os.environ.get("REDIS_URL", "")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / "staticfiles"))
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"]
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 1024 * 1024)
# Seconds a request has to arrive whole, from its first byte to its body's last byte: a
# client that trickles it, a byte at a time, held its connection for ever (every byte put
# Twisted's 60 s idle clock back). nginx's client_header_timeout and client_body_timeout.
HTTP_REQUEST_TIMEOUT = env_float("HTTP_REQUEST_TIMEOUT", 60.0)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "streaming.api.authentication.NoOtherScheme",
        "rest_framework.authentication.SessionAuthentication",
        "streaming.api.authentication.CachedTokenAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "streaming.api.pagination.PageNumbers",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "streaming.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Streaming chat API",
    "DESCRIPTION": "Conversations, messages and their streams. See docs/protocol.md.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI and ReDoc from drf-spectacular-sidecar's static files, never a CDN: the
    # docs work offline and load nothing from outside the server.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # A field that refuses "" says so (minLength 1), so the schema admits what is accepted.
    "ENFORCE_NON_BLANK_FIELDS": True,
    # The schemes a caller can use; NoOtherScheme only refuses what is none of them.
    "AUTHENTICATION_WHITELIST": [
        "streaming.api.authentication.CachedTokenAuthentication",
        "streaming.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
}

# --- streaming: one dict, documented key by key in docs/configuration.md -------------------
# STREAM_<KEY> sets STREAMING["<KEY>"]; REDIS_URL selects the Redis log and presence,
# ENGINE_URL (with ENGINE_MODEL, ENGINE_API_KEY, ENGINE_CONNECT_TIMEOUT) the vLLM engine.
# A deployment may instead write the dict itself, naming any backend by its path.
STREAMING = from_environ()
if not REDIS_URL:
    # In-memory control reaches only this process, so a token replaced or a user changed
    # by another one (`manage.py drf_create_token -r`) could not be dropped from this
    # process's token cache: the embedded defaults keep none unless told to.
    STREAMING.setdefault("TOKEN_CACHE_SECONDS", 0.0)

# --- limits -----------------------------------------------------------------------------
MAX_TOKENS_CAP = env_int("MAX_TOKENS_CAP", 4096)
DEFAULT_MAX_TOKENS = env_int("DEFAULT_MAX_TOKENS", 1024)
MAX_MESSAGE_CHARS = env_int("MAX_MESSAGE_CHARS", 32000)
MAX_STOP_SEQUENCES = env_int("MAX_STOP_SEQUENCES", 8)
MAX_CONCURRENT_GENERATIONS_PER_USER = env_int("MAX_CONCURRENT_GENERATIONS_PER_USER", 4)
# Earlier messages one OpenAI-compatible request may carry (each is stored as a row).
MAX_PRIOR_MESSAGES = env_int("MAX_PRIOR_MESSAGES", 256)
# What one conversation may hold: every post, edit, regenerate and Continue reads all of
# its messages (the tree, and the prompt's path), so these bound the work of each.
MAX_CONVERSATION_MESSAGES = env_int("MAX_CONVERSATION_MESSAGES", 1000)
MAX_CONVERSATION_CHARS = env_int("MAX_CONVERSATION_CHARS", 2_000_000)

# --- observability -------------------------------------------------------------------
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text")  # "text" or "json"
LOG_LEVEL = os.environ.get("LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"stream_context": {"()": "streaming.logcontext.StreamContextFilter"}},
    "formatters": {
        "text": {
            "format": "%(asctime)s %(levelname)s %(name)s [%(message_id)s %(request_id)s] "
            "%(message)s"
        },
        "json": {"()": "streaming.logcontext.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT if LOG_FORMAT in {"text", "json"} else "text",
            "filters": ["stream_context"],
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # DAPHNE_LOG_LEVEL=INFO shows Daphne's "Listening on TCP address ..." when it listens
    # (make run sets it, so the quick start says when the server is up).
    "loggers": {
        "django": {"level": "INFO"},
        # A request naming a host not in ALLOWED_HOSTS is answered 400 saying so; Django
        # would also log each at ERROR with a traceback (anyone can send a Host).
        "django.security.DisallowedHost": {"level": "CRITICAL"},
        "daphne": {"level": os.environ.get("DAPHNE_LOG_LEVEL", "WARNING")},
    },
}
