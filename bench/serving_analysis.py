#!/usr/bin/env python3
"""The serving rules on a device run's history (issue 53), phase by phase, against the engines'
own counts.

``bench/gpu_serving_run.py`` brings back ``summary.json`` (each phase's bounds, the engines' exact
token counts and ITL histograms, NVML energy) and ``history.om.gz`` (every scrape of the exporter
and the engines). This turns the history into TSDB blocks (``promtool tsdb create-blocks-from
openmetrics``) and records the ``gpulens.serving`` rules (and the records they read) every second
over the run (``promtool tsdb create-blocks-from rules``) with every range (5 m, and the role
inference's 30 m) set to ``--window`` seconds (default: the shortest phase with an engine), then
reads each record at each phase's end. So what is checked is the rules' joins, shares and ratios
over the last samples of one phase, not their 5-minute smoothing (a 20 s phase is shorter than the
rules' window).

Per phase and engine pod it reports (``--json`` writes the same rows):

  rules_tok_s / own_tok_s    output tokens/s by the rules against the engine's own count (ratio)
  pod_gpus                   the GPU-equivalents the rules give the pod (its share of the leaf)
  tok_per_gpu_s              the rules' output tokens per GPU-second (rules_tok_s / pod_gpus)
  j_per_tok / own_gpu_j_tok  the rules' joules per output token (the pod's share of the GPU's
                             energy) and the whole GPU's NVML joules over all tokens of the phase
  itl_p95 / own_itl_p95      the rules' ITL p95 against the same interpolation on the engine's own
                             histogram; own_itl_mean the engine's exact mean
  role (role_source)         the rules' role for the pod, given or inferred from its classes
  gpu_class, pod_class       the exporter's live classes (from summary.json)

    python3 -m bench.serving_analysis DIR [--json OUT] [--window S]   # DIR: summary.json, history.om.gz
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.prometheus import backfill_recording_rules, query, rule_expressions, run_prometheus  # noqa: E402

RECORDS = {
    "rules_tok_s": "gpulens:serving_output_tokens:rate5m",
    "rules_in_tok_s": "gpulens:serving_input_tokens:rate5m",
    "pod_gpus": "gpulens:serving_pod_gpus:sum",
    "tok_per_gpu_s": "gpulens:serving_output_tokens_per_gpu_second:ratio",
    "pod_watts": "gpulens:serving_pod_power:watts",
    "j_per_tok": "gpulens:serving_joules_per_output_token:ratio",
    "itl_p95": "gpulens:serving_itl_seconds:p95_5m",
    "itl_p50": "gpulens:serving_itl_seconds:p50_5m",
    "ttft_p95": "gpulens:serving_ttft_seconds:p95_5m",
    "kv_max": "gpulens:serving_kv_cache_usage:ratio_max5m",
    "info": "gpulens:serving_pod:info",
}
"""Report column -> the ``gpulens.serving`` record it reads (per pod)."""

RANGE = re.compile(r"\[(\d+)([smhd])\]")


def windowed_records(exprs: Mapping[str, str], window_s: int) -> dict[str, str]:
    """Every record ``RECORDS`` reads, directly or through other records, with each range selector
    set to ``window_s`` seconds (record name -> expression)."""
    todo = list(RECORDS.values())
    out: dict[str, str] = {}
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out[name] = RANGE.sub(f"[{window_s}s]", exprs[name])
        todo += [r for r in exprs if r not in out and re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:])", exprs[name])]
    return out


def histogram_quantile(q: float, bounds: Sequence[float | str], counts: Sequence[float]) -> float | None:
    """Prometheus' ``histogram_quantile`` on per-bucket (not cumulative) ``counts`` with upper
    ``bounds`` (the last ``+Inf``): linear inside the bucket, 0 as the first bucket's lower bound,
    the highest finite bound where the rank falls in ``+Inf``. None without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    below = 0.0
    for k, (bound, n) in enumerate(zip(bounds, counts, strict=True)):
        if below + n >= rank and n > 0:
            if bound == "+Inf" or (isinstance(bound, float) and math.isinf(bound)):
                return float(bounds[k - 1]) if k else None
            low = 0.0 if k == 0 else float(bounds[k - 1])
            return low + (float(bound) - low) * (rank - below) / n
        below += n
    return None


def build_tsdb(folder: Path, work: Path) -> Path:
    """The run's history as TSDB blocks in ``work/data``."""
    promtool = shutil.which("promtool")
    if promtool is None:
        raise SystemExit("promtool is not on PATH (scripts/test.sh installs it into .venv/bin)")
    om = work / "history.om"
    with gzip.open(folder / "history.om.gz", "rb") as src, om.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    data = work / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    om.unlink()
    return data


def _per_pod(base: str, promql: str, at: float) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in query(base, promql, at=at, timeout=60):
        m = r["metric"]
        out[f"{m.get('namespace')}/{m.get('pod')}"] = {"value": float(r["value"][1]), "labels": m}
    return out


def _own_itl(own: Mapping[str, Any]) -> float | None:
    return histogram_quantile(0.95, own["itl_bucket_bounds"], own["itl_bucket_counts"])


