"""Run a real VictoriaMetrics (Debian package ``victoria-metrics``) and its rule evaluator
``vmalert`` on free loopback ports, the way tests/support/prometheus.py runs Prometheus.

VictoriaMetrics speaks the Prometheus query API (``/api/v1/query``, ``/api/v1/query_range``) with
its own dialect, MetricsQL; the dashboard and the advisor read it in their Prometheus mode. History
is loaded from the same OpenMetrics files the Prometheus tests backfill with promtool
(:func:`import_openmetrics`), and recording rules are evaluated over that history by ``vmalert``'s
replay mode (:func:`replay_rules`): what a vmalert that ran all along would have written.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from tests.support.net import free_port
from tests.support.process import managed_process

RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "gpulens.rules.yml"
IMPORT_CHUNK_BYTES = 8 << 20
"""Bytes of text per import request (VictoriaMetrics streams it; this bounds our memory)."""
SERVER_FLAGS = (
    # the default (30 s) hides the newest samples of a query near "now"; tests read seconds-old data
    "-search.latencyOffset=1s",
    # backfilled history lands behind data already queried: never answer from a stale cache
    "-search.disableCache",
    # vmalert's replay evaluates the instant between two of its range queries twice: keep one sample
    # per timestamp, as a vmalert that ran all along writes one per evaluation (no two samples of a
    # series, raw or recorded, are meant to share a millisecond)
    "-dedup.minScrapeInterval=1ms",
    # vmalert sends what is left in its queue when a replay ends as one request: at 10,000 GPUs more
    # than the default 32 MB, which VictoriaMetrics refuses (and vmalert then drops the samples)
    "-maxInsertRequestSize=512MB",
    "-retentionPeriod=1y",
    "-loggerLevel=WARN",
)
"""Flags every test/bench VictoriaMetrics gets (besides its port and data directory)."""


def binary(name: str) -> str:
    """Path of ``victoria-metrics`` or ``vmalert``; fails the test (not skip) if the test command
    did not install the Debian package."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run the README test command (scripts/test.sh)")
    return path


@contextmanager
def run_victoriametrics(
    storage_dir: str | Path | None = None, scrape_config: str | None = None, extra_args: Sequence[str] = ()
) -> Iterator[str]:
    """Start single-node VictoriaMetrics on a free loopback port; yield its base URL.

    ``storage_dir`` keeps the data (default: a temporary directory); ``scrape_config`` (a
    prometheus.yml ``scrape_configs`` document) makes it scrape targets itself, as vmagent or
    Prometheus would.
    """
    with tempfile.TemporaryDirectory(prefix="gpulens-vm-") as tmp:
        root = Path(tmp)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        argv = [
            binary("victoria-metrics"),
            f"-storageDataPath={storage_dir or root / 'data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            *SERVER_FLAGS,
            *extra_args,
        ]
        if scrape_config is not None:
            (root / "scrape.yml").write_text(scrape_config)
            argv += [f"-promscrape.config={root / 'scrape.yml'}", "-promscrape.config.strictParse=false"]
        with managed_process(argv, f"{base}/health", log=root / "vm.log", cwd=root, timeout=60):
            yield base


class _AlertSink(BaseHTTPRequestHandler):
    """Stands in for Alertmanager (vmalert needs one when a rule file has alerts): accepts and
    keeps what vmalert sends."""

    received: list[bytes]

    def do_POST(self) -> None:
        body = self.rfile.read(min(int(self.headers.get("Content-Length", "0")), 1 << 20))
        if len(self.received) < 1000:
            self.received.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@contextmanager
def run_vmalert(datasource: str, rules: str, interval: str = "1s") -> Iterator[str]:
    """``vmalert`` evaluating the rule file ``rules`` (YAML text) every ``interval`` against
    ``datasource`` and writing recorded series and alert state back to it; yields its URL.
    Alerts go to a loopback sink standing in for Alertmanager."""
    handler = type("Sink", (_AlertSink,), {"received": []})
    sink = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory(prefix="gpulens-vmalert-") as tmp:
        root = Path(tmp)
        (root / "rules.yml").write_text(rules)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        argv = [
            binary("vmalert"),
            f"-rule={root / 'rules.yml'}",
            f"-datasource.url={datasource}",
            f"-remoteWrite.url={datasource}",
            "-remoteWrite.flushInterval=1s",
            f"-notifier.url=http://127.0.0.1:{sink.server_address[1]}",
            f"-evaluationInterval={interval}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
        ]
        try:
            with managed_process(argv, f"{base}/health", log=root / "vmalert.log", cwd=root, timeout=60):
                yield base
        finally:
            sink.shutdown()
            sink.server_close()


