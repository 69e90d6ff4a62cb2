"""Dashboard page-load time, every page, both sources, in headless Chromium.

    .venv/bin/python -m bench.dashboard_scale --mode prometheus --gpus 1000 --nodes 125 --hours 24
    .venv/bin/python -m bench.dashboard_scale --mode scrape --gpus 1000 --nodes 125
    .venv/bin/python -m bench.dashboard_scale --mode prometheus --gpus 8 --nodes 1 --hours 24
    .venv/bin/python -m bench.dashboard_scale --mode prometheus --gpus 10000 --nodes 1250 --jobs 500 \
        --hours 1 --interval 60 --pages Jobs

``--jobs N`` groups the fleet's held GPUs into N multi-node jobs (scripts/backfill_fleet.py) for the
Jobs pages; ``--pages`` times only the pages named (titles, comma-separated).

Prometheus mode: scripts/backfill_fleet.py writes the fleet's history as OpenMetrics (every
``--interval`` s), promtool turns it into TSDB blocks and backfills the recording rules the dashboard
reads (``tsdb create-blocks-from rules``), a Prometheus serves both, ``python -m dashboard
--prometheus`` runs on top. Scrape mode: ``--nodes`` exporters on loopback serve a simulated node
each (the exposition of ``python -m exporter --backend sim``, one scrape per node with its own
UUIDs), ``python -m dashboard --scrape`` scrapes them every 5 s and keeps its own bounded history
(an hour at most: scrape mode has no 24 h), measured after ``--warmup`` s of scraping (counted from
the first page view: trees before 9f1eb3d start scraping at their first session, later ones when
the dashboard starts, so every tree has at least that much history).

Three timings per page, each the median of ``--runs``, each after the 10 s query cache expired:
``first load`` (a new browser context: Streamlit's JS, a new session, every query of the page),
``returning load`` (a new tab in a context that opened the app before: Streamlit's hashed JS from
the browser's cache, which Streamlit serves ``immutable``; a new session, every query) and
``page switch`` (a click in the sidebar of an open session, until the new page's footer and every
chart are drawn and nothing is stale). The time range is ``?range=`` (24h, or 1h in scrape
mode).

``--source DIR`` (repeatable) times the dashboard of each source tree (a ``git worktree`` of an
earlier commit, say) on the same store in the same run, one dashboard process per tree: each page
is loaded in every tree after the same cache expiry, in an order that alternates between runs, so
the trees see the same machine and their figures compare as ratios:

    git worktree add /tmp/before <commit>
    .venv/bin/python -m bench.dashboard_scale --gpus 1000 --nodes 125 --hours 24 --source /tmp/before --source .

``--prometheus URL`` times against a Prometheus that already holds a fleet (kept from an earlier
backfill, with its recording rules) instead of backfilling one.

VictoriaMetrics mode (``--mode victoriametrics``): the same history goes from
scripts/backfill_fleet.py's pipe (``--format vm-json``) into VictoriaMetrics' ``/api/v1/import`` and
vmalert's replay records the same rules (tests/support/victoriametrics.py, as bench/fleet_scale.py
builds its store); ``python -m dashboard --prometheus`` reads it through the Prometheus API:

    .venv/bin/python -m bench.dashboard_scale --mode victoriametrics --gpus 10000 --nodes 1250 --hours 6 \
        --data /tmp/vm10k --source /tmp/before --source .

``--data DIR`` keeps the store (either mode) in ``DIR`` for later runs: a first run builds it there
and writes ``DIR/build.json``; a later run with the same ``--data`` serves it again without
building, while "now" is within the history's ``--ahead`` hours past its build (default 1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from dashboard.definitions import MEAN_WINDOW_SECONDS
from tests.support.browser import CHARTS_DRAWN_JS, CHROMIUM, CHROMIUM_ARGS
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.prometheus import DASHBOARD_RECORDS, backfill_recording_rules

REPO = Path(__file__).resolve().parents[1]
VIEW: dict[str, Any] = {"viewport": {"width": 1400, "height": 6000}}
"""Tall enough that every chart of every page is on screen: Streamlit draws a chart only once it
is scrolled into view, and the timing is for a fully drawn page."""
PAGES = (  # title, url path, charts the page draws at least
    ("Fleet", "", 1),
    ("Efficiency", "efficiency", 2),
    ("Workloads", "workloads", 1),
    ("Sharing", "sharing", 0),
    ("Health", "health", 0),
    ("GPU", "gpu", 2),  # the class strip and utilisation: the backfilled history has no other device series
    ("Jobs", "jobs", 1),  # the class mix of the jobs with the most GPU-hours
)
READY_JS = (
    "([title, n]) => {"
    " const h = document.querySelector('h1');"
    " if (!h || h.innerText.trim() !== title) return false;"
    " if (document.querySelector('[data-stale=\"true\"]')) return false;"
    " const captions = [...document.querySelectorAll('[data-testid=\"stCaptionContainer\"]')];"
    " if (!captions.some(c => c.innerText.includes('rendered in'))) return false;"
    f" return ({CHARTS_DRAWN_JS})(n); }}"
)


def _wait(page: Any, title: str, charts: int) -> None:
    try:
        page.wait_for_function(READY_JS, arg=[title, charts], timeout=180_000, polling=50)
    except Exception as exc:
        shot = REPO / "artifacts" / "dashboard" / f"bench-failed-{title}.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(shot), full_page=True)
        raise RuntimeError(f"page {title} was not drawn (screenshot {shot}): {exc}") from exc


def _timed(page: Any, url: str, title: str, charts: int) -> float:
    """Seconds from navigating ``page`` to ``url`` until the page is fully drawn."""
    started = time.perf_counter()
    page.goto(url)
    _wait(page, title, charts)
    return time.perf_counter() - started


def first_load(browser: Any, url: str, title: str, charts: int) -> float:
    """Seconds from navigation to a fully drawn page in a browser context that never saw the app."""
    context = browser.new_context(**VIEW)
    took = _timed(context.new_page(), url, title, charts)
    context.close()
    return took


def returning_load(context: Any, url: str, title: str, charts: int) -> float:
    """Seconds from navigation to a fully drawn page in a new tab of a browser context that opened
    the app before: a new Streamlit session and every query, but Streamlit's hashed JavaScript
    comes from the browser's cache (Streamlit serves it ``immutable``), as for a returning user."""
    page = context.new_page()
    took = _timed(page, url, title, charts)
    page.close()
    return took


