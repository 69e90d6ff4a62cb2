"""Run a real Prometheus server (Debian package) on a free loopback port for integration tests."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboard.jobs import RULES as RULES_OF_JOBS
from tests.support.net import free_port
from tests.support.process import managed_process


def prometheus_binary() -> str:
    """Path of the prometheus binary; fails the test (not skip) if the test command did not install it."""
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus is not installed: run the README test command (scripts/test.sh)")
    return path


@contextmanager
def run_prometheus(
    config_yaml: str,
    rule_files: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    storage_dir: str | None = None,
    web_config: Path | None = None,
    ready_context: ssl.SSLContext | None = None,
    ready_headers: dict[str, str] | None = None,
) -> Iterator[str]:
    """Start Prometheus with ``config_yaml`` (rule files written beside it); yield its base URL.

    ``rule_files`` maps file names to YAML contents; reference them in the config by bare name
    (``rule_files: [alerts.yml]``) since the config sits in the same directory.
    ``web_config`` (a file the caller owns and may rewrite: Prometheus reads it on every request)
    secures its API (``--web.config.file``: TLS, basic auth, client certificates); with TLS the
    URL is https and ``ready_context`` must trust the server, and ``ready_headers`` carry
    credentials for the readiness poll.
    """
    binary = prometheus_binary()
    with tempfile.TemporaryDirectory(prefix="gpulens-prom-") as tmp:
        root = Path(tmp)
        (root / "prometheus.yml").write_text(config_yaml)
        for name, content in (rule_files or {}).items():
            (root / name).write_text(content)
        port = free_port()
        web_args: list[str] = []
        scheme = "http"
        if web_config is not None:
            web_args.append(f"--web.config.file={web_config}")
            scheme = "https" if "tls_server_config" in web_config.read_text() else "http"
        base = f"{scheme}://127.0.0.1:{port}"
        argv = [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={storage_dir or root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            *web_args,
            *extra_args,
        ]
        with managed_process(
            argv,
            f"{base}/-/ready",
            log=root / "prometheus.log",
            cwd=root,
            ready_context=ready_context,
            ready_headers=ready_headers,
        ):
            try:
                yield base
            finally:
                if os.environ.get("GPULENS_KEEP_PROM_LOG"):
                    print((root / "prometheus.log").read_text())


def query(base: str, promql: str, timeout: float = 10.0, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query (now, or at Unix time ``at``) -> the ``data.result`` list; raises on an API error."""
    params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        doc = json.load(resp)
    if doc.get("status") != "success":
        raise RuntimeError(f"query {promql!r} failed: {doc}")
    return list(doc["data"]["result"])


