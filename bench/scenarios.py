"""The benchmark's scenarios, each run against our servers and then against the baseline.

Every scenario starts fresh server processes (so memory and CPU deltas belong to it),
plans its streams with arrivals spread over a ramp, runs them from the load processes and
turns what the clients saw plus the servers' /proc figures into one dict of figures per
side. The issue's targets are noted beside each scenario; they are reported, never
asserted.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import database, servers
from bench.load import (
    DISCONNECT,
    READ,
    RESUME,
    STOP_READING,
    StreamPlan,
    StreamResult,
    run_in_processes,
    run_users,
)
from bench.stats import summary

# A fixed multilingual text (emoji split across token bytes included), repeated to the
# requested length, so ours and the baseline stream the same tokens.
TEXT = (
    "Streaming tokens to many readers at once. 日本語のテキストも流れます。 "
    "مرحبا بالعالم 👋🏽 and a family 👨\u200d👩\u200d👧\u200d👦 arrive whole. "
)
SETTLE = 2.0  # seconds between starting the servers' clocks and the first arrival


@dataclass
class Options:
    # 0: one server process per core, as deployments run them (each side gets as many),
    # when REDIS_URL is set; one with the embedded defaults, which are single-process.
    servers: int = 0
    load_processes: int = 2
    baseline: bool = True
    steady_streams: int = 1000
    steady_rate: float = 60.0
    steady_seconds: float = 20.0
    steady_ramp: float = 10.0
    mixed_streams: int = 3000
    mixed_rate: float = 10.0
    mixed_seconds: float = 20.0
    mixed_ramp: float = 15.0
    memory_streams: int = 1000
    slow_clients: int = 50
    abort_streams: int = 100
    resume_streams: int = 200
    replay_bytes: int = 1_000_000
    replay_clients: int = 100
    users: int = 3000
    users_seconds: float = 60.0
    users_ramp: float = 20.0
    users_think: float = 3.0
    users_tokens: int = 40
    users_rate: float = 10.0
    # 1: each user opens a new connection per answer (by default a user keeps the one its
    # last answer came over, as the chat page keeps its WebSocket).
    users_reconnect: int = 0
    ttft_rate: float = 100.0
    ttft_seconds: float = 10.0
    ttft_ms: float = 50.0
    creates_in_flight: int = 0  # > 0: bound message creations awaiting their answer
    # 1: every message post over SSE carries an ``Idempotency-Key``, as the chat page's do.
    idempotency_keys: int = 0
    # What serves the baseline relay: "uvicorn" (the seeds' stack, the targets' baseline)
    # or "daphne" (the server ours must run on), which tells Daphne's share of a figure
    # from ours.
    relay_server: str = "uvicorn"
    profile: str = ""  # a directory: record py-spy flame graphs of our servers there
    log_dir: Path = Path("var/bench/logs")
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Side:
    """One side's servers for one scenario."""

    name: str  # "ours" or "baseline"
    cluster: servers.Cluster
    ports: list[int]
    # (API token, conversation id) of each simulated user; empty for the baseline.
    accounts: list[tuple[str, str]] = field(default_factory=list)
    # Whether its message posts carry an ``Idempotency-Key`` (``Options.idempotency_keys``).
    keyed: bool = False

    def port(self, i: int) -> int:
        return self.ports[i % len(self.ports)]


