"""Fleet scale: a backfilled N-GPU, 4-cluster, 7-day history on VictoriaMetrics and on Prometheus,
the dashboard's page loads at 24 h and 7 d, the advisor's run over the week, the store's disk and
memory.

    .venv/bin/python -m bench.fleet_scale --gpus 500 --store victoriametrics --store prometheus
    .venv/bin/python -m bench.fleet_scale --gpus 2000 --store victoriametrics --runs 3

Per store: scripts/backfill_fleet.py writes the history (``--days`` + 1 h, ending an hour from now so
instant queries find samples while the bench runs) every ``--interval`` s, 8 GPUs a node, nodes
split over ``--clusters`` clusters. VictoriaMetrics imports it (/api/v1/import/prometheus) and
vmalert's replay records the three rules the pages read (every minute, over the whole history);
Prometheus gets promtool blocks (one block, as a compacted TSDB holds a week) and ``promtool tsdb
create-blocks-from rules`` the same rules. Disk is the data directory after the raw import (bytes per
raw sample) and after the rules; memory is the store's peak resident set (VmHWM) over the run.

Page loads: ``python -m dashboard --prometheus STORE`` in headless Chromium, each page at
``?range=24h`` and ``?range=7d``, a new browser context per load, timed to the footer and every chart
drawn (bench/dashboard_scale.py's method). A round opens every page at both ranges (14 distinct
page/range pairs), then waits out the dashboard's 10 s query cache; the figure is the median of
``--runs`` rounds. Within a round two pages may share a query the cache answers (the sidebar's label
values), as for a user moving between pages. The advisor: ``measure()`` over 7 days at its default
step (10 minutes), median of ``--runs``, timed alone (no dashboard running).

Writes ``artifacts/fleet/scale-GPUS.json`` and prints a table; ``--report FILE...`` prints the
markdown tables of docs/benchmarks.md from such files.
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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.dashboard_scale import PAGES, first_load
from dashboard.advisor.query import Window, measure
from dashboard.prometheus_source import PrometheusSource
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.prometheus import DASHBOARD_RECORDS, backfill_recording_rules, prometheus_binary
from tests.support.victoriametrics import SERVER_FLAGS, binary, force_flush, import_openmetrics, replay_rules

REPO = Path(__file__).resolve().parents[1]
ALL_PAGES = (*PAGES, ("Right-sizing", "rightsizing", 0))
RANGES = ("24h", "7d")


def du(path: Path) -> int:
    """Bytes on disk under ``path``."""
    out = subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def peak_rss(pid: int) -> int:
    """Peak resident set (VmHWM) of process ``pid`` in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def write_history(a: argparse.Namespace, om: Path, end: float) -> int:
    """The fleet's OpenMetrics history; returns the samples written (from the script's report)."""
    hours = a.days * 24 + 1
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "backfill_fleet.py"), "--gpus", str(a.gpus), "--nodes",
         str(max(1, a.gpus // 8)), "--clusters", str(a.clusters), "--hours", str(hours), "--interval",
         str(a.interval), "--end", f"{end:.0f}", "--out", str(om)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return int(run.stderr.split()[0])


@contextmanager
def victoriametrics(a: argparse.Namespace, om: Path, tmp: Path, end: float, out: dict[str, Any]) -> Iterator[str]:
    data, port = tmp / "vm-data", free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [binary("victoria-metrics"), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *SERVER_FLAGS]
    with managed_process(argv, f"{base}/health", log=tmp / "vm.log", timeout=120) as proc:
        t0 = time.perf_counter()
        import_openmetrics(base, om)
        out["import_s"] = round(time.perf_counter() - t0, 1)
        urllib_get(f"{base}/internal/force_merge")
        time.sleep(5)  # the merge runs in the background
        out["disk_raw_bytes"] = du(data)
        t0 = time.perf_counter()
        replay_rules(base, end - a.days * 86400 - 3600, end, tmp, DASHBOARD_RECORDS)
        out["rules_s"] = round(time.perf_counter() - t0, 1)
        force_flush(base)
        out["disk_bytes"] = du(data)
        yield base
        out["peak_rss_bytes"] = peak_rss(proc.pid)


@contextmanager
def prometheus(a: argparse.Namespace, om: Path, tmp: Path, end: float, out: dict[str, Any]) -> Iterator[str]:
    data = tmp / "prom-data"
    promtool = shutil.which("promtool") or "promtool"
    t0 = time.perf_counter()
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", f"--max-block-duration={a.days * 24 + 24}h",
                    str(om), str(data)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    out["import_s"] = round(time.perf_counter() - t0, 1)
    out["disk_raw_bytes"] = du(data)
    t0 = time.perf_counter()
    backfill_recording_rules(data, end - a.days * 86400 - 3600, end, tmp)
    out["rules_s"] = round(time.perf_counter() - t0, 1)
    out["disk_bytes"] = du(data)
    (tmp / "p.yml").write_text("global: {scrape_interval: 1m}\nscrape_configs: []\n")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [prometheus_binary(), f"--config.file={tmp / 'p.yml'}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=30d"]  # fmt: skip
    with managed_process(argv, f"{base}/-/ready", log=tmp / "prom.log", timeout=300) as proc:
        yield base
        out["peak_rss_bytes"] = peak_rss(proc.pid)


def urllib_get(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(url, timeout=600) as resp:
        resp.read()


def time_pages(store: str, runs: int, tmp: Path) -> dict[str, dict[str, float]]:
    """Median (and max) first-load seconds per page and range."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    dash = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "dashboard", "--prometheus", store, "--port", str(port), "--address", "127.0.0.1",
            "--refresh", "0", "--timeout", "60", "--price-per-gpu-hour", "H200=3.5"]  # fmt: skip
    took: dict[tuple[str, str], list[float]] = {(t, r): [] for t, _, _ in ALL_PAGES for r in RANGES}
    with managed_process(argv, f"{dash}/_stcore/health", log=tmp / "dash.log", timeout=120), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        first_load(browser, f"{dash}/?range=24h", "Fleet", 1)  # Streamlit's static files, not timed
        for _ in range(runs):
            time.sleep(11)  # past the 10 s query cache
            for rng in RANGES:
                for title, path, charts in ALL_PAGES:
                    took[(title, rng)].append(first_load(browser, f"{dash}/{path}?range={rng}", title, charts))
        browser.close()
    return {
        f"{t} {r}": {"median_s": round(statistics.median(v), 2), "max_s": round(max(v), 2)}
        for (t, r), v in took.items()
    }


def time_advisor(store: str, runs: int, days: float) -> dict[str, Any]:
    src = PrometheusSource(store, timeout_s=600)
    took, workloads = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        workloads = len(measure(src, Window(window_s=days * 86400)))
        took.append(time.perf_counter() - t0)
    return {"median_s": round(statistics.median(took), 1), "max_s": round(max(took), 1), "workloads": workloads}


def report(paths: list[Path]) -> str:
    """Markdown tables (stores, then page loads) from the JSON files of earlier runs."""
    runs = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["gpus"])
    cols = [(r, s) for r in runs for s in ("victoriametrics", "prometheus") if s in r]
    name = {"victoriametrics": "VM", "prometheus": "Prometheus"}
    head = " | ".join(f"{r['gpus']:,} GPUs, {name[s]}" for r, s in cols)
    lines = [f"| | {head} |", "|---" * (len(cols) + 1) + "|"]

    def row(label: str, cell: Any) -> None:
        lines.append(f"| {label} | " + " | ".join(cell(r, s) for r, s in cols) + " |")

    row("samples (raw)", lambda r, s: f"{r['samples'] / 1e6:.1f} M")
    row("import / rules (s)", lambda r, s: f"{r[s]['import_s']:g} / {r[s]['rules_s']:g}")
    row("disk, raw (MiB)", lambda r, s: f"{r[s]['disk_raw_bytes'] / 2**20:.1f}")
    row("bytes per raw sample", lambda r, s: f"{r[s]['bytes_per_raw_sample']:g}")
    row("disk with the rules (MiB)", lambda r, s: f"{r[s]['disk_bytes'] / 2**20:.1f}")
    row("peak memory (MiB)", lambda r, s: f"{r[s]['peak_rss_bytes'] / 2**20:.0f}")
    row("advisor, 7 days (s)", lambda r, s: f"**{r[s]['advisor']['median_s']:g}** ({r[s]['advisor']['max_s']:g})")
    row("load average (1 m) before / after", lambda r, s: f"{r['load_before'][0]:.1f} / {r[s]['load_after'][0]:.1f}")
    pages = [k for k in next((r[s].get("pages", {}) for r, s in cols), {})]
    for page in pages:
        row(f"{page} (s)", lambda r, s, p=page: f"{r[s]['pages'][p]['median_s']:.2f} ({r[s]['pages'][p]['max_s']:.2f})"
            if "pages" in r[s] else "–")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fleet scale on VictoriaMetrics and Prometheus")
    p.add_argument("--report", nargs="+", type=Path, metavar="JSON", help="print tables from earlier runs' JSON")
    p.add_argument("--gpus", type=int)
    p.add_argument("--clusters", type=int, default=4)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--interval", type=float, default=240.0, help="seconds between samples (< 300)")
    p.add_argument("--store", action="append", choices=("victoriametrics", "prometheus"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-pages", action="store_true", help="skip the page loads (store and advisor only)")
    p.add_argument("--tmp", default=None, help="work directory (default: a temporary one)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.report:
        print(report(a.report))
        return 0
    if not a.gpus or a.gpus < 1:
        p.error("--gpus must be a positive number")
    stores = a.store or ["victoriametrics"]
    result: dict[str, Any] = {"gpus": a.gpus, "clusters": a.clusters, "days": a.days, "interval_s": a.interval,
                              "runs": a.runs, "load_before": os.getloadavg()}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="gpulens-fleet-", dir=a.tmp) as tmp_s:
        tmp = Path(tmp_s)
        om = tmp / "fleet.om"
        end = float(int(time.time() + 3600))
        t0 = time.perf_counter()
        result["samples"] = write_history(a, om, end)
        result["openmetrics_bytes"] = om.stat().st_size
        result["history_s"] = round(time.perf_counter() - t0, 1)
        for name in stores:
            out: dict[str, Any] = {}
            result[name] = out
            work = tmp / name
            work.mkdir()
            stack = victoriametrics if name == "victoriametrics" else prometheus
            with stack(a, om, work, end, out) as url:
                out["bytes_per_raw_sample"] = round(out["disk_raw_bytes"] / result["samples"], 2)
                out["advisor"] = time_advisor(url, a.runs, a.days)
                if not a.no_pages:
                    out["pages"] = time_pages(url, a.runs, work)
                out["load_after"] = os.getloadavg()
            print(json.dumps({name: out}, indent=1), flush=True)
    path = Path(a.out or REPO / "artifacts" / "fleet" / f"scale-{a.gpus}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"{a.gpus} GPUs, {a.clusters} clusters, {a.days:g} d every {a.interval:g} s: {result['samples']} samples")
    for name in stores:
        r = result[name]
        print(f"{name}: disk {r['disk_bytes'] / 2**20:.0f} MiB ({r['bytes_per_raw_sample']} B/raw sample), "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, advisor {r['advisor']['median_s']} s")  # fmt: skip
        for page, t in r.get("pages", {}).items():
            print(f"  {page:<18} {t['median_s']:>6.2f} s (max {t['max_s']:.2f})")
    print(f"load average before {result['load_before']}, json: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
