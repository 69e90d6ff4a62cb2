"""Where a dashboard page's server time goes, query by query, against a Prometheus that holds a fleet.

    .venv/bin/python -m bench.page_profile --prometheus http://127.0.0.1:9090 --range 24h
    .venv/bin/python -m bench.page_profile --prometheus URL --pages Fleet,Jobs --runs 3 --top 15

Each page is run by Streamlit's AppTest (the page's script as the server runs it: queries, frames,
figures and the protobuf of every element; no browser, no websocket) after the query cache is
cleared, ``--runs`` times. Printed per page, as medians of the runs:

- ``page``: the script run's wall seconds (what the footer's "rendered in" measures);
- ``sent``: each query's wall seconds in the source, from its request to its frame; ``in store``
  the store's own evaluation (Prometheus' ``stats=all`` timings, ``execTotalTime``; blank for a
  store that gives none), so ``sent - in store`` is the transfer, the JSON and the frame;
- ``waited``: the seconds the page's thread spent in source calls (prefetched queries run in
  parallel, so this is the slowest batch, not the sum), and the rest, ``own``: frames, figures,
  Streamlit's elements.

``--after PAGE`` times a page switch instead of a cold page: the session runs PAGE first (the cache
cleared before it), then switches to the timed page within the 10 s query cache, as a click in the
sidebar does, so that a query PAGE sent too is answered from the cache; only the timed page's
queries are listed (the bench's switches go Fleet, Efficiency, Workloads... in that order).

``--profile`` adds the top of cProfile's cumulative table of the page's body (its own thread) for
one more run of each page. Another tree's dashboard (an A/B):

    PYTHONPATH=/tmp/before .venv/bin/python bench/page_profile.py --prometheus URL
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import statistics
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import dashboard

APP = str(Path(dashboard.__file__).resolve().parent / "app.py")
"""The app of the ``dashboard`` package imported: another tree's with ``PYTHONPATH=TREE``."""
PAGES = {  # title: script, as dashboard/app.py lists them
    "Fleet": "views/fleet.py",
    "Efficiency": "views/efficiency.py",
    "Workloads": "views/workloads.py",
    "Jobs": "views/jobs.py",
    "Sharing": "views/sharing.py",
    "Health": "views/health.py",
    "GPU": "views/gpu.py",
}


