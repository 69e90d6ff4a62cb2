"""The serving advisor over a simulated week in a real Prometheus (backfilled with promtool): the
measurement layer reads the serving records and the exporter's series, and the advice matches a
computation by hand (tests/support/serving_week.py describes the week)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest

from dashboard.advisor import cli
from dashboard.advisor.query import Window
from dashboard.advisor.serving_query import ServingReport, advise_serving, measure
from dashboard.sources.prometheus import PrometheusSource
from tests.support import serving_week
from tests.support.prometheus import run_prometheus

pytestmark = pytest.mark.integration

WEEK_S = 7 * 86400.0
TARGETS = {"llama-3-8b": 0.050, "llama-3-70b-limit": 0.050}


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    """A Prometheus holding the week; the week's end (Unix s)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: run the README test command (scripts/test.sh)")
    folder = tmp_path_factory.mktemp("serving-week")
    end = float(int(time.time()))
    om = folder / "week.om"
    with om.open("w") as out:
        serving_week.write(out, days=7, interval_s=240, end=end)
    data = folder / "data"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", "--max-block-duration=240h", str(om),
                    str(data)], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    config = "global: {scrape_interval: 1m}\nscrape_configs: []\n"
    with run_prometheus(config, storage_dir=str(data), extra_args=["--storage.tsdb.retention.time=30d"]) as base:
        yield base, end


def _report(prom: tuple[str, float], h200_price: float) -> ServingReport:
    base, end = prom
    prices = {"H200": h200_price, "H100": 3.0, "L40S": 0.80, "L4": 0.70}
    return advise_serving(PrometheusSource(base), Window(window_s=WEEK_S, end=end), prices, TARGETS)


def test_the_measurements_are_the_weeks_figures(prom: tuple[str, float]) -> None:
    base, end = prom
    got = {(m.namespace, m.model, m.role): m for m in measure(PrometheusSource(base), Window(WEEK_S, end=end)).models}
    assert set(got) == {(d.namespace, d.model, d.role) for d in serving_week.DEPLOYMENTS}
    small = got[("small", "llama-3-8b", "both")]
    assert (small.gpu.key, small.gpus, small.busy_ratio) == ("H200", 1.0, pytest.approx(0.25))
    assert small.itl_p95_seconds == pytest.approx(0.008)
    assert small.memory_used_peak_bytes == pytest.approx(127e9)
    assert small.kv_cache_peak_ratio == pytest.approx(0.20)
    busy = {c: s for c, s in small.class_seconds.items() if c != "idle" and s > 0}
    # the pattern: 9 memory and 1 launch of every 10 busy samples (sampled at the advisor's step)
    assert busy["memory"] / sum(busy.values()) == pytest.approx(0.9, abs=0.02)
    decode = got[("dynamo", "deepseek-r1-distill-70b", "decode")]
    assert decode.waiting_trend_per_second == pytest.approx(0.001, rel=0.01)
    h100 = got[("decode", "llama-3-70b", "both")]
    assert (h100.gpu.key, h100.gpus) == ("H100", 8.0)
    assert h100.weights_bytes == pytest.approx(70e9 * 2 / 8)


