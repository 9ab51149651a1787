"""``python -m bench.rendering``: the chat page's main thread while a long answer streams.

Chromium (Debian's, as in the e2e tests) opens the real page on a real Daphne process (the
simulated engine), asks for a scripted markdown answer - 50,000 characters of headings,
paragraphs, lists, tables and code by default - at 200 tokens/s, and records a Chrome
trace of the whole answer. From the trace's renderer main thread:

- **per frame**: the main thread's busy time (top-level tasks: script, style, layout,
  paint) between one frame's start and the next (``BeginMainThreadFrame``), p50/p95/max
  over every frame while the answer streams;
- **long tasks**: top-level tasks over 50 ms, and the longest task;
- **total**: busy time over the whole answer, and its share of the wall time.

The figures are written to ``bench/results/rendering-<timestamp>.json`` and printed. The
page's own code is not instrumented: what is measured is what the browser did.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench import database, servers
from bench.chromium import CHROMIUM, CHROMIUM_ARGS

RESULTS = Path(__file__).resolve().parent / "results"
CATEGORIES = [
    "toplevel",
    "devtools.timeline",
    "disabled-by-default-devtools.timeline",
    "disabled-by-default-devtools.timeline.frame",
    "blink.user_timing",
]
LONG_TASK_MS = 50.0
PASSWORD = "bench-render-123"

SECTION = """## Part {n}: {topic}

The {topic} part covers what a reader needs, with `inline code`, **bold** words, a
[link](https://example.com/{n}) and a little *emphasis*, in a paragraph long enough to wrap
over several lines on a desktop screen and more on a phone.

- first point about {topic}
- second point, with a nested list:
  - detail one
  - detail two
- third point

| Setting | Value | Why |
|:--------|------:|-----|
| rows | {n} | tables stream row by row |
| columns | 3 | and cell by cell |
| part | {n} | the same table shape each time |

```python
def part_{n}(values: list[int]) -> int:
    \"\"\"Sum the squares of the values of part {n}.\"\"\"
    total = 0
    for value in values:
        total += value * value
    return total


print(part_{n}([1, 2, 3]))
```

"""
TOPICS = ("setup", "streaming", "rendering", "tables", "code", "lists", "links", "limits")


def answer_text(chars: int) -> str:
    """A markdown answer of exactly ``chars`` characters, the same every run."""
    parts = ["# A long answer\n\nAn answer long enough to test rendering as it streams.\n\n"]
    n = 0
    while sum(len(p) for p in parts) < chars:
        n += 1
        parts.append(SECTION.format(n=n, topic=TOPICS[n % len(TOPICS)]))
    return "".join(parts)[:chars]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def analyse(trace: dict[str, Any]) -> dict[str, Any]:
    """Busy time per frame on the renderer main thread between the page's marks."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    marks = {
        e["name"]: (e["pid"], e["tid"], e["ts"])
        for e in events
        if e.get("name") in ("bench:first-text", "bench:ended")
    }
    if len(marks) < 2:
        raise RuntimeError(f"the page's marks are missing from the trace: {sorted(marks)}")
    pid, tid, start = marks["bench:first-text"]
    end = marks["bench:ended"][2]
    on_main = [e for e in events if e.get("pid") == pid and e.get("tid") == tid]
    tasks = sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in on_main
        # Top-level tasks only ("ThreadControllerImpl::RunTask" is nested in them).
        if e.get("ph") == "X" and e.get("name") == "RunTask" and start <= e["ts"] <= end
    )
    frames = sorted(
        e["ts"]
        for e in on_main
        if e.get("name") == "BeginMainThreadFrame" and start <= e["ts"] <= end
    )
    if len(frames) < 2:
        raise RuntimeError("no frames in the trace (is the page visible?)")
    busy = []
    i = 0
    for begin, after in itertools.pairwise(frames):
        total = 0.0
        while i < len(tasks) and tasks[i][0] < after:
            task_start, task_end = tasks[i]
            if task_end > begin:
                total += min(task_end, after) - max(task_start, begin)
            if task_end <= after:
                i += 1
            else:
                break
        busy.append(total / 1000)
    durations = [(b - a) / 1000 for a, b in tasks]
    wall_ms = (end - start) / 1000
    main_ms = sum(durations)
    return {
        "frames": len(busy),
        "frame_busy_ms": {
            "p50": round(percentile(busy, 50), 2),
            "p95": round(percentile(busy, 95), 2),
            "max": round(max(busy), 2),
            "mean": round(statistics.fmean(busy), 2),
        },
        "long_tasks": sum(1 for d in durations if d > LONG_TASK_MS),
        "longest_task_ms": round(max(durations, default=0.0), 1),
        "main_thread_ms": round(main_ms, 1),
        "wall_ms": round(wall_ms, 1),
        "main_thread_share": round(main_ms / wall_ms, 3) if wall_ms else None,
    }