class Recorder:
    """Per query text: the wall seconds of each call and the store's own seconds; per thread the
    seconds spent inside source calls (nested calls counted once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, float, float | None, int]] = []
        self.params: dict[str, tuple[str, dict[str, str]]] = {}
        self.local = threading.local()
        self.main_waited = 0.0
        self.main = threading.get_ident()

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.main_waited = 0.0


PROFILER: list[cProfile.Profile | None] = [None]
"""The profiler of the page's body in the script's thread (``--profile``), while one is wanted."""


def install(rec: Recorder) -> None:
    """Wrap PrometheusSource's HTTP call (timings and the store's stats) and its public methods
    (the page thread's waits)."""
    from dashboard.sources.prometheus import PrometheusSource

    call = PrometheusSource._call

    def timed_call(self: Any, path: str, params: dict[str, str]) -> dict[str, Any]:
        started = time.perf_counter()
        data = call(self, path, {**params, "stats": "all"})
        took = time.perf_counter() - started
        timings = (data.get("stats") or {}).get("timings") or {}
        store = timings.get("execTotalTime")
        n = len(data.get("result") or [])
        kind = path.rsplit("/", 1)[-1]
        with rec.lock:
            rec.calls.append((kind, params.get("query", ""), took, store, n))
            rec.params[f"{kind}: {params.get('query', '')}"] = (path, params)
        return data

    PrometheusSource._call = timed_call  # type: ignore[method-assign]

    from dashboard import ui

    fetch = ui._call

    @functools.wraps(fetch)
    def waited(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fetch(*args, **kwargs)
        finally:
            if threading.get_ident() == rec.main:
                rec.main_waited += time.perf_counter() - started

    ui._call = waited

    prefetch = ui.prefetch

    @functools.wraps(prefetch)
    def waited_prefetch(*args: Any, **kwargs: Any) -> Any:
        rec.main = threading.get_ident()  # the script's thread (AppTest runs it in its own)
        started = time.perf_counter()
        try:
            return prefetch(*args, **kwargs)
        finally:
            rec.main_waited += time.perf_counter() - started

    ui.prefetch = waited_prefetch

    page = ui.page

    @functools.wraps(page)
    def profiled_page(title: str, body: Any) -> None:
        def profiled(ctx: Any) -> None:
            prof = PROFILER[0]
            if prof is None:
                body(ctx)
                return
            prof.enable()
            try:
                body(ctx)
            finally:
                prof.disable()

        page(title, profiled)

    ui.page = profiled_page


def time_alone(base: str, queries: dict[str, tuple[str, dict[str, str]]]) -> dict[str, float]:
    """Each query of ``queries`` (its API path and parameters, as the page sent it) sent alone,
    one after another, three times: the median wall seconds of each."""
    import requests

    out = {}
    for key, (path, params) in queries.items():
        took = []
        for _ in range(3):
            started = time.perf_counter()
            requests.post(f"{base.rstrip('/')}{path}", data=params, timeout=120).raise_for_status()
            took.append(time.perf_counter() - started)
        out[key] = statistics.median(took)
    return out


def run_page(
    title: str, rng: str, rec: Recorder | None = None, after: str | None = None, prof: cProfile.Profile | None = None
) -> tuple[float, list[str]]:
    """One run of page ``title`` in a fresh AppTest, after the query cache is cleared (``after``: a
    switch to it right after that page ran, the cache cleared before that page only); its wall
    seconds and any exceptions. ``prof`` profiles the timed run's page body only."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["range"] = rng
    first = after or title
    if first != "Fleet":  # the session starts on the page itself: the default page's queries are not its
        at.switch_page(PAGES[first])
    at.run()  # the session and its sidebar, the page once
    st.cache_data.clear()
    if after is not None:
        at.run()  # the page before, cold, as the session left it
        at.switch_page(PAGES[title])
    if rec is not None:  # only the timed run's queries and waits
        rec.reset()
    PROFILER[0] = prof
    started = time.perf_counter()
    try:
        at.run()
    finally:
        PROFILER[0] = None
    took = time.perf_counter() - started
    return took, [str(e.value)[:300] for e in at.exception]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="where a dashboard page's server time goes, query by query")
    p.add_argument("--prometheus", required=True)
    p.add_argument("--range", default="24h")
    p.add_argument("--pages", default=",".join(PAGES))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--top", type=int, default=12, help="queries listed per page, the slowest first")
    p.add_argument("--profile", action="store_true", help="also print cProfile's top for one more run")
    p.add_argument("--after", choices=list(PAGES), help="time a switch from this page (its answers cached)")
    p.add_argument("--alone", action="store_true", help="also time each query alone, one after another (median of 3)")
    a = p.parse_args(argv)
    os.environ.pop("GPULENS_DASHBOARD_SCRAPE", None)
    os.environ["GPULENS_DASHBOARD_PROMETHEUS"] = a.prometheus
    os.environ["GPULENS_DASHBOARD_REFRESH_SECONDS"] = "0"
    os.environ.setdefault("GPULENS_DASHBOARD_PRICES", "H200=3.5")
    rec = Recorder()
    install(rec)
    for title in [t.strip() for t in a.pages.split(",") if t.strip()]:
        walls, waits = [], []
        per: dict[str, list[tuple[float, float | None, int]]] = defaultdict(list)
        for _ in range(a.runs):
            took, errors = run_page(title, a.range, rec, a.after)
            if errors:
                print(f"{title}: exceptions {errors}")
            walls.append(took)
            waits.append(rec.main_waited)
            for kind, q, secs, store, n in rec.calls:
                per[f"{kind}: {q}"].append((secs, store, n))
        wall, wait = statistics.median(walls), statistics.median(waits)
        print(f"\n== {title}: page {wall:.2f} s, waited on the source {wait:.2f} s, own {wall - wait:.2f} s; "
              f"{len(per)} distinct queries, {sum(len(v) for v in per.values()) / a.runs:.0f} per run")  # fmt: skip
        rows = []
        for q, got in per.items():
            sent = statistics.median(g[0] for g in got)
            stores = [g[1] for g in got if g[1] is not None]
            rows.append((sent, statistics.median(stores) if stores else None, got[0][2], len(got) / a.runs, q))
        rows.sort(reverse=True)
        alone: dict[str, float] = {}
        if a.alone:
            alone = time_alone(a.prometheus, {q: rec.params[q] for *_, q in rows[: a.top] if q in rec.params})
        print(f"{'sent s':>7} {'store s':>8} {'alone s':>8} {'series':>7} {'/run':>5}  query")
        for sent, store, n, times, q in rows[: a.top]:
            st_s = f"{store:8.3f}" if store is not None else f"{'':>8}"
            al_s = f"{alone[q]:8.3f}" if q in alone else f"{'':>8}"
            print(f"{sent:7.3f} {st_s} {al_s} {n:7d} {times:5.1f}  {q[:220]}")
        if a.profile:
            prof = cProfile.Profile()
            run_page(title, a.range, after=a.after, prof=prof)
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(45)
            print(out.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