def wait_for_query(base: str, promql: str, predicate: Any = bool, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Poll an instant query until ``predicate(result)`` holds; return the result."""
    deadline = time.monotonic() + timeout
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        result = query(base, promql)
        if predicate(result):
            return result
        time.sleep(0.5)
    raise TimeoutError(f"{promql!r} never satisfied the predicate within {timeout}s; last result: {result}")


def scrape_config(targets: Sequence[str], interval: str = "1s", job: str = "gpulens") -> str:
    """A minimal prometheus.yml scraping ``targets`` (host:port) with honor_labels like the ServiceMonitor."""
    quoted = ", ".join(f"'{t}'" for t in targets)
    return (
        "global:\n"
        f"  scrape_interval: {interval}\n"
        f"  evaluation_interval: {interval}\n"
        "scrape_configs:\n"
        f"  - job_name: {job}\n"
        "    honor_labels: true\n"
        f"    static_configs:\n      - targets: [{quoted}]\n"
    )


RULES_FILE = Path(__file__).resolve().parents[2] / "deploy" / "rules" / "gpulens.rules.yml"
DASHBOARD_RECORDS = (
    "gpulens:gpu_sm_active:ratio_avg5m",
    "gpulens:gpu_activity:ratio_avg5m",
    "gpulens:gpu_idle:bool",
    "gpulens:pod_gpu_wasted:gpus",
    "gpulens:gpu_boundness:ratio_avg10m",
    "class:gpulens_gpu_boundness:sum",
    "gpulens:leaf_gpu_share:ratio",
    *RULES_OF_JOBS,
)
"""The recording rules the dashboard's Prometheus mode reads (the fleet's boundness mix reads the
per-leaf class shares, the jobs' records their per-leaf ones: backfilled in later passes). The
jobs group whole: the Jobs page reads its job records, the Job page its per-leaf ones."""
FLEET_RECORDS = tuple(r for r in DASHBOARD_RECORDS if not r.startswith("gpulens:job_"))
"""The records a fleet without jobs feeds (bench/fleet_scale.py's history has none: the jobs records
need pod classes and busy ratios, ``scripts/backfill_fleet.py --jobs``, bench/dashboard_scale.py)."""


def backfill_recording_rules(
    data: Path,
    start: float,
    end: float,
    work: Path,
    records: Sequence[str] = DASHBOARD_RECORDS,
    exprs: Mapping[str, str] | None = None,
    eval_interval_s: int = 60,
    aligned: bool = False,
) -> None:
    """Evaluate ``records`` (from deploy/rules/gpulens.rules.yml, or ``exprs``: record name ->
    expression) every ``eval_interval_s`` over [start, end] of the TSDB in ``data`` with ``promtool
    tsdb create-blocks-from rules`` and add the blocks to ``data``: what a Prometheus that had the
    rules loaded all along would have recorded. A Prometheus is started on ``data`` for promtool to
    query, then stopped (once per pass: rules reading other rules of ``records`` come in a later
    pass)."""
    import re
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    exprs = rule_expressions() if exprs is None else exprs
    # promtool cannot read what it records in the same pass: a rule reading another of ``records``
    # waits for a later pass, after the earlier one's blocks joined ``data``
    todo = list(records)
    for n in range(len(todo)):
        now = [r for r in todo if not any(re.search(rf"(?<![\w:]){re.escape(o)}(?![\w:])", exprs[r])
                                          for o in todo if o != r)]  # fmt: skip
        todo = [r for r in todo if r not in now]
        # promtool offsets a group's evaluations by a hash of its file and name: one file for every
        # pass (``aligned``) records every level at the same instants, so a record reading another
        # reads the value of that instant, not one evaluation earlier
        rules = work / ("backfill-rules.yml" if aligned else f"backfill-rules-{n}.yml")
        rules.write_text(yaml.safe_dump({"groups": [{"name": "backfill", "rules": [
            {"record": r, "expr": exprs[r]} for r in now]}]}))  # fmt: skip
        blocks = work / f"backfill-blocks-{n}"
        config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
        # a fleet of 10,000 GPUs makes some rules' range queries run for minutes on a busy 2-core
        # machine: past Prometheus' default 2 m query timeout (a 503 that fails the backfill)
        args = ["--storage.tsdb.retention.time=30d", "--query.timeout=15m"]
        with run_prometheus(config, storage_dir=str(data), extra_args=args) as base:
            subprocess.run([promtool, "tsdb", "create-blocks-from", "rules", f"--start={start:.0f}",
                            f"--end={end:.0f}", f"--url={base}", f"--output-dir={blocks}",
                            f"--eval-interval={eval_interval_s}s", str(rules)],
                           check=True, stdout=subprocess.DEVNULL, timeout=1800)  # fmt: skip
        for block in blocks.iterdir():
            shutil.move(str(block), str(data / block.name))
        if not todo:
            break


def rule_expressions() -> dict[str, str]:
    """Every recording rule of deploy/rules/gpulens.rules.yml: record name -> expression."""
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}


def inline_records(expr: str, exprs: Mapping[str, str]) -> str:
    """``expr`` with every record of ``exprs`` it reads replaced by the record's expression, down to
    raw series: the rules' answer computed at one instant (promtool backfills each dependency
    level in its own pass, so recorded samples of records that read records are a pass apart)."""
    import re

    for _ in range(10):
        names = [r for r in exprs if re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:{{])", expr)]
        if not names:
            return expr
        for r in names:
            expr = re.sub(rf"(?<![\w:]){re.escape(r)}(?![\w:{{])", f"({exprs[r]})".replace("\\", "\\\\"), expr)
    raise AssertionError(f"records nested too deep in {expr[:200]}")


def demo_scrape_config(targets: Sequence[str], *, rules: bool) -> str:
    """A prometheus.yml (also read by VictoriaMetrics' scraper) scraping exporter URLs ``targets``
    every second with honor_labels, each into cluster ``demo``; the exporters name their nodes
    themselves (the ``node`` label of every series: give each run_exporter a ``NODE_NAME``, or a
    simulated one is its scenario), so the targets add none (a second value would lose to the
    exporter's under honor_labels, on every series but ``up``);
    with ``rules``, loading gpulens.rules.yml (beside the config) evaluated every 2 s: the rules cost
    a Prometheus ~0.15 of a core at one evaluation a second over four simulated nodes, and the stacks
    of the dashboard tests run for minutes beside each other."""
    static = "\n".join(
        f"      - targets: ['{urllib.parse.urlsplit(t).netloc}']\n        labels: {{cluster: demo}}" for t in targets
    )
    head = (
        "global: {scrape_interval: 1s, evaluation_interval: 2s}\nrule_files: [gpulens.rules.yml]\n"
        if rules
        else "global: {scrape_interval: 1s}\n"
    )
    return f"{head}scrape_configs:\n  - job_name: gpulens\n    honor_labels: true\n    static_configs:\n{static}\n"


def rules_with_short_for(alert: str, for_: str = "3s") -> str:
    """The shipped rules file with ``alert``'s ``for:`` shortened, everything else untouched."""
    doc = yaml.safe_load(RULES_FILE.read_text())
    changed = 0
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["for"] = for_
                changed += 1
    assert changed, f"{alert} is not in {RULES_FILE}"
    return yaml.safe_dump(doc, sort_keys=False)


def alerts(base: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=10) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success"
    return list(doc["data"]["alerts"])


def firing(base: str, name: str) -> list[dict[str, str]]:
    return [a["labels"] for a in alerts(base) if a["labels"]["alertname"] == name and a["state"] == "firing"]


def wait_firing(base: str, name: str, pods: set[str], timeout: float = 90.0) -> list[dict[str, str]]:
    """Poll /api/v1/alerts until ``name`` fires for every pod in ``pods``; return the firing labels."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, str]] = []
    while time.monotonic() < deadline:
        seen = firing(base, name)
        if pods <= {labels["pod"] for labels in seen}:
            return seen
        time.sleep(1.0)
    raise AssertionError(f"{name} did not fire for {pods} within {timeout}s; firing: {seen}; all: {alerts(base)}")
