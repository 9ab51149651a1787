"""``python -m bench``: run the scenarios, print ours beside the baseline, save JSON.

Every size is a flag; the defaults are the issue's targets as far as a 2-core machine
allows and finish within 15 minutes. Results go to ``bench/results/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from bench import database, servers
from bench.report import table
from bench.scenarios import SCENARIOS, Options, environment

RESULTS = Path(__file__).resolve().parent / "results"


def parse(argv: list[str] | None) -> tuple[Options, list[str], Path | None]:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, from: {', '.join(SCENARIOS)}",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--json", type=Path, help="where to write the results")
    defaults = Options()
    for f in fields(Options):
        if f.name in ("baseline", "log_dir", "env"):
            continue
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(getattr(defaults, f.name)), default=None
        )
    args = parser.parse_args(argv)
    options = Options()
    if args.quick:
        options = Options(
            steady_streams=50,
            steady_seconds=3,
            steady_ramp=2,
            mixed_streams=100,
            mixed_seconds=3,
            mixed_ramp=2,
            memory_streams=50,
            slow_clients=5,
            abort_streams=10,
            resume_streams=10,
            replay_bytes=200_000,
            replay_clients=20,
            users=100,
            users_seconds=10,
            users_ramp=3,
            users_think=1.0,
            users_tokens=20,
            ttft_rate=20,
            ttft_seconds=2,
        )
    for f in fields(Options):
        value = getattr(args, f.name, None)
        if value is not None and f.name not in ("baseline", "log_dir", "env"):
            setattr(options, f.name, value)
    options.baseline = not args.no_baseline
    if options.relay_server not in servers.RELAY_SERVERS:
        parser.error(f"--relay-server: one of {', '.join(servers.RELAY_SERVERS)}")
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    return options, names, args.json


def machine() -> dict[str, Any]:
    load = os.getloadavg()
    with open("/proc/meminfo") as f:
        total = int(f.readline().split()[1]) * 1024
    return {
        "cores": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(),
        "memory_gib": round(total / 2**30, 1),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "database": "postgresql" if os.environ.get("DATABASE_URL") else "sqlite (embedded)",
        "stream_log": "redis" if os.environ.get("REDIS_URL") else "memory (embedded)",
    }


def main(argv: list[str] | None = None) -> int:
    options, names, json_path = parse(argv)
    options.env = environment(options)
    if options.servers <= 0:
        options.servers = (os.cpu_count() or 1) if options.env.get("REDIS_URL") else 1
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    options.log_dir = Path(options.env["VAR_DIR"]) / "logs" / stamp
    database.setup(options.env)
    report: dict[str, Any] = {
        "started": stamp,
        "machine": {**machine(), "postgres": database.server_settings()},
        "options": {k: v for k, v in asdict(options).items() if k not in ("env", "log_dir")},
        "scenarios": {},
    }
    if report["machine"]["postgres"].get("autovacuum") == "off":
        print(
            "note: PostgreSQL's autovacuum is off: its tables keep every dead row version"
            " of the run, and its CPU per answer grows with them (docs/performance.md)",
            flush=True,
        )
    began = time.monotonic()
    path = json_path or RESULTS / f"{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        print(f"== {name} ...", flush=True)
        started = time.monotonic()
        result = SCENARIOS[name](options)
        result["seconds"] = round(time.monotonic() - started, 1)
        report["scenarios"][name] = result
        print(table({name: result}), flush=True)
        # Saved after every scenario: a long run that fails late keeps what it measured.
        path.write_text(json.dumps(report, indent=2, default=str))
    report["seconds"] = round(time.monotonic() - began, 1)
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    path.write_text(json.dumps(report, indent=2, default=str))
    print(table(report["scenarios"]))
    print(f"\n{report['seconds']} s; results: {path}; server logs: {options.log_dir}")
    return 0