def _to_milliseconds(line: str) -> str:
    """One OpenMetrics sample line with its timestamp (seconds) rewritten in milliseconds, the
    unit of the Prometheus text format that ``/api/v1/import/prometheus`` reads."""
    head, _, stamp = line.rstrip("\n").rpartition(" ")
    seconds = float(stamp)
    return f"{head} {round(seconds * 1000)}\n"


def _post(base: str, url: str, body: bytes, timeout: float) -> None:
    """POST one import request to VictoriaMetrics at ``base``; anything but 200/204 raises."""
    req = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        if resp.status not in (200, 204):
            raise RuntimeError(f"import into {base} answered HTTP {resp.status}")


def import_openmetrics(base: str, path: Path, extra_labels: dict[str, str] | None = None) -> int:
    """Load an OpenMetrics history file (every sample with a timestamp in seconds, as promtool's
    backfill reads it) into VictoriaMetrics at ``base``; return the samples sent. Comments and
    ``# EOF`` are dropped; the data is flushed so the next query sees it."""
    params = urllib.parse.urlencode([("extra_label", f"{k}={v}") for k, v in (extra_labels or {}).items()])
    url = f"{base}/api/v1/import/prometheus" + (f"?{params}" if params else "")
    sent = 0
    chunk: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal chunk, size
        if chunk:
            _post(base, url, "".join(chunk).encode(), timeout=300)
        chunk, size = [], 0

    with path.open() as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            out = _to_milliseconds(line)
            chunk.append(out)
            size += len(out)
            sent += 1
            if size >= IMPORT_CHUNK_BYTES:
                flush()
    flush()
    force_flush(base)
    return sent


def import_json_stream(base: str, stream: IO[bytes], chunk_bytes: int = IMPORT_CHUNK_BYTES) -> int:
    """Load series in VictoriaMetrics' native import format (``/api/v1/import``: one JSON line per
    series, ``{"metric": {...}, "values": [...], "timestamps": [ms...]}``) from ``stream`` (a file,
    or the pipe from ``scripts/backfill_fleet.py --format vm-json``) into VictoriaMetrics at
    ``base``; return the series sent. Requests of about ``chunk_bytes`` (whole lines) go out from a
    second thread while the next chunk is read: at most three chunks in memory, and the writer at
    the pipe's other end keeps generating while VictoriaMetrics ingests. The data is flushed so the
    next query sees it."""
    url = f"{base}/api/v1/import"
    pending: queue.Queue[bytes | None] = queue.Queue(maxsize=1)
    failed: list[BaseException] = []

    def sender() -> None:
        while (body := pending.get()) is not None:
            if failed:
                continue
            try:
                _post(base, url, body, timeout=600)
            except BaseException as e:  # re-raised in the caller's thread
                failed.append(e)

    thread = threading.Thread(target=sender, name="vm-import", daemon=True)
    thread.start()
    series, size = 0, 0
    chunk: list[bytes] = []
    try:
        for line in stream:
            if not line.strip():
                continue
            chunk.append(line)
            size += len(line)
            series += 1
            if size >= chunk_bytes:
                pending.put(b"".join(chunk))
                chunk, size = [], 0
                if failed:
                    break
        if chunk and not failed:
            pending.put(b"".join(chunk))
    finally:
        pending.put(None)
        thread.join()
    if failed:
        raise failed[0]
    force_flush(base)
    return series