WATCH = """() => {
  // Marks in the trace: the answer's first text, and its end. Cheap observers, so that
  // the measuring costs next to nothing: one for the first text (then disconnected), one
  // for the answer's status attribute.
  const log = document.getElementById("log");
  const first = new MutationObserver(() => {
    const content = log.querySelector("article.assistant .content");
    if (content && content.firstChild) {
      performance.mark("bench:first-text");
      first.disconnect();
    }
  });
  first.observe(log, {subtree: true, childList: true});
  new MutationObserver((records) => {
    for (const record of records) {
      const status = record.target.dataset.status;
      if (record.target.matches("article.assistant") && status && status !== "streaming") {
        performance.mark("bench:ended");
        window.benchEnded = status;
      }
    }
  }).observe(log, {subtree: true, attributes: true, attributeFilter: ["data-status"]});
}"""


def run(
    chars: int, tokens_per_second: float, viewport: tuple[int, int], keep_trace: Path | None
) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    env = dict(os.environ)
    env.setdefault("VAR_DIR", str(servers.ROOT / "var" / "bench"))
    env.pop("DATABASE_TEST_NAME", None)
    Path(env["VAR_DIR"]).mkdir(parents=True, exist_ok=True)
    # One answer of this size needs more tokens than the default cap.
    env.update(MAX_TOKENS_CAP="100000", STREAM_ABANDON_GRACE="30")
    database.setup(env)
    from django.contrib.auth.models import User

    username = f"render-{int(time.time())}"
    User.objects.create_user(username, password=PASSWORD)
    database.release()

    text = answer_text(chars)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    server = servers.daphne("render-daphne", env, Path(env["VAR_DIR"]) / "logs" / stamp)
    try:
        server.wait_ready("/healthz")
        base = f"http://127.0.0.1:{server.port}"
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            page.goto(base + "/")
            page.get_by_label("Username").fill(username)
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_selector("html[data-ready=true]")
            page.locator("#settings summary").click()
            page.get_by_label("Max tokens").fill("100000")
            page.get_by_label("Developer").check()
            simulation = {"text": text, "tokens_per_second": tokens_per_second, "ttft_ms": 0}
            page.locator("#simulation").fill(json.dumps(simulation))
            page.locator("#settings summary").click()
            page.evaluate(WATCH)
            browser.start_tracing(page=page, categories=CATEGORIES)
            started = time.monotonic()
            page.get_by_label("Message", exact=True).fill("Write a long answer.")
            page.get_by_label("Message", exact=True).press("Enter")
            page.wait_for_function("window.benchEnded", timeout=(chars / 2 + 120) * 1000)
            seconds = time.monotonic() - started
            status = page.evaluate("window.benchEnded")
            shown = page.locator("article.assistant .content").evaluate("e => e.textContent")
            raw = browser.stop_tracing()
            browser.close()
    finally:
        server.stop()
    if keep_trace is not None:
        keep_trace.write_bytes(raw)  # for chrome://tracing or Perfetto
    trace = json.loads(raw)
    figures = analyse(trace)
    return {
        "answer_chars": len(text),
        "tokens_per_second": tokens_per_second,
        "viewport": list(viewport),
        "status": status,
        "seconds": round(seconds, 1),
        "shown_chars": len(shown),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        **figures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rendering", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--chars", type=int, default=50_000, help="answer length")
    parser.add_argument("--tokens-per-second", type=float, default=200.0)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--json", type=Path, help="where to write the result")
    parser.add_argument("--trace", type=Path, help="also keep the Chrome trace here")
    args = parser.parse_args(argv)
    result = run(args.chars, args.tokens_per_second, (args.width, args.height), args.trace)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = args.json or RESULTS / f"rendering-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"results: {path}")
    return 0 if result["status"] == "complete" else 1


if __name__ == "__main__":
    raise SystemExit(main())