RENDERED_JS = """() => {
    const c = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')]
        .map(e => e.innerText).find(t => t.includes('rendered in'));
    const m = c && c.match(/rendered in ([0-9.]+) s/);
    return m ? parseFloat(m[1]) : null;
}"""
"""The page's own footer: seconds the server spent running the page (queries, frames, figures)."""


def page_switches(
    browser: Any, base: str, query: str, pages: tuple[tuple[str, str, int], ...] = PAGES
) -> tuple[dict[str, float], dict[str, float]]:
    """Per page of ``pages``, the seconds from a click on its sidebar link to the drawn page, and
    the server's seconds of that run (the page's footer: the rest is the browser's), in one
    session that starts on a page not timed (the last of ``PAGES`` when every page is)."""
    context = browser.new_context(**VIEW)
    page = context.new_page()
    start = next((p for p in PAGES if p not in pages), PAGES[-1])
    page.goto(f"{base}/{start[1]}?{query}")
    _wait(page, start[0], start[2])
    took, server = {}, {}
    for title, _path, charts in pages:
        started = time.perf_counter()
        page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=title, exact=True).click()
        _wait(page, title, charts)
        took[title] = time.perf_counter() - started
        server[title] = float(page.evaluate(RENDERED_JS) or "nan")
    context.close()
    return took, server


