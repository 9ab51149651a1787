"""The shipped Prometheus config and Grafana dashboard refer to metrics that exist, cover
what operators need to see, and docs/metrics.md documents every metric we define."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from streaming import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "streamchat.json"
# vLLM's metrics the dashboard may use (docs/vllm-wire.md).
VLLM_METRICS = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_success_total",
}
METRIC_NAME = re.compile(r"\b(?:chat|django)_[a-z_]+\b|vllm:[a-z_:]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def our_metrics() -> list[MetricWrapperBase]:
    return [m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)]


def sample_names(family_name: str, kind: str) -> set[str]:
    return {family_name + suffix for suffix in SUFFIXES.get(kind, ("",))}


def defined_sample_names() -> set[str]:
    from django_prometheus.middleware import Metrics

    Metrics.get_instance()  # the HTTP metrics exist once a middleware was built
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.name.startswith(("chat_", "django_")):
            names |= sample_names(family.name, family.type)
    for name in VLLM_METRICS:
        base = name.removesuffix("_total")
        names |= {name, f"{base}_bucket", f"{base}_sum", f"{base}_count"}
    return names


def dashboard_exprs() -> list[str]:
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_every_dashboard_query_uses_a_metric_that_exists():
    known = defined_sample_names()
    used = {name for expr in dashboard_exprs() for name in METRIC_NAME.findall(expr)}
    assert used, "no queries found"
    assert used <= known, f"unknown metrics: {sorted(used - known)}"


def test_dashboard_shows_what_operators_need():
    exprs = "\n".join(dashboard_exprs())
    for needle in (
        "sum by (le, transport) (rate(chat_stream_ttft_seconds_bucket",
        "sum by (le, transport) (rate(chat_stream_write_gap_seconds_bucket",
        "sum by (status) (rate(chat_stream_ends_total",
        "sum by (transport) (chat_streams_active)",
        "chat_stream_resumes_total",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert needle in exprs, needle
    dashboard = json.loads(DASHBOARD.read_text())
    datasources = {
        t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])
    }
    provisioned = yaml.safe_load((ROOT / "deploy/grafana/datasources/prometheus.yml").read_text())
    assert datasources == {d["uid"] for d in provisioned["datasources"]}
    provider = yaml.safe_load((ROOT / "deploy/grafana/dashboards/dashboards.yml").read_text())
    assert provider["providers"][0]["options"]["path"].endswith("/dashboards")


def test_prometheus_scrapes_one_web_process_and_vllm():
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    web_targets = [t for c in jobs["chat"]["static_configs"] for t in c["targets"]]
    # One process per web container answers for all of them (shared multiprocess dir).
    assert len(web_targets) == 1 and web_targets[0].startswith("web:")
    assert jobs["chat"]["metrics_path"] == "/metrics"
    vllm_targets = [t for c in jobs["vllm"]["static_configs"] for t in c["targets"]]
    assert vllm_targets == ["vllm:8000"]


def test_every_metric_is_documented():
    doc = (ROOT / "docs" / "metrics.md").read_text()
    for metric in our_metrics():
        (family,) = metric.describe()
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}`" in doc, f"{name} is not in docs/metrics.md"
        for label in metric._labelnames:
            assert f"`{label}`" in doc, f"label {label} of {name} is not in docs/metrics.md"
