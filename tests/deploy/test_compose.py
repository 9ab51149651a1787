"""compose.yaml, the Dockerfile and nginx.conf checked without a Docker engine.

What would only show up as a broken ``docker compose up`` - a dependency on a service that
does not exist, a setting the web tier never gets, a timeout that cuts streams - is
checked here from the files themselves.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from streaming.conf import DEFAULTS, environment_variables
from streaming.lifecycle import INTERRUPT_WAIT, LEAVE_WAIT, RELEASE_WAIT
from tests.proxy.nginx import NginxServer, nginx_binary

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
COMPOSE_CPU = ROOT / "compose.cpu.yaml"
NGINX_CONF = ROOT / "deploy" / "nginx.conf"
SETTINGS = ROOT / "chatsite" / "settings.py"
LAUNCHER = ROOT / "deploy" / "web.py"

# Settings whose built-in default is right in production, so compose.yaml leaves them out.
SAFE_DEFAULTS = {
    "DATABASE_POOL_TIMEOUT",
    "DATABASE_WAIT_TIMEOUT",
    "DEFAULT_MAX_TOKENS",
    "HTTP_REQUEST_TIMEOUT",
    "MAX_CONCURRENT_GENERATIONS_PER_USER",
    "MAX_CONVERSATION_CHARS",
    "MAX_CONVERSATION_MESSAGES",
    "MAX_MESSAGE_CHARS",
    "MAX_PRIOR_MESSAGES",
    "MAX_STOP_SEQUENCES",
    "MAX_TOKENS_CAP",
    "STREAM_AUTO_CONTINUE_INTERRUPTED",
    "STREAM_EMIT_STAMPS",  # a benchmark switch
    "STREAM_FLUSH_INTERVAL",
    "STREAM_LOG_TTL",
    "STREAM_COALESCE_WINDOW",
    "STREAM_MIN_WRITE_INTERVAL",
    "STREAM_PERSIST_RETRY_SECONDS",
    "STREAM_SEND_BUFFER_LIMIT",
    "STREAM_SLOW_CONSUMER_TIMEOUT",
    "STREAM_SESSION_RECHECK",
    "STREAM_SHUTDOWN_READER_FLUSH",
    "STREAM_HUB_MAX_EVENTS",
    "STREAM_LOG_READ_EVENTS",
    "STREAM_STOP_WAIT",
    "STREAM_WS_MAX_FRAME_CHARS",
    "STREAM_WS_MAX_SUBSCRIPTIONS",
    "STREAM_TITLES",
    "STREAM_TOKEN_CACHE_SECONDS",
    "STREAM_TITLE_MAX_TOKENS",
    "STREAM_TITLE_TIMEOUT",
    "DAPHNE_LOG_LEVEL",  # WARNING: Daphne's own lines stay out of the logs
    "DAPHNE_PING_INTERVAL",
    "DAPHNE_PING_TIMEOUT",
    "GC_THRESHOLD",
    "DATABASE_PREPARE_THRESHOLD",  # 0 only behind a pooler that cannot keep them
    "WEB_BIND",
}
# Read only by the test suite.
TEST_ONLY = {"DATABASE_TEST_NAME"}
# Without these the web tier silently runs on an embedded default or refuses requests.
REQUIRED = {
    "DATABASE_URL",
    "REDIS_URL",
    "ENGINE_URL",
    "ENGINE_MODEL",
    "ALLOWED_HOSTS",
    "STATIC_ROOT",
    "SECRET_KEY_FILE",
    "PROMETHEUS_MULTIPROC_DIR",
}
ENV_READ = re.compile(
    r"""(?:os\.environ\.get|os\.getenv|os\.environ\.setdefault|env_[a-z]+)\(\s*"([A-Z][A-Z0-9_]*)"|"""
    r"""os\.environ\[\s*"([A-Z][A-Z0-9_]*)"\s*\]"""
)
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, argument = match.groups()
        current = env.get(name)
        unset = current is None if operator in ("-", "?") else not current
        if operator and unset:
            if operator.endswith("?"):
                raise AssertionError(f"${{{name}}} must be set: {argument}")
            return argument
        return current or ""

    return VARIABLE.sub(substitute, value)


def load(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    return interpolate(yaml.safe_load(path.read_text()), env or {})


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Compose's merge of an override file: mappings merge, everything else is replaced."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def env_reads(path: Path) -> set[str]:
    return {a or b for a, b in ENV_READ.findall(path.read_text())}


def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_web", LAUNCHER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seconds(value: str) -> float:
    """A duration as compose (``30s``, ``1m30s``) or nginx (``600s``, ``10m``) writes it."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", value)
    assert parts, value
    return sum(float(n) * units[u or "s"] for n, u in parts)