def history_args(a: argparse.Namespace, end: float) -> list[str]:
    """scripts/backfill_fleet.py's arguments for the bench's fleet: ``--hours`` plus ``--ahead``
    ending at ``end`` (the output's format and place left to the caller)."""
    return [sys.executable, str(REPO / "scripts" / "backfill_fleet.py"), "--gpus", str(a.gpus), "--nodes",
            str(a.nodes), "--hours", f"{a.hours + a.ahead:g}", "--interval", str(a.interval), "--end", f"{end:.0f}",
            "--jobs", str(a.jobs)]  # fmt: skip


def kept_build(a: argparse.Namespace, root: Path) -> dict[str, Any] | None:
    """The build ``--data`` kept in ``root`` (its build.json), if it is of this mode and fleet and
    "now" is still within its history; None: build it (again)."""
    try:
        build: dict[str, Any] = json.loads((root / "build.json").read_text())
    except (OSError, ValueError):
        return None
    fleet = {"mode": a.mode, "gpus": a.gpus, "nodes": a.nodes, "hours": a.hours, "interval": a.interval, "jobs": a.jobs}
    if {k: build.get(k) for k in fleet} != fleet:
        raise SystemExit(f"--data {root} holds another fleet: {build}; remove it or pick another directory")
    if build["end"] - time.time() < 600:
        print(f"--data {root}: the history ends in less than 10 minutes; building it again", file=sys.stderr)
        shutil.rmtree(root / "data", ignore_errors=True)
        return None
    return build


def keep_build(a: argparse.Namespace, root: Path, end: float, result: dict[str, Any]) -> None:
    """Write ``root``/build.json for a later ``--data`` run (the fleet, the history's end)."""
    fleet = {"mode": a.mode, "gpus": a.gpus, "nodes": a.nodes, "hours": a.hours, "interval": a.interval, "jobs": a.jobs}
    (root / "build.json").write_text(json.dumps({**fleet, "end": end, "prepare_s": result.get("prepare_s")}))