@pytest.mark.parametrize("h200_price", [3.5, 4.5])
def test_each_served_model_gets_the_advice_computed_by_hand(prom: tuple[str, float], h200_price: float) -> None:
    report = _report(prom, h200_price)
    advice = {(a.model, a.role): a for a in report.advice}
    # small: needs (16 + (127 - 16) x 0.2) x 1.2 = 45.8 GB; L40S: r = 0.9 x 4.8/0.864 + 0.1 = 5.1,
    # ITL 40.8 ms <= 50, ceil(0.25 x 5.1 / 0.8) = 2 GPUs, 2 x 0.80 / (2000 x 3600) x 1e6 = $0.222/M;
    # the cheapest other fit is half an H200 (3g.71gb, r 1.9, one slice): h200_price x 0.5 / 7.2 = 0.243 or 0.313
    small = advice[("llama-3-8b", "both")]
    assert small.target == "L40S", small.text
    assert small.chosen is not None and small.chosen.gpus == math.ceil(0.25 * 5.1 / 0.8)
    assert small.chosen.usd_per_million_tokens == pytest.approx(2 * 0.80 / (2000 * 3600) * 1e6, rel=0.01)
    # decode on 8 H100s: H200 r = (34/36) x 3.35/4.8 + 2/36 = 0.715, ceil(8 x 0.9 x 0.715 / 0.9) = 6 H200s:
    # 6 x 3.5 = 21 < 24 an hour (move), 6 x 4.5 = 27 > 24 (keep)
    decode = advice[("llama-3-70b", "both")]
    assert decode.target == ("H200" if h200_price == 3.5 else "keep"), decode.text
    if decode.chosen:
        assert decode.chosen.gpus == math.ceil(8 * 0.9 * ((34 / 36) * 3.35 / 4.8 + 2 / 36) / 0.9)
    # at its 50 ms limit on H200s: every other GPU is slower or unpriced
    assert advice[("llama-3-70b-limit", "both")].target == "keep"
    # prefill has no inter-token latency of its own: no advice; the decode role keeps its H200s
    assert advice[("deepseek-r1-distill-70b", "prefill")].target == "no advice"
    # balance: 2 x 0.2 = 0.4 and 6 x 0.95 = 5.7 busy GPU-seconds a second; 8 x 0.4 / 6.1 = 0.52 -> 1
    # prefill GPU, and decode's queue grows: move 1 GPU from prefill to decode
    (pair,) = report.balance
    assert (pair.holding_back, pair.move_gpus) == ("decode", 1), pair.text
    # the busiest link of either role: the decode pods' NICs at 31 %
    assert pair.evidence["kv_transfer_link_share"] == pytest.approx(0.31)
    assert pair.text.endswith("KV transfer uses 31 % of the links"), pair.text


def test_the_cli_prints_the_serving_advice_and_refuses_a_bad_target(
    prom: tuple[str, float], capsys: pytest.CaptureFixture[str]
) -> None:
    base, _end = prom
    prices = ["--price", "H200=3.5", "--price", "H100=3", "--price", "L40S=0.8", "--price", "L4=0.7"]
    targets = ["--itl-target", "llama-3-8b=50ms", "--itl-target", "llama-3-70b-limit=50ms"]
    assert cli.main(["--prometheus", base, *prices, *targets]) == 0
    out = capsys.readouterr().out
    assert "Serving (the gpulens.serving rules)" in out
    assert "serve llama-3-8b on 2 × L40S: predicted " in out
    assert "deepseek-r1-distill-70b: decode holds prefill back" in out
    assert cli.main(["--prometheus", base, *prices, *targets, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    advice = {(x["model"], x["role"]): x["advice"] for x in doc["serving"]}
    assert advice[("llama-3-8b", "both")] == "2 x L40S"
    assert advice[("llama-3-70b", "both")] == "6 x H200"
    assert doc["serving_balance"][0]["move_gpus"] == 1
    # a TTFT target the L40S misses: TTFT 60 ms x r 5.1 = 306 ms > 200 ms; the cheapest fit that meets
    # it is half an H200 (3g.71gb, r 1.9: 114 ms), 3.5 x 0.5 / 7.2 = $0.243 against $0.486 per M today
    ttft = ["--ttft-target", "llama-3-8b=200ms"]
    assert cli.main(["--prometheus", base, *prices, *targets, *ttft, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    small = next(x for x in doc["serving"] if (x["model"], x["role"]) == ("llama-3-8b", "both"))
    assert small["advice"] == "1 x H200 3g.71gb", small
    assert small["evidence"]["ttft_target_seconds"] == 0.2
    assert "TTFT p95 114 ms against a 200 ms target" in small["reason"], small["reason"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--prometheus", base, "--itl-target", "llama-3-8b=fast"])
    assert exit_.value.code == 2
    assert "--itl-target 'llama-3-8b=fast'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--prometheus", base, "--ttft-target", "llama-3-8b=11m"])
    assert exit_.value.code == 2
    assert "--ttft-target 'llama-3-8b=11m'" in capsys.readouterr().err