def analyse(summary: Mapping[str, Any], base: str) -> list[dict[str, Any]]:
    """One row per phase and engine pod (and one per idle phase, GPU figures only), from the
    records backfilled into the TSDB ``base`` serves."""
    rows: list[dict[str, Any]] = []
    pods = {role: e["pod"] for role, e in summary["engines"].items()}
    for ph in summary["phases"]:
        window = max(1, int(ph["end"] - ph["start"]))
        at = float(ph["end"])
        got = {col: _per_pod(base, rec, at) for col, rec in RECORDS.items()}
        energy = query(base, f"sum(rate(gpulens_gpu_energy_joules_total[{window}s]))", at=at, timeout=60)
        gpu_watts = float(energy[0]["value"][1]) if energy else None
        for role in ph["engines"] or [None]:
            row: dict[str, Any] = {"phase": ph["name"], "seconds": window, "engine": role,
                                   "concurrency": ph.get("concurrency"),
                                   "gpu_class": (ph.get("gpu_class") or {}).get("class"),
                                   "gpu_watts_rules": gpu_watts, "gpu_watts_nvml": ph.get("mean_power_w"),
                                   "own_gpu_j_tok": ph.get("joules_per_generated_token")}  # fmt: skip
            if role is not None:
                pod = pods[role]
                own = ph["engines_own"][role]
                row["pod"] = pod
                row["pod_class"] = ((ph.get("pod_classes") or {}).get(pod) or {}).get("class")
                row["own_tok_s"] = own["generation_tokens_per_s"]
                row["own_itl_p95"] = _own_itl(own)
                row["own_itl_mean"] = own.get("itl_mean_s")
                for col in RECORDS:
                    hit = got[col].get(pod)
                    if col == "info":
                        row["role"] = hit["labels"].get("role") if hit else None
                        row["role_source"] = hit["labels"].get("role_source") if hit else None
                        row["model"] = hit["labels"].get("model") if hit else None
                    else:
                        row[col] = hit["value"] if hit else None
                if row.get("rules_tok_s") and row["own_tok_s"]:
                    row["tok_ratio"] = row["rules_tok_s"] / row["own_tok_s"]
            rows.append(row)
    return rows


def _f(v: Any, spec: str) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as a Markdown table (ms for latencies, J for energy). "J/tok pod / share" is the
    pod's joules per token over its share of the GPU: the whole GPU's figure where one pod runs."""
    head = ("| phase | engine | role (source) | tok/s rules / own | pod GPUs | tok per GPU-s | J/tok pod "
            "| J/tok pod / share | J/tok GPU (NVML) | W rules / NVML | ITL p95 rules / own (mean) ms "
            "| TTFT p95 ms | KV max | class GPU / pod |\n|" + "---|" * 14)  # fmt: skip
    lines = [head]
    for r in rows:
        share = r.get("pod_gpus")
        whole = r["j_per_tok"] / share if r.get("j_per_tok") is not None and share else None
        lines.append(
            f"| {r['phase']} | {r.get('engine') or '—'} | {r.get('role') or '—'} ({r.get('role_source') or '—'}) "
            f"| {_f(r.get('rules_tok_s'), ',.0f')} / {_f(r.get('own_tok_s'), ',.0f')} "
            f"({_f(r.get('tok_ratio'), '.3f')}) | {_f(share, '.3f')} | {_f(r.get('tok_per_gpu_s'), ',.0f')} "
            f"| {_f(r.get('j_per_tok'), '.4f')} | {_f(whole, '.4f')} | {_f(r.get('own_gpu_j_tok'), '.4f')} "
            f"| {_f(r.get('gpu_watts_rules'), '.0f')} / {_f(r.get('gpu_watts_nvml'), '.0f')} "
            f"| {_f(_ms(r.get('itl_p95')), '.2f')} / {_f(_ms(r.get('own_itl_p95')), '.2f')} "
            f"({_f(_ms(r.get('own_itl_mean')), '.2f')}) | {_f(_ms(r.get('ttft_p95')), ',.0f')} "
            f"| {_f(r.get('kv_max'), '.2f')} | {r.get('gpu_class') or '—'} / {r.get('pod_class') or '—'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 2 on a folder without the run's files."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="the run's serving/ folder (summary.json, history.om.gz)")
    p.add_argument("--json", type=Path, help="write the rows here too")
    p.add_argument("--window", type=int, help="seconds every rule range becomes (default: the shortest engine phase)")
    a = p.parse_args(argv)
    for name in ("summary.json", "history.om.gz"):
        if not (a.folder / name).is_file():
            p.error(f"{a.folder / name}: not found")
    summary = json.loads((a.folder / "summary.json").read_text())
    with tempfile.TemporaryDirectory(prefix="gpulens-serving-") as tmp:
        work = Path(tmp)
        data = build_tsdb(a.folder, work)
        busy = [p for p in summary["phases"] if p["engines"]]
        window = a.window or max(1, int(min(p["end"] - p["start"] for p in busy)))
        records = windowed_records(rule_expressions(), window)
        start, end = summary["phases"][0]["start"] - 1, summary["phases"][-1]["end"] + 1
        backfill_recording_rules(data, start, end, work, tuple(records), exprs=records, eval_interval_s=1, aligned=True)
        print(f"records every 1 s over {end - start:.0f} s, ranges {window} s", file=sys.stderr)
        config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
        with run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=3650d"]) as base:
            rows = analyse(summary, base)
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
