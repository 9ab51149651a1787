"""The STREAMING settings: defaults, the environment's names, overrides and backends."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from streaming.conf import (
    BACKEND_KEYS,
    DEFAULTS,
    ENV_PREFIX,
    build_backend,
    from_environ,
    streaming_settings,
)
from streaming.streamlog.memory import MemoryStreamLog

DOC = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()


def documented_default(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def test_the_documentation_lists_every_key_with_its_variable_and_default():
    rows = re.findall(r"^\| `(STREAM_[A-Z_]+)` \| `([A-Z_]+)` \| `([^`]*)`", DOC, re.M)
    documented = {key: (variable, default) for variable, key, default in rows}
    tuning = {k: v for k, v in DEFAULTS.items() if k not in BACKEND_KEYS}
    assert set(documented) == set(tuning)
    for key, value in tuning.items():
        assert documented[key] == (ENV_PREFIX + key, documented_default(value)), key
    for key in BACKEND_KEYS:
        assert f"| `{key}` |" in DOC


def test_the_environment_sets_keys_by_name_and_type():
    config = from_environ(
        {"STREAM_STALL_TIMEOUT": "5", "STREAM_RETRY_MS": "250", "STREAM_EMIT_STAMPS": "yes"}
    )
    assert config == {"STALL_TIMEOUT": 5.0, "RETRY_MS": 250, "EMIT_STAMPS": True}
    assert from_environ({}) == {}
    with pytest.raises(ValueError, match="STREAM_RETRY_MS"):
        from_environ({"STREAM_RETRY_MS": "soon"})


def test_a_stream_variable_that_is_no_setting_is_said_at_start_up():
    """A typo (``STREAM_STAL_TIMEOUT``) was ignored without a word; it is said, and the
    rest still applies."""
    with pytest.warns(UserWarning, match="STREAM_STAL_TIMEOUT is not a setting"):
        config = from_environ({"STREAM_STAL_TIMEOUT": "5", "STREAM_RETRY_MS": "250"})
    assert config == {"RETRY_MS": 250}


def test_service_urls_pick_backends_by_path():
    config = from_environ(
        {"REDIS_URL": "redis://h:1/0", "ENGINE_URL": "http://e", "ENGINE_MODEL": "m"}
    )
    assert config["LOG"] == {
        "BACKEND": "streaming.streamlog.redis.RedisStreamLog",
        "LOCATION": "redis://h:1/0",
    }
    assert config["PRESENCE"]["BACKEND"] == "streaming.presence.redis.RedisPresence"
    assert config["ENGINES"]["default"]["LOCATION"] == "http://e"
    assert config["ENGINES"]["default"]["MODEL"] == "m"
    assert config["ENGINES"]["default"]["READ_TIMEOUT"] == DEFAULTS["STALL_TIMEOUT"]
    stalls = from_environ({"ENGINE_URL": "http://e", "STREAM_STALL_TIMEOUT": "4"})
    assert stalls["ENGINES"]["default"]["READ_TIMEOUT"] == 4.0


def test_overrides_apply_at_once_and_unknown_keys_are_refused():
    before = streaming_settings.STALL_TIMEOUT
    with override_settings(STREAMING={"STALL_TIMEOUT": before + 2.5}):
        assert before + 2.5 == streaming_settings.STALL_TIMEOUT
        assert DEFAULTS["PING_INTERVAL"] == streaming_settings.PING_INTERVAL
    assert before == streaming_settings.STALL_TIMEOUT
    with pytest.raises(AttributeError):
        streaming_settings.NO_SUCH_KEY  # noqa: B018
    with override_settings(STREAMING={"STAL_TIMEOUT": 1}), pytest.raises(ImproperlyConfigured):
        streaming_settings.check()


def test_a_backend_is_built_from_its_path_and_options():
    log = build_backend(
        {"BACKEND": "streaming.streamlog.memory.MemoryStreamLog", "MAX_MESSAGES": 3}
    )
    assert isinstance(log, MemoryStreamLog)
    assert log._max_messages == 3
    with pytest.raises(ValueError, match="BACKEND"):
        build_backend({"LOCATION": "x"})


def test_engine_models_add_a_server_per_model():
    config = from_environ(
        {
            "ENGINE_MODELS": '{"tiny": "http://a:8000", "big": "http://b:8000"}',
            "ENGINE_API_KEY": "k",
        }
    )
    engines = config["ENGINES"]
    assert engines["default"] == DEFAULTS["ENGINES"]["default"]  # the simulated engine
    assert engines["model:tiny"]["LOCATION"] == "http://a:8000"
    assert (engines["model:big"]["MODEL"], engines["model:big"]["API_KEY"]) == ("big", "k")
    with_default = from_environ({"ENGINE_URL": "http://e", "ENGINE_MODELS": '{"x": "http://x"}'})
    assert set(with_default["ENGINES"]) == {"default", "model:x"}
    assert with_default["ENGINES"]["default"]["LOCATION"] == "http://e"
    for bad in ("[1]", '{"x": 3}', "not json"):
        with pytest.raises(ValueError, match="ENGINE_MODELS"):
            from_environ({"ENGINE_MODELS": bad})
