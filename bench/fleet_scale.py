"""Fleet scale: a backfilled N-GPU, 4-cluster, 7-day history on VictoriaMetrics and on Prometheus,
the dashboard's page loads at 24 h and 7 d, the advisor's run over the week, the store's disk and
memory.

    .venv/bin/python -m bench.fleet_scale --gpus 500 --store victoriametrics --store prometheus
    .venv/bin/python -m bench.fleet_scale --gpus 10000 --spare-hours 12 --keep /tmp/fleet10k
    .venv/bin/python -m bench.fleet_scale --reuse /tmp/fleet10k --runs 3

The history: scripts/backfill_fleet.py, ``--days`` + ``--spare-hours`` (default 1) every
``--interval`` s ending ``--spare-hours`` from now (so instant queries find samples while the bench
runs), 8 GPUs a node, nodes split over ``--clusters`` clusters. VictoriaMetrics gets it straight from
the script's pipe in its native import format (``--format vm-json`` into /api/v1/import: no file,
the same samples as the OpenMetrics, tests/test_fleet_import.py) and vmalert's replay records the
rules the pages read (every minute, over the whole history; evaluations per range query shrink as
the fleet grows, to bound vmalert's memory). Prometheus gets the OpenMetrics file as promtool blocks
(one block, as a compacted TSDB holds a week) and ``promtool tsdb create-blocks-from rules`` the
same rules. Disk is the data directory after the raw import (bytes per raw sample) and after the
rules; memory is the store's peak resident set (VmHWM) while it serves the timing and, for
VictoriaMetrics, during the build (with vmalert's and the generator's).

Build and timing can run apart: ``--keep DIR`` only builds the VictoriaMetrics store into
``DIR/vm-data`` and writes ``DIR/build.json`` (samples, import and rule seconds, disk, peak
memory, the recorded samples per rule); ``--reuse DIR`` starts VictoriaMetrics on it and times the
advisor and the pages, while "now" is within the history's last ``--spare-hours``. Without either,
one run builds each ``--store`` in a temporary directory, times, and throws it away.

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.dashboard_scale import PAGES, first_load
from dashboard.advisor.query import Window, measure
from dashboard.sources.prometheus import PrometheusSource
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.net import free_port
from tests.support.process import managed_process
from tests.support.prometheus import FLEET_RECORDS, backfill_recording_rules, prometheus_binary
from tests.support.victoriametrics import SERVER_FLAGS, binary, force_flush, import_json_stream, query, replay_rules

REPO = Path(__file__).resolve().parents[1]

ALL_PAGES = (*(p for p in PAGES if p[0] != "Jobs"), ("Right-sizing", "rightsizing", 0))
"""The pages timed: the Jobs page needs a fleet with jobs (bench/dashboard_scale.py --jobs)."""
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


def history_args(a: argparse.Namespace, end: float) -> list[str]:
    """scripts/backfill_fleet.py's arguments for the bench's fleet: ``--days`` plus ``--spare-hours``
    ending at ``end``, 8 GPUs a node."""
    hours = a.days * 24 + a.spare_hours
    return [sys.executable, str(REPO / "scripts" / "backfill_fleet.py"), "--gpus", str(a.gpus), "--nodes",
            str(max(1, a.gpus // 8)), "--clusters", str(a.clusters), "--hours", f"{hours:g}", "--interval",
            str(a.interval), "--end", f"{end:.0f}"]  # fmt: skip


def write_history(a: argparse.Namespace, om: Path, end: float) -> int:
    """The fleet's OpenMetrics history (for promtool); returns the samples written (from the script's report)."""
    run = subprocess.run([*history_args(a, end), "--out", str(om)], check=True, capture_output=True, text=True)
    return int(run.stderr.split()[0])


def build_victoriametrics(a: argparse.Namespace, data: Path, work: Path, end: float) -> dict[str, Any]:
    """Fill a VictoriaMetrics data directory ``data`` with the fleet's history and the recorded
    rules, then stop it; return the build's figures. The history goes straight from
    scripts/backfill_fleet.py (``--format vm-json``, a pipe) into ``/api/v1/import``: no file."""
    out: dict[str, Any] = {}
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [binary("victoria-metrics"), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *SERVER_FLAGS]
    with managed_process(argv, f"{base}/health", log=work / "vm-build.log", timeout=120) as proc:
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as err:
            gen = subprocess.Popen([*history_args(a, end), "--format", "vm-json", "--out", "-"],
                                   stdout=subprocess.PIPE, stderr=err)  # fmt: skip
            try:
                assert gen.stdout is not None
                out["series"] = import_json_stream(base, gen.stdout)
                gen.stdout.close()
                _pid, status, usage = os.wait4(gen.pid, 0)
            except BaseException:
                gen.kill()
                gen.wait()
                raise
            gen.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            report = err.read().decode(errors="replace")
            if gen.returncode != 0:
                raise RuntimeError(f"backfill_fleet.py failed:\n{report[-4000:]}")
        out["samples"] = int(report.split()[0])
        out["import_s"] = round(time.perf_counter() - t0, 1)
        out["generator_peak_rss_bytes"] = usage.ru_maxrss * 1024
        urllib_get(f"{base}/internal/force_merge")
        time.sleep(5)  # the merge runs in the background
        out["disk_raw_bytes"] = du(data)
        out["bytes_per_raw_sample"] = round(out["disk_raw_bytes"] / out["samples"], 2)
        t0 = time.perf_counter()
        out["replay_points_per_query"] = replay_points(a.gpus)
        replay = replay_rules(base, end - a.days * 86400 - a.spare_hours * 3600, end, work, FLEET_RECORDS,
                              points_per_query=out["replay_points_per_query"])  # fmt: skip
        out["rules_s"] = round(time.perf_counter() - t0, 1)
        out["rules_s_each"] = replay["seconds"]
        out["vmalert_peak_rss_bytes"] = replay["peak_rss_bytes"]
        force_flush(base)
        out["recorded"] = recorded_samples(base, end, a.days * 86400 + a.spare_hours * 3600)
        out["disk_bytes"] = du(data)
        out["build_peak_rss_bytes"] = peak_rss(proc.pid)
    return out


def replay_points(gpus: int) -> int:
    """Evaluations per vmalert range query for a fleet of ``gpus``: about 500,000 / GPUs (the
    per-class boundness rule's answer, 6 series a GPU, stays near 3 M points: under a GB in vmalert
    and in VictoriaMetrics at any size), between 50 and vmalert's default 1,000."""
    return max(50, min(1000, 500_000 // gpus))


def recorded_samples(base: str, end: float, window_s: float) -> dict[str, dict[str, int]]:
    """Per recorded rule: its series, samples, and the fewest and most samples of one series over
    the replayed window. Raises unless every series has one sample per evaluation (a minute), never
    two, and every series of a rule whose inputs never end (all but the pods') has all of them:
    vmalert writes some twice or drops some without failing."""
    minutes = int(window_s // 60)
    out = {}
    for record in FLEET_RECORDS:
        per = f"count_over_time({record}[{window_s:.0f}s])"
        row = {}
        for key, expr in (("series", f"count({per})"), ("samples", f"sum({per})"), ("min_per_series", f"min({per})"),
                          ("max_per_series", f"max({per})")):  # fmt: skip
            got = query(base, expr, at=end, timeout=600)
            row[key] = int(float(got[0]["value"][1])) if got else 0
        fewest = row["max_per_series"] if record == "gpulens:pod_gpu_wasted:gpus" else row["min_per_series"]
        if row["max_per_series"] > minutes or fewest < minutes:
            raise RuntimeError(f"{record}: {row} for {minutes} evaluations (one per minute)")
        out[record] = row
    return out


@contextmanager
def serve_victoriametrics(data: Path, work: Path, out: dict[str, Any]) -> Iterator[str]:
    """VictoriaMetrics on the data directory ``data``; its peak resident set lands in ``out``."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [binary("victoria-metrics"), f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}", *SERVER_FLAGS]
    with managed_process(argv, f"{base}/health", log=work / "vm.log", timeout=300) as proc:
        yield base
        out["peak_rss_bytes"] = peak_rss(proc.pid)


@contextmanager
def victoriametrics(a: argparse.Namespace, work: Path, end: float, out: dict[str, Any]) -> Iterator[str]:
    """The one-shot mode: build, then serve."""
    out.update(build_victoriametrics(a, work / "vm-data", work, end))
    with serve_victoriametrics(work / "vm-data", work, out) as base:
        yield base


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
    backfill_recording_rules(data, end - a.days * 86400 - a.spare_hours * 3600, end, tmp)
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


def time_pages(store: str, runs: int, tmp: Path, only: Sequence[str] = ()) -> dict[str, dict[str, float]]:
    """Median (and max) first-load seconds per page and range (``only``: these page titles)."""
    from playwright.sync_api import sync_playwright

    port = free_port()
    dash = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "dashboard", "--prometheus", store, "--port", str(port), "--address", "127.0.0.1",
            "--refresh", "0", "--timeout", "60", "--price-per-gpu-hour", "H200=3.5"]  # fmt: skip
    pages = [p for p in ALL_PAGES if not only or p[0] in only]
    took: dict[tuple[str, str], list[float]] = {(t, r): [] for t, _, _ in pages for r in RANGES}
    with managed_process(argv, f"{dash}/_stcore/health", log=tmp / "dash.log", timeout=120), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        first_load(browser, f"{dash}/?range=24h", "Fleet", 1)  # Streamlit's static files, not timed
        for _ in range(runs):
            time.sleep(11)  # past the 10 s query cache
            for rng in RANGES:
                for title, path, charts in pages:
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
    row("recorded samples (rules)", lambda r, s: f"{sum(v['samples'] for v in r[s]['recorded'].values()) / 1e6:.1f} M"
        if "recorded" in r[s] else "–")  # fmt: skip
    row("peak memory, serving (MiB)", lambda r, s: f"{r[s]['peak_rss_bytes'] / 2**20:.0f}")
    row("peak memory building: store / vmalert / generator (MiB)",
        lambda r, s: f"{r[s]['build_peak_rss_bytes'] / 2**20:.0f} / {r[s]['vmalert_peak_rss_bytes'] / 2**20:.0f} / "
        f"{r[s]['generator_peak_rss_bytes'] / 2**20:.0f}" if "build_peak_rss_bytes" in r[s] else "–")  # fmt: skip
    row("advisor, 7 days (s)", lambda r, s: f"**{r[s]['advisor']['median_s']:g}** ({r[s]['advisor']['max_s']:g})"
        if "advisor" in r[s] else "–")  # fmt: skip
    row("load average (1 m) before / after", lambda r, s: f"{r['load_before'][0]:.1f} / {r[s]['load_after'][0]:.1f}")
    pages = [k for k in next((r[s].get("pages", {}) for r, s in cols), {})]
    for page in pages:
        row(f"{page} (s)", lambda r, s, p=page: f"{r[s]['pages'][p]['median_s']:.2f} ({r[s]['pages'][p]['max_s']:.2f})"
            if p in r[s].get("pages", {}) else "–")  # fmt: skip
    return "\n".join(lines)


BUILD_JSON = "build.json"
"""The kept build's figures and fleet, next to its ``vm-data`` directory."""


def keep(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``--keep``: build the VictoriaMetrics store into ``root/vm-data`` and write ``root/build.json``."""
    end = float(int(time.time() + a.spare_hours * 3600))
    result: dict[str, Any] = {**fleet_of(a), "end": end, "load_before": os.getloadavg()}
    vm = build_victoriametrics(a, root / "vm-data", root, end)
    result["samples"] = vm["samples"]
    result["victoriametrics"] = vm
    result["load_after_build"] = os.getloadavg()
    (root / BUILD_JSON).write_text(json.dumps(result, indent=2))
    return result


def fleet_of(a: argparse.Namespace) -> dict[str, Any]:
    return {"gpus": a.gpus, "clusters": a.clusters, "days": a.days, "interval_s": a.interval,
            "spare_hours": a.spare_hours}  # fmt: skip


def reuse(p: argparse.ArgumentParser, a: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``--reuse``: serve a kept store and time the advisor (and the pages)."""
    try:
        result: dict[str, Any] = json.loads((root / BUILD_JSON).read_text())
    except (OSError, ValueError) as e:
        p.error(f"--reuse {root}: no readable {BUILD_JSON} of a --keep build ({e})")
    now, end = time.time(), result["end"]
    if not end - result["spare_hours"] * 3600 <= now <= end:
        p.error(
            f"--reuse {root}: its history covers the last {result['days']:g} days only between "
            f"{time.strftime('%H:%M', time.gmtime(end - result['spare_hours'] * 3600))} and "
            f"{time.strftime('%H:%M UTC %Y-%m-%d', time.gmtime(end))}; build it again (--keep, --spare-hours)"
        )
    result["runs"] = a.runs
    result["load_before_build"], result["load_before"] = result["load_before"], os.getloadavg()
    out = result["victoriametrics"]
    with serve_victoriametrics(root / "vm-data", root, out) as url:
        if not a.no_advisor:
            out["advisor"] = time_advisor(url, a.runs, result["days"])
        if not a.no_pages:
            out["pages"] = time_pages(url, a.runs, root, a.pages)
        out["load_after"] = os.getloadavg()
    return result


def one_shot(a: argparse.Namespace, stores: list[str]) -> dict[str, Any]:
    """Build every store in a temporary directory, time, throw the stores away."""
    result: dict[str, Any] = {**fleet_of(a), "runs": a.runs, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="gpulens-fleet-", dir=a.tmp) as tmp_s:
        tmp = Path(tmp_s)
        end = float(int(time.time() + a.spare_hours * 3600))
        om = tmp / "fleet.om"
        if "prometheus" in stores:  # promtool reads OpenMetrics; VictoriaMetrics gets the same samples as JSON
            t0 = time.perf_counter()
            result["samples"] = write_history(a, om, end)
            result["openmetrics_bytes"] = om.stat().st_size
            result["history_s"] = round(time.perf_counter() - t0, 1)
        for name in stores:
            out: dict[str, Any] = {}
            result[name] = out
            work = tmp / name
            work.mkdir()
            stack = (
                victoriametrics(a, work, end, out) if name == "victoriametrics" else prometheus(a, om, work, end, out)
            )
            with stack as url:
                result.setdefault("samples", out.get("samples"))
                out["bytes_per_raw_sample"] = round(out["disk_raw_bytes"] / result["samples"], 2)
                if not a.no_advisor:
                    out["advisor"] = time_advisor(url, a.runs, a.days)
                if not a.no_pages:
                    out["pages"] = time_pages(url, a.runs, work, a.pages)
                out["load_after"] = os.getloadavg()
            print(json.dumps({name: out}, indent=1), flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="fleet scale on VictoriaMetrics and Prometheus")
    p.add_argument("--report", nargs="+", type=Path, metavar="JSON", help="print tables from earlier runs' JSON")
    p.add_argument("--gpus", type=int)
    p.add_argument("--clusters", type=int, default=4)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--interval", type=float, default=240.0, help="seconds between samples (< 300)")
    p.add_argument("--spare-hours", type=float, default=1.0,
                   help="history beyond --days, ending this far ahead: how long after the build its last "
                        "--days are all there and 'now' still has samples")  # fmt: skip
    p.add_argument("--store", action="append", choices=("victoriametrics", "prometheus"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-pages", action="store_true", help="skip the page loads (store and advisor only)")
    p.add_argument("--no-advisor", action="store_true", help="skip the advisor's timing")
    p.add_argument("--pages", nargs="+", default=[], choices=[t for t, _, _ in ALL_PAGES], metavar="TITLE",
                   help="time only these pages (titles, e.g. Fleet Efficiency)")  # fmt: skip
    p.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="only build the VictoriaMetrics store, into DIR (new or empty), with DIR/build.json",
    )
    p.add_argument("--reuse", type=Path, metavar="DIR", help="only time the advisor and pages on a --keep store")
    p.add_argument("--tmp", default=None, help="work directory (default: a temporary one)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.report:
        print(report(a.report))
        return 0
    if a.keep and a.reuse:
        p.error("--keep and --reuse: one or the other")
    if (a.keep or a.reuse) and a.store and a.store != ["victoriametrics"]:
        p.error("--store: --keep and --reuse are for VictoriaMetrics only")
    if a.keep and a.keep.exists() and any(a.keep.iterdir()):
        p.error(f"--keep {a.keep}: not empty")
    if not a.reuse and (not a.gpus or a.gpus < 1):
        p.error("--gpus must be a positive number")
    if a.spare_hours <= 0:
        p.error("--spare-hours must be positive")
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        built = keep(a, a.keep)
        print(json.dumps(built, indent=1))
        print(f"kept: {a.keep / 'vm-data'}; time it with --reuse {a.keep} until "
              f"{time.strftime('%H:%M UTC %Y-%m-%d', time.gmtime(built['end']))}")  # fmt: skip
        return 0
    stores = ["victoriametrics"] if a.reuse else a.store or ["victoriametrics"]
    result = reuse(p, a, a.reuse) if a.reuse else one_shot(a, stores)
    path = Path(a.out or REPO / "artifacts" / "fleet" / f"scale-{result['gpus']}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(f"{result['gpus']} GPUs, {result['clusters']} clusters, {result['days']:g} d every "
          f"{result['interval_s']:g} s: {result['samples']} samples")  # fmt: skip
    for name in stores:
        r = result[name]
        advisor = r.get("advisor", {}).get("median_s", "-")
        print(f"{name}: disk {r['disk_bytes'] / 2**20:.0f} MiB ({r['bytes_per_raw_sample']} B/raw sample), "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB, advisor {advisor} s")  # fmt: skip
        for page, t in r.get("pages", {}).items():
            print(f"  {page:<18} {t['median_s']:>6.2f} s (max {t['max_s']:.2f})")
    print(f"load average before {result['load_before']}, json: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