def force_flush(base: str) -> None:
    """Make everything ingested so far searchable now (VictoriaMetrics otherwise takes ~1 s)."""
    with urllib.request.urlopen(f"{base}/internal/force_flush", timeout=60) as resp:
        resp.read()


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def rule_groups(records: Sequence[str] | None = None, alerts: bool = False) -> list[dict[str, Any]]:
    """The groups of deploy/rules/gpulens.rules.yml with only the recording rules ``records``
    (all if None) and, with ``alerts``, the alerting rules."""
    out = []
    for g in yaml.safe_load(RULES_FILE.read_text())["groups"]:
        rules = [r for r in g["rules"] if ("record" in r and (records is None or r["record"] in records))
                 or ("alert" in r and alerts)]  # fmt: skip
        if rules:
            out.append({**g, "rules": rules})
    return out


REPLAY_FLAGS = (
    # recorded series go back in batches of this many, by two writers (one pushes while the next
    # query runs). The queue holds series, one per answered series and query: it must take at least
    # one query's answer, or vmalert drops what does not fit ("queue is full")
    "-remoteWrite.maxBatchSize=10000",
    "-remoteWrite.concurrency=2",
    "-remoteWrite.maxQueueSize=1000000",
)
"""vmalert flags of :func:`replay_rules` besides the data sources, the window and the points per query."""


def replay_rules(
    base: str,
    start: float,
    end: float,
    work: Path,
    records: Sequence[str] | None = None,
    interval_s: float = 60.0,
    points_per_query: int = 1000,
    flags: Sequence[str] = REPLAY_FLAGS,
) -> dict[str, Any]:
    """Evaluate recording rules of deploy/rules/gpulens.rules.yml (``records``; all if None) every
    ``interval_s`` over [start, end] with ``vmalert``'s replay mode, writing the results into the
    VictoriaMetrics at ``base``: the same role as promtool's ``tsdb create-blocks-from rules`` for
    Prometheus. One rule per replay, in file order, flushed in between, so a rule that reads another
    rule's output finds all of it. A range query covers ``points_per_query`` evaluations: vmalert
    holds a query's whole answer (series x points), so this bounds its memory and VictoriaMetrics'
    (vmalert's default is 1,000). Returns ``{"seconds": {rule: s}, "peak_rss_bytes": n}``: each
    replay's wall time and the largest resident set of a vmalert."""
    vmalert = binary("vmalert")
    seconds: dict[str, float] = {}
    peak = 0
    for group in rule_groups(records):
        for rule in group["rules"]:
            rules = work / "replay-rules.yml"
            rules.write_text(yaml.safe_dump({"groups": [{"name": group["name"], "interval": f"{interval_s:g}s",
                                                         "rules": [rule]}]}))  # fmt: skip
            argv = [vmalert, f"-rule={rules}", f"-datasource.url={base}", f"-remoteWrite.url={base}",
                    # the range query's step (default 5m): one evaluation per interval, as a live vmalert
                    f"-datasource.queryStep={interval_s:g}s",
                    f"-replay.timeFrom={_rfc3339(start)}", f"-replay.timeTo={_rfc3339(end)}",
                    "-replay.disableProgressBar", "-replay.rulesDelay=0s", "-remoteWrite.flushInterval=100ms",
                    f"-replay.maxDatapointsPerQuery={points_per_query}", "-loggerLevel=ERROR", *flags]  # fmt: skip
            t0 = time.perf_counter()
            with tempfile.TemporaryFile() as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
                try:
                    _pid, status, usage = os.wait4(proc.pid, 0)  # its resource usage, peak memory included
                except BaseException:
                    proc.kill()
                    proc.wait()
                    raise
                proc.returncode = os.waitstatus_to_exitcode(status)
                if proc.returncode != 0:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-4000:]
                    raise RuntimeError(f"vmalert replay of {rule['record']} failed:\n{tail}")
            seconds[rule["record"]] = round(time.perf_counter() - t0, 1)
            peak = max(peak, usage.ru_maxrss * 1024)
            force_flush(base)
    return {"seconds": seconds, "peak_rss_bytes": peak}


def query(base: str, promql: str, at: float | None = None, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Instant query (now, or at Unix time ``at``) -> the ``data.result`` list; raises on an API error."""
    params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
    req = urllib.request.Request(f"{base}/api/v1/query", data=urllib.parse.urlencode(params).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        doc = json.load(resp)
    if doc.get("status") != "success":
        raise RuntimeError(f"query {promql!r} failed: {doc}")
    return list(doc["data"]["result"])