@contextmanager
def prometheus_store(a: argparse.Namespace, tmp: Path, result: dict[str, Any]) -> Iterator[list[str]]:
    """A backfilled Prometheus (raw history + recorded rules), or ``--prometheus``'s; yields the
    dashboard's arguments for it."""
    if a.prometheus:
        result["store"] = a.prometheus
        yield ["--prometheus", a.prometheus]
        return
    root = a.data or tmp
    root.mkdir(parents=True, exist_ok=True)
    om, data = tmp / "fleet.om", root / "data"
    kept = kept_build(a, root) if a.data else None
    if kept is None:
        t0 = time.perf_counter()
        # the history runs an hour past now: the timed runs take minutes, and instant queries find
        # nothing once the newest sample is older than Prometheus' 5 m lookback
        end = time.time() + a.ahead * 3600
        subprocess.run([*history_args(a, end), "--out", str(om)], check=True)
        result["openmetrics_bytes"] = om.stat().st_size
        promtool = shutil.which("promtool") or "promtool"
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        om.unlink()
        t1 = time.perf_counter()
        backfill_recording_rules(data, end - a.ahead * 3600 - a.hours * 3600, end, tmp, records_of(a))
        result["rules_s"] = round(time.perf_counter() - t1, 1)
        result["prepare_s"] = round(time.perf_counter() - t0, 1)
        if a.data:
            keep_build(a, root, end, result)
    (tmp / "p.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    pport = free_port()
    prom_url = f"http://127.0.0.1:{pport}"
    prom = [shutil.which("prometheus") or "prometheus", f"--config.file={tmp / 'p.yml'}",
            f"--storage.tsdb.path={data}", f"--web.listen-address=127.0.0.1:{pport}",
            "--storage.tsdb.retention.time=30d"]  # fmt: skip
    with managed_process(prom, f"{prom_url}/-/ready", log=tmp / "prom.log", timeout=300):
        yield ["--prometheus", prom_url]


def records_of(a: argparse.Namespace) -> tuple[str, ...]:
    """The recording rules the bench's store gets: every rule the pages read
    (tests.support.prometheus.DASHBOARD_RECORDS; the Fleet page's status reads the jobs' too)."""
    return DASHBOARD_RECORDS


@contextmanager
def victoriametrics_store(a: argparse.Namespace, tmp: Path, result: dict[str, Any]) -> Iterator[list[str]]:
    """A VictoriaMetrics holding the fleet's history (imported from scripts/backfill_fleet.py's
    pipe) and the recorded rules (vmalert's replay), as bench/fleet_scale.py builds its store;
    yields the dashboard's arguments for it (the Prometheus API)."""
    from bench.fleet_scale import replay_points
    from tests.support.victoriametrics import SERVER_FLAGS, binary, import_json_stream, replay_rules

    root = a.data or tmp
    root.mkdir(parents=True, exist_ok=True)
    data = root / "data"
    kept = kept_build(a, root) if a.data else None
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [binary("victoria-metrics"), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *SERVER_FLAGS]
    with managed_process(argv, f"{base}/health", log=tmp / "vm.log", timeout=300):
        if kept is None:
            t0 = time.perf_counter()
            end = time.time() + a.ahead * 3600
            with subprocess.Popen([*history_args(a, end), "--format", "vm-json", "--out", "-"],
                                  stdout=subprocess.PIPE) as gen:  # fmt: skip
                assert gen.stdout is not None
                result["series"] = import_json_stream(base, gen.stdout)
            if gen.returncode != 0:
                raise RuntimeError(f"backfill_fleet.py failed ({gen.returncode})")
            t1 = time.perf_counter()
            replay = replay_rules(base, end - a.ahead * 3600 - a.hours * 3600, end, tmp, records_of(a),
                                  points_per_query=replay_points(a.gpus))  # fmt: skip
            result["rules_s"] = round(time.perf_counter() - t1, 1)
            result["rules_s_each"] = replay["seconds"]
            result["prepare_s"] = round(time.perf_counter() - t0, 1)
            if a.data:
                keep_build(a, root, end, result)
        yield ["--prometheus", base]


@contextmanager
def dashboards(
    trees: list[Path], names: list[str], store: list[str], tmp: Path
) -> Iterator[dict[str, tuple[str, int]]]:
    """One dashboard process per source tree, each on the store (``store``: the dashboard's
    arguments for it); yields {its name in ``names``: (its URL, its pid)}."""
    with ExitStack() as es:
        out = {}
        for n, (tree, name) in enumerate(zip(trees, names, strict=True)):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            cmd = [sys.executable, "-m", "dashboard", *store, "--port", str(port), "--address", "127.0.0.1",
                   "--refresh", "0", "--price-per-gpu-hour", "H200=3.5"]  # fmt: skip
            log = tmp / f"dash-{n}.log"
            env = {"PYTHONPATH": str(tree)}
            proc = es.enter_context(
                managed_process(cmd, f"{url}/_stcore/health", log=log, timeout=120, cwd=tree, env=env)
            )
            out[name] = (url, proc.pid)
        yield out


def source_label(tree: Path) -> str:
    """A source tree as the results name it: its commit's short hash, with ``+changes`` when
    tracked files differ from it; its path where it is no git work tree."""
    git = ["git", "-C", str(tree)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return str(tree)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def _node_exposition(template: str, node: int) -> str:
    """The template node's exposition with UUIDs (and pod names) unique to node ``node``."""
    return template.replace("GPU-", f"GPU-n{node:03d}-").replace("MIG-", f"MIG-n{node:03d}-")


@contextmanager
def scrape_store(a: argparse.Namespace, tmp: Path, result: dict[str, Any]) -> Iterator[list[str]]:
    """``--nodes`` loopback exporters serving a simulated node each; yields the dashboard's
    arguments for scraping them."""
    from tests.support.exporter import run_exporter

    with run_exporter("--sim.scenario", "h200x8") as exporter:
        import urllib.request

        time.sleep(6)  # a first probe result and GPM windows
        template = urllib.request.urlopen(f"{exporter}/metrics", timeout=10).read().decode()
    pages = [_node_exposition(template, n).encode() for n in range(a.nodes)]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages[self.server.node]  # type: ignore[attr-defined]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    with ExitStack() as es:
        urls = []
        for n in range(a.nodes):
            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            server.node = n  # type: ignore[attr-defined]
            threading.Thread(target=server.serve_forever, daemon=True).start()
            es.callback(server.shutdown)
            urls.append(f"127.0.0.1:{server.server_address[1]}")
        yield ["--scrape", ",".join(urls)]


def memory_mib(pid: int) -> dict[str, float]:
    """The dashboard process' resident memory now and at its peak (VmRSS, VmHWM), in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "dashboard_rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "dashboard_peak_rss_mib": round(int(fields["VmHWM"].split()[0]) / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="dashboard page-load time, every page, in Chromium")
    p.add_argument("--mode", choices=("prometheus", "victoriametrics", "scrape"), default="prometheus")
    p.add_argument("--gpus", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--hours", type=float, default=24.0)
    p.add_argument("--interval", type=float, default=120.0, help="backfill sample interval (prometheus mode)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds of scraping before timing (scrape mode)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--jobs", type=int, default=0, help="group the fleet into this many multi-node jobs (prometheus mode)"
    )
    p.add_argument("--pages", default="", help="time only these pages (titles, comma-separated; default: all)")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--source",
        action="append",
        type=Path,
        default=None,
        help="a source tree to time (repeatable: every tree on the same store, side by side; default: this one)",
    )
    p.add_argument("--prometheus", default=None, help="time against this Prometheus instead of backfilling one")
    p.add_argument("--data", type=Path, default=None, help="keep the store here, or serve the one kept here")
    p.add_argument("--ahead", type=float, default=1.0, help="hours the history runs past its build's time")
    p.add_argument("--build-only", action="store_true", help="with --data: build the store there, time nothing")
    a = p.parse_args(argv)
    trees = [t.resolve() for t in (a.source or [REPO])]
    for tree in trees:
        if not (tree / "dashboard" / "app.py").is_file():
            p.error(f"--source: {tree} holds no dashboard/app.py")
    wanted = {t.strip() for t in a.pages.split(",") if t.strip()}
    unknown = wanted - {t for t, _, _ in PAGES}
    if unknown:
        p.error(f"--pages: no page {sorted(unknown)}; pages: {', '.join(t for t, _, _ in PAGES)}")
    timed = tuple(pg for pg in PAGES if not wanted or pg[0] in wanted)
    if a.mode == "scrape":
        a.gpus = 8 * a.nodes  # a simulated h200x8 node per exporter
        if a.warmup < MEAN_WINDOW_SECONDS:  # Workloads says in words that waste waits for a full window
            timed = tuple((t, path, 0 if t == "Workloads" else n) for t, path, n in timed)
    rng = ("24h" if a.hours >= 24 else "6h" if a.hours >= 6 else "1h") if a.mode != "scrape" else "1h"
    result: dict[str, Any] = {
        "mode": a.mode,
        "gpus": a.gpus,
        "nodes": a.nodes,
        "jobs": a.jobs,
        "range": rng,
        "runs": a.runs,
    }
    out = Path(a.out or REPO / "artifacts" / "dashboard" / f"scale-{a.mode}-{a.gpus}.json")
    names = [source_label(t) for t in trees]  # once: the work tree may change during the run
    first: dict[str, dict[str, list[float]]] = {n: {t: [] for t, _, _ in timed} for n in names}
    again: dict[str, dict[str, list[float]]] = {n: {t: [] for t, _, _ in timed} for n in names}
    switch: dict[str, dict[str, list[float]]] = {n: {t: [] for t, _, _ in timed} for n in names}
    server: dict[str, dict[str, list[float]]] = {n: {t: [] for t, _, _ in timed} for n in names}
    memory: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="gpulens-scale-") as tmp_s:
        stores = {"prometheus": prometheus_store, "victoriametrics": victoriametrics_store, "scrape": scrape_store}
        store = stores[a.mode]
        if a.build_only:
            if not a.data or a.mode == "scrape":
                p.error("--build-only needs --data and a store (--mode prometheus or victoriametrics)")
            with store(a, Path(tmp_s), result):
                print(json.dumps(result))
            return 0
        with store(a, Path(tmp_s), result) as store_args, dashboards(trees, names, store_args, Path(tmp_s)) as dash:
            from playwright.sync_api import sync_playwright

            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                returning = {}
                for name, (url, _pid) in dash.items():
                    # warm Streamlit's static files and the sources once; not timed
                    first_load(browser, f"{url}/?range={rng}", "Fleet", 1)
                    returning[name] = browser.new_context(**VIEW)  # its HTTP cache holds Streamlit's JavaScript
                    returning_load(returning[name], f"{url}/?range={rng}", "Fleet", 1)
                if a.mode == "scrape":  # older trees start scraping at their first session, not before
                    time.sleep(a.warmup)
                    result["history_s"] = a.warmup
                for run in range(a.runs):
                    # every tree after the same cache expiry, the first of them alternating between runs
                    order = list(dash.items())[run % len(dash) :] + list(dash.items())[: run % len(dash)]
                    for title, path, charts in timed:
                        time.sleep(11)  # past the 10 s query cache: every query runs again
                        for name, (url, _pid) in order:
                            first[name][title].append(first_load(browser, f"{url}/{path}?range={rng}", title, charts))
                        time.sleep(11)
                        for name, (url, _pid) in order:
                            again[name][title].append(
                                returning_load(returning[name], f"{url}/{path}?range={rng}", title, charts)
                            )
                    for name, (url, _pid) in order:
                        time.sleep(11)
                        took, spent = page_switches(browser, url, f"range={rng}", timed)
                        for title in took:
                            switch[name][title].append(took[title])
                            server[name][title].append(spent[title])
                for context in returning.values():
                    context.close()
                browser.close()
            memory = {name: memory_mib(pid) for name, (_url, pid) in dash.items()}
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result["sources"] = {
        name: {
            "tree": str(tree),
            **memory[name],
            "pages": {
                t: {
                    "first_load_median_s": round(statistics.median(first[name][t]), 2),
                    "first_load_max_s": round(max(first[name][t]), 2),
                    "returning_load_median_s": round(statistics.median(again[name][t]), 2),
                    "returning_load_max_s": round(max(again[name][t]), 2),
                    "page_switch_median_s": round(statistics.median(switch[name][t]), 2),
                    "page_switch_max_s": round(max(switch[name][t]), 2),
                    "page_switch_server_median_s": round(statistics.median(server[name][t]), 2),
                }
                for t, _, _ in timed
            },
        }
        for name, tree in zip(names, trees, strict=True)
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"{a.mode}: {a.gpus} GPUs on {a.nodes} nodes, range {rng}, median of {a.runs}")
    base = names[0]
    for name in names:
        src = result["sources"][name]
        print(f"\n{name} ({src['tree']})")
        print(f"{'page':<12} {'first load':>11} {'returning':>10} {'page switch':>12} {'(server)':>9}", end="")
        print(f" {'first / ' + base:>18} {'switch / ' + base:>18}" if name != base else "")
        for t, r in src["pages"].items():
            line = (
                f"{t:<12} {r['first_load_median_s']:>10.2f}s {r['returning_load_median_s']:>9.2f}s"
                f" {r['page_switch_median_s']:>11.2f}s {r['page_switch_server_median_s']:>8.2f}s"
            )
            if name != base:
                b = result["sources"][base]["pages"][t]
                line += f" {r['first_load_median_s'] / b['first_load_median_s']:>17.2f}x"
                line += f" {r['page_switch_median_s'] / b['page_switch_median_s']:>17.2f}x"
            print(line)
        print(f"dashboard RSS {src['dashboard_rss_mib']} MiB (peak {src['dashboard_peak_rss_mib']} MiB)")
    print(f"nproc={os.cpu_count()}  load average at the end {result['load_average']}  json: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