def nginx_directive(location: str | None, name: str) -> str:
    """The value of a directive in a location block (or at server level for None)."""
    text = NGINX_CONF.read_text()
    if location is not None:
        start = text.index(location)
        text = text[text.index("{", start) + 1 : text.index("}", start)]
    else:
        text = re.sub(r"location [^{]*\{[^}]*\}", "", text[text.index("server {") :])
    values = re.findall(rf"^\s*{name}\s+([^;]*);", text, flags=re.MULTILINE)
    assert len(values) == 1, f"{name} in {location or 'server'}: {values}"
    return values[0]


STREAM_LOCATION = "location ~ ^/(api/messages/"
WS_LOCATION = "location /ws/ "


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def web_env(compose: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in compose["services"]["web"]["environment"].items()}


def depends_on(service: dict[str, Any]) -> list[str]:
    value = service.get("depends_on", [])
    return list(value) if isinstance(value, (dict, list)) else []


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, COMPOSE_CPU]], ids=["gpu", "cpu"])
def test_every_referenced_service_volume_and_file_exists(files: list[Path]):
    project = load(files[0])
    for override in files[1:]:
        overriding = load(override)
        assert set(overriding["services"]) <= set(project["services"]), "override names"
        project = merged(project, overriding)
    services = project["services"]
    enabled = {name for name, s in services.items() if not s.get("profiles")}
    named_volumes = set(project.get("volumes") or {})
    for name, service in services.items():
        for dependency in depends_on(service):
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if name in enabled:
                assert dependency in enabled, f"{name} needs {dependency}, off by profile"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume["source"]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in named_volumes, f"{name} uses undeclared volume {source}"
        assert "image" in service, f"{name} has no image"


def test_cpu_override_runs_the_web_tier_on_the_simulated_engine():
    project = merged(load(COMPOSE), load(COMPOSE_CPU))
    assert project["services"]["vllm"]["profiles"] == ["gpu"]
    for name in ("setup", "web"):
        assert project["services"][name]["environment"]["ENGINE_URL"] == ""
    # The GPU stack: everything starts with a bare `docker compose up`.
    gpu = load(COMPOSE)
    assert not any(s.get("profiles") for s in gpu["services"].values())
    assert gpu["services"]["web"]["environment"]["ENGINE_URL"] == "http://vllm:8000"


def test_web_tier_gets_every_setting_the_app_reads(compose: dict[str, Any], web_env):
    read = (
        env_reads(SETTINGS)
        | env_reads(LAUNCHER)
        | environment_variables()
        | {"PROMETHEUS_MULTIPROC_DIR"}
    )
    assert {"DATABASE_URL", "STREAM_PING_INTERVAL", "WEB_PROCESSES"} <= read  # the scan works
    image_env = set(re.findall(r"^\s+([A-Z][A-Z0-9_]*)=", (ROOT / "Dockerfile").read_text(), re.M))
    unaccounted = read - set(web_env) - image_env - SAFE_DEFAULTS - TEST_ONLY
    assert not unaccounted, f"set these for the web service or list them as safe: {unaccounted}"
    missing = {name for name in REQUIRED if not web_env.get(name)}
    assert not missing, f"the web service must set {missing}"
    setup_env = compose["services"]["setup"]["environment"]
    assert setup_env["DATABASE_URL"] == web_env["DATABASE_URL"]
    assert setup_env["STATIC_ROOT"] == web_env["STATIC_ROOT"]
    assert setup_env["SECRET_KEY_FILE"] == web_env["SECRET_KEY_FILE"]
    assert "web" in web_env["ALLOWED_HOSTS"].split(",")  # Prometheus scrapes web:8001
    assert "127.0.0.1" in web_env["ALLOWED_HOSTS"].split(",")  # the healthcheck


def test_no_http_timeout_anywhere():
    for path in (COMPOSE, COMPOSE_CPU, ROOT / "Dockerfile", NGINX_CONF, ROOT / "Makefile"):
        lines = [line.split("#")[0] for line in path.read_text().splitlines()]
        assert not any(re.search(r"http[-_]timeout", line) for line in lines), path
    command = launcher().daphne_command(8001)
    assert "-t" not in command and "--http-timeout" not in command
    assert "--proxy-headers" in command