def our_env(options: Options, **extra: str) -> dict[str, str]:
    env = dict(options.env)
    env.update(
        DJANGO_SETTINGS_MODULE="chatsite.settings",
        STREAM_EMIT_STAMPS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def start_ours(options: Options, tag: str, streams: int, **extra: str) -> Side:
    env = our_env(options, **extra)
    procs = [
        servers.daphne(f"{tag}-daphne-{i}", env, options.log_dir) for i in range(options.servers)
    ]
    for p in procs:
        p.wait_ready("/healthz")
        if options.profile:
            servers.profile(p, Path(options.profile))
    side = Side("ours", servers.Cluster(procs), [p.port for p in procs])
    side.accounts = database.accounts(streams)
    side.keyed = bool(options.idempotency_keys)
    return side


def start_baseline(options: Options, tag: str, **extra: str) -> Side:
    env = dict(options.env)
    env.update(PYTHONUNBUFFERED="1", **extra)
    procs = [
        servers.relay(f"{tag}-relay-{i}", env, options.log_dir, options.relay_server)
        for i in range(options.servers)
    ]
    for p in procs:
        p.wait_ready("/docs")
    return Side("baseline", servers.Cluster(procs), [p.port for p in procs])


def plans_for(
    side: Side,
    count: int,
    simulation: dict[str, Any],
    ramp: float,
    *,
    transports: Callable[[int], str] | None = None,
    action: str = READ,
    act_after: int = 0,
    content: str = "Tell me something.",
    budget: float = 120.0,
    hold: float = 0.0,
    rcvbuf: int | None = None,
) -> list[StreamPlan]:
    start = time.time() + SETTLE
    plans = []
    for i in range(count):
        transport = "relay" if side.name == "baseline" else (transports or (lambda _: "sse"))(i)
        at = start + ramp * i / max(count, 1)
        plans.append(
            StreamPlan(
                transport=transport,
                host="127.0.0.1",
                port=side.port(i),
                token=side.accounts[i][0] if side.accounts else "",
                conversation=side.accounts[i][1] if side.accounts else "",
                start_at=at,
                simulation=simulation,
                content=content,
                action=action,
                act_after=act_after,
                deadline=at + budget,
                hold_until=start + ramp + hold,
                rcvbuf=rcvbuf,
                keyed=side.keyed,
            )
        )
    return plans


def half_and_half(i: int) -> str:
    return "sse" if i % 2 == 0 else "ws"


# --- figures ---------------------------------------------------------------------------
def stream_figures(results: list[StreamResult], ttft_ms: float | None) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    errors = [r.error for r in results if r.error is not None]
    tokens = sum(r.tokens for r in results)
    first = min((r.sent_at for r in results if r.sent_at), default=0.0)
    last = max((r.last_at for r in results if r.last_at), default=0.0)
    ttft = [(r.first_delta_at - r.sent_at) * 1000 for r in ok if r.first_delta_at]
    figures: dict[str, Any] = {
        "streams": len(results),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "tokens": tokens,
        "tokens_per_second": tokens / (last - first) if last > first else None,
        "ttft_ms": summary(ttft),
        "accept_ms": summary([(r.accepted_at - r.sent_at) * 1000 for r in ok if r.accepted_at]),
        "gap_ms": summary([g for r in ok for g in r.gaps]),
        "added_latency_ms": summary([x for r in ok for x in r.latencies]),
        "frames_per_token": (sum(r.frames for r in ok) / max(1, sum(r.tokens for r in ok))),
    }
    if ttft_ms is not None:
        figures["ttft_added_ms"] = summary([t - ttft_ms for t in ttft])
    return figures


def check_persisted(results: list[StreamResult]) -> dict[str, Any]:
    """Compare what each reader got with what the database holds for its message."""
    stored = database.persisted([r.message_id for r in results if r.error is None])
    lost = duplicated = mismatched = missing = unfinished = 0
    for r in results:
        if r.error is not None:
            continue
        row = stored.get(r.message_id)
        if row is None:
            missing += 1
            continue
        status, content = row
        if status != r.status:
            unfinished += 1
        if r.text == content:
            continue
        if content.startswith(r.text):
            lost += 1
        elif len(r.text) > len(content) and r.text.startswith(content):
            duplicated += 1
        else:
            mismatched += 1
    return {
        "lost_streams": lost,
        "duplicated_streams": duplicated,
        "mismatched_streams": mismatched,
        "missing_messages": missing,
        "status_differs": unfinished,
    }


@dataclass(frozen=True, slots=True)
class Reading:
    """What ``/proc`` says at one moment: the side's servers, and the whole machine."""

    processes: servers.Usage
    machine: servers.MachineUsage


def reading(side: Side) -> Reading:
    return Reading(side.cluster.usage(), servers.machine_usage())


def usage_figures(before: Reading, after: Reading, tokens: int, streams: int) -> dict[str, Any]:
    """The servers' CPU over the answers and over the tokens they delivered: both divide the
    same seconds (a scenario of short answers shows the cost of an answer, one of long
    answers the cost of a token). Beside it the whole machine's CPU over the run, and
    PostgreSQL's and Redis's, per answer: target 3's latencies depend on all of it, as
    the two cores also run the data services and the load generator, and a machine near
    100 % busy queues everyone's work."""
    cpu = after.processes.cpu_seconds - before.processes.cpu_seconds
    wall = after.machine.at - before.machine.at
    busy = after.machine.busy_seconds - before.machine.busy_seconds
    per_answer = 1000 / streams if streams else None

    def ms(seconds: float) -> float | None:
        return seconds * per_answer if per_answer is not None else None

    return {
        "cpu_seconds": cpu,
        "cpu_ms_per_answer": ms(cpu),
        "cpu_seconds_per_1k_tokens": cpu / tokens * 1000 if tokens else None,
        "rss_before_mib": before.processes.rss_bytes / 2**20,
        "rss_after_mib": after.processes.rss_bytes / 2**20,
        "machine_busy_percent": 100 * busy / (wall * (os.cpu_count() or 1)) if wall else None,
        "machine_cpu_ms_per_answer": ms(busy),
        "postgres_cpu_ms_per_answer": ms(
            after.machine.postgres_seconds - before.machine.postgres_seconds
        ),
        "redis_cpu_ms_per_answer": ms(after.machine.redis_seconds - before.machine.redis_seconds),
    }


def run_side(
    side: Side,
    plans: list[StreamPlan],
    options: Options,
    ttft_ms: float | None,
    samples: list[tuple[float, Callable[[], None]]] | None = None,
    check: bool = True,
) -> tuple[list[StreamResult], dict[str, Any]]:
    before = reading(side)
    results = run_in_processes(
        plans, options.load_processes, samples or [], options.creates_in_flight
    )
    after = reading(side)
    figures = stream_figures(results, ttft_ms)
    figures.update(usage_figures(before, after, figures["tokens"], len(plans)))
    if check and side.name == "ours":
        figures.update(check_persisted(results))
    return results, figures


def each_side(
    options: Options,
    tag: str,
    count: int,
    measure: Callable[[Side], dict[str, Any]],
    our_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``measure`` on fresh servers of ours (``count`` users), then of the baseline."""
    out: dict[str, Any] = {}
    side = start_ours(options, tag, count, **(our_extra or {}))
    try:
        out["ours"] = measure(side)
    finally:
        side.cluster.stop()
    if options.baseline:
        base = start_baseline(options, tag)
        try:
            out["baseline"] = measure(base)
        finally:
            base.cluster.stop()
    return out


def both_sides(
    options: Options,
    tag: str,
    count: int,
    build: Callable[[Side], list[StreamPlan]],
    ttft_ms: float | None,
    our_extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    return each_side(
        options, tag, count, lambda side: run_side(side, build(side), options, ttft_ms)[1],
        our_extra,
    )  # fmt: skip


# --- the scenarios -----------------------------------------------------------------------
def steady(options: Options) -> dict[str, Any]:
    """Targets 1 and 2: CPU per token <= the relay's; added latency p99 <= 30 ms."""
    sim = {
        "text": TEXT,
        "length": int(options.steady_rate * options.steady_seconds),
        "tokens_per_second": options.steady_rate,
        "ttft_ms": options.ttft_ms,
    }
    n = options.steady_streams
    return both_sides(
        options,
        "steady",
        n,
        lambda side: plans_for(side, n, sim, options.steady_ramp),
        options.ttft_ms,
    )


def mixed(options: Options) -> dict[str, Any]:
    """Target 3: half SSE, half WS; zero errors, nothing lost, added latency p99 <= 100 ms."""
    sim = {
        "text": TEXT,
        "length": int(options.mixed_rate * options.mixed_seconds),
        "tokens_per_second": options.mixed_rate,
        "ttft_ms": options.ttft_ms,
    }
    n = options.mixed_streams
    return both_sides(
        options,
        "mixed",
        n,
        lambda side: plans_for(side, n, sim, options.mixed_ramp, transports=half_and_half),
        options.ttft_ms,
    )


def ttft(options: Options) -> dict[str, Any]:
    """Target 6: TTFT added p50 <= 10 ms, p99 <= 50 ms at ``ttft_rate`` new messages/s."""
    n = int(options.ttft_rate * options.ttft_seconds)
    sim = {"text": TEXT, "length": 20, "tokens_per_second": 50.0, "ttft_ms": options.ttft_ms}
    return both_sides(
        options,
        "ttft",
        n,
        lambda side: plans_for(side, n, sim, options.ttft_seconds, transports=half_and_half),
        options.ttft_ms,
    )


def memory(options: Options) -> dict[str, Any]:
    """Target 4: <= 16 KiB per open stream; a client that stops reading <= 256 KiB."""
    n, k = options.memory_streams, options.slow_clients
    ramp, hold = 5.0, 6.0
    slow = {"text": TEXT, "length": 60, "tokens_per_second": 2.0, "ttft_ms": options.ttft_ms}
    flood = {"text": TEXT, "length": 4000, "tokens_per_second": 400.0, "ttft_ms": 0.0}

    def measure(side: Side) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        side.cluster.usage()
        idle = side.cluster.usage()
        open_plans = plans_for(side, n, slow, ramp, transports=half_and_half, budget=90)
        sampled: dict[str, servers.Usage] = {}
        at = open_plans[-1].start_at + hold

        def sample() -> None:
            sampled["open"] = side.cluster.usage()

        results = run_in_processes(open_plans, options.load_processes, [(at, sample)])
        opened = sum(1 for r in results if r.error is None)
        figures["open_streams"] = opened
        figures["open_errors"] = n - opened
        grown = sampled["open"].rss_bytes - idle.rss_bytes
        figures["rss_per_open_stream_kib"] = grown / max(opened, 1) / 1024
        # Clients that stop reading after a few deltas while the server streams fast.
        before = side.cluster.usage()
        slow_plans = plans_for(
            side,
            k,
            flood,
            1.0,
            action=STOP_READING,
            act_after=5,
            hold=12.0,
            rcvbuf=4096,
            budget=90,
        )
        if side.accounts:
            for i, plan in enumerate(slow_plans):
                plan.token, plan.conversation = side.accounts[n + i]
        sampled.clear()
        results = run_in_processes(
            slow_plans, options.load_processes, [(slow_plans[0].hold_until - 1.0, sample)]
        )
        stalled = sum(1 for r in results if r.error is None)
        figures["stopped_clients"] = stalled
        figures["stopped_errors"] = k - stalled
        grown = sampled["open"].rss_bytes - before.rss_bytes
        figures["rss_per_stopped_client_kib"] = grown / max(stalled, 1) / 1024
        figures["rss_idle_mib"] = idle.rss_bytes / 2**20
        return figures

    return each_side(options, "memory", n + k, measure)


def abort(options: Options) -> dict[str, Any]:
    """Target 5a: client disconnect to engine abort p99 <= 100 ms (grace 0).

    The engine is the vLLM wire emulator, which records the moment it saw the request's
    connection close; both sides talk to it, so the figure needs nothing from our server.
    """
    out: dict[str, Any] = {}
    n = options.abort_streams
    emu = servers.emulator("abort-emulator", dict(options.env), options.log_dir)
    emu.wait_ready("/health")
    engine_env = {"ENGINE_URL": f"http://127.0.0.1:{emu.port}", "ENGINE_MODEL": "bench-model"}
    directive = json.dumps({"tokens": 400, "ttft_ms": 20, "tokens_per_second": 40})
    content = f"[[emu {directive}]]"

    def measure(side: Side, request_id: Callable[[StreamResult], str]) -> dict[str, Any]:
        plans = plans_for(
            side,
            n,
            {},
            5.0,
            transports=half_and_half,
            action=DISCONNECT,
            act_after=5,
            content=content,
            budget=60,
        )
        results = run_in_processes(plans, options.load_processes)
        latencies = []
        unaborted = 0
        with httpx.Client(base_url=f"http://127.0.0.1:{emu.port}", timeout=10) as client:
            for r in results:
                if r.error is not None or not r.closed_at:
                    continue
                record = None
                deadline = time.monotonic() + 5
                while time.monotonic() < deadline:
                    reply = client.get(f"/_emulator/requests/{request_id(r)}")
                    record = reply.json() if reply.status_code == 200 else None
                    if record and record.get("ended_at"):
                        break
                    time.sleep(0.05)
                if record and record.get("ended_at") and record["outcome"] == "aborted":
                    latencies.append((record["ended_at"] - r.closed_at) * 1000)
                else:
                    unaborted += 1
        return {
            "streams": n,
            "errors": sum(1 for r in results if r.error is not None),
            "error_samples": sorted({r.error for r in results if r.error})[:5],
            "not_aborted": unaborted,
            "abort_latency_ms": summary(latencies),
        }

    try:
        side = start_ours(options, "abort", n, STREAM_ABANDON_GRACE="0", **engine_env)
        try:
            out["ours"] = measure(side, lambda r: f"{r.message_id}.0")
        finally:
            side.cluster.stop()
        if options.baseline:
            base = start_baseline(options, "abort", **engine_env)
            try:
                out["baseline"] = measure(base, lambda r: r.message_id)
            finally:
                base.cluster.stop()
    finally:
        emu.stop()
    return out


def resume(options: Options) -> dict[str, Any]:
    """Target 5b: resume to first replayed event p99 <= 50 ms (the relay cannot resume)."""
    n = options.resume_streams
    sim = {"text": TEXT, "length": 200, "tokens_per_second": 40.0, "ttft_ms": options.ttft_ms}
    side = start_ours(options, "resume", n)
    try:
        plans = plans_for(
            side, n, sim, 5.0, transports=half_and_half, action=RESUME, act_after=10, budget=60
        )
        results, figures = run_side(side, plans, options, options.ttft_ms)
    finally:
        side.cluster.stop()
    for transport in ("sse", "ws"):
        resumed = [
            r
            for r in results
            if r.transport == transport and r.resumed_first_at and r.error is None
        ]
        figures[f"resume_{transport}_ms"] = summary(
            [(r.resumed_first_at - r.resume_started_at) * 1000 for r in resumed]
        )
        # The same, less the time the first event did not exist yet: a reader that
        # reconnects right after a token waits for the engine's next one, which is the
        # engine's pace and not the resume's. From the later of the reconnect and the
        # event's emission (a delta's stamp).
        figures[f"resume_{transport}_added_ms"] = summary(
            [
                (r.resumed_first_at - max(r.resume_started_at, r.resumed_first_emitted)) * 1000
                for r in resumed
            ]
        )
    return {"ours": figures}


def replay(options: Options) -> dict[str, Any]:
    """A finished answer of ``replay_bytes`` replayed to readers that stop reading.

    Replay pages through the log and is bound by the send buffer like live streaming, so a
    reader that stops costs what a stopped live reader costs, whatever the answer's size, and
    the memory comes back when they leave. The relay keeps nothing to replay: ours only.
    """
    n = options.replay_clients
    # The simulated tokenizer averages ~2.5 bytes of this text per token.
    tokens = max(1, int(options.replay_bytes / 2.4))
    side = start_ours(options, "replay", n + 1, MAX_TOKENS_CAP=str(tokens))
    figures: dict[str, Any] = {}
    try:
        token, conversation = side.accounts[0]
        sim = {"text": TEXT, "length": tokens, "tokens_per_second": 1e6, "ttft_ms": 0.0}
        with httpx.Client(
            base_url=f"http://127.0.0.1:{side.port(0)}",
            headers={"Authorization": f"Token {token}"},
            timeout=30,
        ) as api:
            started = time.monotonic()
            answer = api.post(
                f"/api/conversations/{conversation}/messages/",
                json={
                    "content": "A long one.",
                    "params": {"max_tokens": tokens, "simulation": sim},
                },
            )
            answer.raise_for_status()
            message_id = answer.json()["message"]["id"]

            def finished() -> bool:
                return api.get(f"/api/messages/{message_id}/").json()["status"] != "streaming"

            servers.wait_for(finished, timeout=600, interval=0.5)
            figures["generate_seconds"] = time.monotonic() - started
            stored = api.get(f"/api/messages/{message_id}/").json()
        figures["answer_bytes"] = len(stored["content"].encode())
        figures["answer_status"] = stored["status"]
        # Readers that read it all first: the whole text, replayed in bounded pages (and
        # the servers' pools warmed, so the idle figure below is a settled one).
        full = plans_for(side, 10, {}, 0.5, transports=half_and_half, budget=120)
        for plan in full:
            plan.token, plan.message_id = token, message_id
        readers = run_in_processes(full, options.load_processes)
        ok = [r for r in readers if r.error is None]
        figures["full_readers"] = len(ok)
        figures["full_readers_exact"] = sum(1 for r in ok if r.text == stored["content"])
        figures["full_replay_seconds"] = summary([r.last_at - r.sent_at for r in ok if r.last_at])
        idle = side.cluster.usage()
        plans = plans_for(
            side, n, {}, 1.0, transports=half_and_half, action=STOP_READING, act_after=1,
            hold=10.0, rcvbuf=4096, budget=90,
        )  # fmt: skip
        for plan in plans:
            plan.token, plan.message_id = token, message_id
        sampled: dict[str, servers.Usage] = {}

        def sample() -> None:
            sampled["held"] = side.cluster.usage()

        results = run_in_processes(
            plans, options.load_processes, [(plans[0].hold_until - 1.0, sample)]
        )
        held = sum(1 for r in results if r.error is None)
        figures["stopped_readers"] = held
        figures["stopped_errors"] = n - held
        figures["error_samples"] = sorted({r.error for r in results if r.error})[:5]
        grown = sampled["held"].rss_bytes - idle.rss_bytes
        figures["rss_per_stopped_reader_kib"] = grown / max(held, 1) / 1024
        # Every reader has closed: what stays is what the replays did not give back.
        time.sleep(2.0)  # the servers' close handling settles; nothing to await across processes
        left = side.cluster.usage().rss_bytes - idle.rss_bytes
        figures["rss_left_after_close_mib"] = left / 2**20
    finally:
        side.cluster.stop()
    return {"ours": figures}


def users(options: Options) -> dict[str, Any]:
    """Target 3: the second seed's concurrent users as a closed loop (each sends a message,
    reads the answer, thinks, sends the next, over the connection it keeps), half SSE, half
    WS: zero errors, nothing lost, TTFT added p50 <= 100 ms and p99 <= 500 ms, added latency
    p99 <= 150 ms."""
    n = options.users
    sim = {
        "text": TEXT,
        "length": options.users_tokens,
        "tokens_per_second": options.users_rate,
        "ttft_ms": options.ttft_ms,
    }

    def measure(side: Side) -> dict[str, Any]:
        plans = plans_for(side, n, sim, options.users_ramp, transports=half_and_half, budget=90)
        until = plans[0].start_at + options.users_seconds
        for plan in plans:
            plan.think, plan.until = options.users_think, until
            plan.keep = not options.users_reconnect
        before = reading(side)
        results = run_users(plans, options.load_processes)
        after = reading(side)
        figures = stream_figures(results, options.ttft_ms)
        figures["users"] = n
        figures.update(usage_figures(before, after, figures["tokens"], len(results)))
        if side.name == "ours":
            figures.update(check_persisted(results))
        return figures

    return each_side(options, "users", n, measure)


SCENARIOS: dict[str, Callable[[Options], dict[str, Any]]] = {
    "steady": steady,
    "mixed": mixed,
    "memory": memory,
    "abort": abort,
    "resume": resume,
    "ttft": ttft,
    "replay": replay,
    "users": users,
}


def environment(options: Options) -> dict[str, str]:
    """The servers' environment: the caller's services when set, else embedded defaults."""
    env = dict(os.environ)
    env.setdefault("VAR_DIR", str(servers.ROOT / "var" / "bench"))
    env.pop("DATABASE_TEST_NAME", None)
    Path(env["VAR_DIR"]).mkdir(parents=True, exist_ok=True)
    return env