def test_timeouts_fit_together(compose: dict[str, Any], web_env):
    ping = float(web_env["STREAM_PING_INTERVAL"])
    command = launcher().daphne_command(8001)
    daphne_ping = float(command[command.index("--ping-interval") + 1])
    for location in (STREAM_LOCATION, WS_LOCATION):
        read_timeout = seconds(nginx_directive(location, "proxy_read_timeout"))
        assert ping < read_timeout / 4, "several pings fit in nginx's read timeout"
        assert daphne_ping < read_timeout
    # Common load balancer idle timeouts are 60 s: the pings must come sooner.
    assert ping < 60 and daphne_ping < 60
    # A stream's longest silence is one ping interval; nginx's stream read timeout also
    # outlasts the longest generation's first-token wait (the stall timeout).
    assert seconds(nginx_directive(STREAM_LOCATION, "proxy_read_timeout")) > float(
        web_env["STREAM_STALL_TIMEOUT"]
    )
    # nginx drops an idle upstream connection before Twisted's 60 s idle timeout does.
    keepalive = re.search(r"upstream web \{[^}]*keepalive_timeout (\w+);", NGINX_CONF.read_text())
    assert keepalive is not None and seconds(keepalive.group(1)) < 60
    # Running generations finish (STREAM_SHUTDOWN_DEADLINE), and the process stops by
    # itself after its bounded steps whatever the database does, before Docker's SIGKILL.
    grace = seconds(compose["services"]["web"]["stop_grace_period"])
    stop = float(web_env["STREAM_SHUTDOWN_DEADLINE"]) + float(
        web_env.get("STREAM_SHUTDOWN_READER_FLUSH", DEFAULTS["SHUTDOWN_READER_FLUSH"])
    )
    assert stop + INTERRUPT_WAIT + LEAVE_WAIT + RELEASE_WAIT < grace
    # The reaper waits for a missed heartbeat or several, never less than one beat.
    assert float(web_env["STREAM_HEARTBEAT_INTERVAL"]) * 2 <= float(
        web_env["STREAM_HEARTBEAT_TIMEOUT"]
    )


def test_nginx_matches_the_web_tier(web_env):
    text = NGINX_CONF.read_text()
    ports = [int(p) for p in re.findall(r"^\s*server web:(\d+) ", text, flags=re.MULTILINE)]
    base, count = int(web_env["WEB_BASE_PORT"]), int(web_env["WEB_PROCESSES"])
    assert ports == list(range(base, base + count)), "one upstream line per Daphne process"
    limit = nginx_directive(None, "client_max_body_size")
    assert limit.endswith("m") and int(limit[:-1]) * 1024 * 1024 == int(
        web_env["MAX_REQUEST_BYTES"]
    )
    gzip_types = re.search(r"gzip_types([^;]*);", text)
    assert gzip_types is not None and "text/event-stream" not in gzip_types.group(1)
    for directive, value in (("proxy_buffering", "off"), ("proxy_cache", "off"), ("gzip", "off")):
        assert nginx_directive(STREAM_LOCATION, directive) == value
    assert nginx_directive(None, "proxy_http_version") == "1.1"
    assert "alias /srv/static/;" in text
    assert web_env["STATIC_ROOT"] == "/srv/static"


def test_every_path_that_streams_or_waits_on_an_answer_is_a_streaming_location():
    """A post answered with its stream (the page's), or waiting for its answer
    (``?wait=true``), is as long as the answer: through the general location it was
    buffered and cut at 60 s with nginx's 504 page."""
    pattern = re.search(r"location ~ (\^/\S+\$) \{", NGINX_CONF.read_text())
    assert pattern is not None and pattern.group(0).startswith(STREAM_LOCATION)
    streaming = re.compile(pattern.group(1))
    some = "0b5a4f7e-7d5e-4a4e-9f0e-3c2b1a0f9e8d"
    for path in (
        f"/api/messages/{some}/stream/",
        "/api/messages/",
        f"/api/conversations/{some}/messages/",
        f"/api/messages/{some}/regenerate/",
        f"/api/messages/{some}/edit/",
        f"/api/messages/{some}/continue/",
        "/v1/chat/completions",
    ):
        assert streaming.fullmatch(path), path
    for path in ("/", "/api/conversations/", f"/api/conversations/{some}/", "/v1/models"):
        assert not streaming.fullmatch(path), path


def test_vllm_service_serves_the_configured_model(compose: dict[str, Any], web_env):
    vllm = compose["services"]["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    model = vllm["command"][vllm["command"].index("--model") + 1]
    assert model == web_env["ENGINE_MODEL"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert load(COMPOSE, {"ENGINE_MODEL": "other/model"})["services"]["vllm"]["command"][1] == (
        "other/model"
    )
    assert vllm["ipc"] == "host"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    assert seconds(vllm["healthcheck"]["start_period"]) >= 300
    assert any(v.endswith(":/root/.cache/huggingface") for v in vllm["volumes"])
    assert "HF_TOKEN" in vllm["environment"]


def test_shipped_nginx_config_passes_nginx_t(tmp_path: Path):
    if nginx_binary() is None:
        pytest.skip("needs nginx (apt-get install nginx-light)")
    server = NginxServer(tmp_path, ["127.0.0.1:8001", "127.0.0.1:8002"])
    result = server.check()
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr
