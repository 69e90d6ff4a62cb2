"""The dashboard's and the advisor's flags and GPULENS_DASHBOARD_* variables take only what they
document: ASCII digits, finite numbers in a stated range, durations in ms/s/m/h/d (w for the
advisor's windows), http(s) URLs with a valid port. Anything else exits 2 with a message naming the
flag or the variable, never a traceback and never a silent default.

The command lines run for real (``python -m dashboard``, ``python -m dashboard.advisor``) for a
representative set; the full matrix goes through the same ``main`` functions in this process, with
``os.execve`` (the dashboard's hand-over to Streamlit) and the advisor's queries replaced, so an
accepted value is seen instead of started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dashboard import cli as dashboard_cli
from dashboard.advisor import cli as advisor_cli
from dashboard.inputs import parse_itl_targets, parse_ttft_targets
from dashboard.settings import DashboardSettings, from_env, parse_prices, to_env

REPO = Path(__file__).resolve().parent.parent
DASH_ENV = "GPULENS_DASHBOARD_"
CLOSED = "http://127.0.0.1:9"
"""A Prometheus URL nothing answers on (the advisor's queries are replaced in this process)."""


# --- running the two command lines in this process ---------------------------------------------------


class _Started(Exception):
    """Raised by the replaced ``os.execve``: the dashboard accepted its flags and would start."""


@dataclass
class Outcome:
    """What a command line did: its exit status and stderr, or what it would have run."""

    code: int | None
    stderr: str
    started: dict[str, Any] = field(default_factory=dict)
    """Dashboard: ``argv`` and ``env`` of Streamlit. Advisor: ``window``, ``prices``, ``policy``, ``timeout_s``."""


@pytest.fixture
def dashboard_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Outcome]:
    """``gpulens-dashboard ARGV`` with ``env`` as its GPULENS_DASHBOARD_* variables; never starts Streamlit."""

    def run(argv: list[str], env: Mapping[str, str] | None = None) -> Outcome:
        seen: dict[str, Any] = {}

        def execve(path: str, args: list[str], environ: dict[str, str]) -> None:
            seen.update(argv=args, env=environ)
            raise _Started

        with monkeypatch.context() as m:
            for key in [k for k in os.environ if k.startswith(DASH_ENV)]:
                m.delenv(key)
            for key, value in (env or {}).items():
                m.setenv(key, value)
            m.setattr(os, "execve", execve)
            capsys.readouterr()
            try:
                dashboard_cli.main(argv)
            except SystemExit as exc:
                return Outcome(int(exc.code or 0), capsys.readouterr().err)
            except _Started:
                return Outcome(None, capsys.readouterr().err, seen)
        raise AssertionError("main returned without starting Streamlit or exiting")

    return run


@pytest.fixture
def advisor_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., Outcome]:
    """``gpulens-advisor --prometheus URL ARGV`` with the queries replaced by what they were asked."""

    def run(argv: list[str], prometheus: str = CLOSED) -> Outcome:
        seen: dict[str, Any] = {}

        def advise(src: Any, window: Any, prices: Any, policy: Any, filters: Any) -> list[Any]:
            seen.update(window=window, prices=dict(prices), policy=policy, timeout_s=src.timeout_s)
            return []

        with monkeypatch.context() as m:
            m.setattr(advisor_cli, "advise", advise)
            capsys.readouterr()
            try:
                code = advisor_cli.main(["--prometheus", prometheus, *argv])
            except SystemExit as exc:
                code = int(exc.code or 0)
        return Outcome(code, capsys.readouterr().err, seen)

    return run


def _refusals(run: Callable[[list[str]], Outcome], name: str, cases: list[list[str]]) -> list[str]:
    """The cases that were not refused with exit 2 and a message naming ``name`` (a flag the command
    does not know is no refusal of its value)."""
    wrong = []
    for argv in cases:
        out = run(argv)
        if out.code != 2 or name not in out.stderr or "Traceback" in out.stderr or UNKNOWN in out.stderr:
            wrong.append(f"{argv}: exit {out.code}, started {bool(out.started)}, stderr {out.stderr[-200:]!r}")
    return wrong


UNKNOWN = "unrecognized arguments"
"""argparse's refusal of a flag it does not know."""


# --- the dashboard ------------------------------------------------------------------------------------

SOURCE = ["--scrape", "127.0.0.1:9445"]
DASHBOARD_BAD: dict[str, list[str]] = {
    "--refresh": ["nan", "inf", "-1", "0.5", "2d", "1e3", "١", "٣٠", "30 ", "1_0", "", "30x", "NaN"],
    "--timeout": ["inf", "nan", "1e12", "١", "0", "-5", "2h", "0.05", "10_0", "+10", "1e-3"],
    "--scrape-interval": ["nan", "inf", "0", "0.5", "2h", "5e0", "٥", "-5"],
    "--max-marks": ["1_000", "1e3", "١٠", "1.5", "0", "1000001", "+5", "-5", "nan", "inf", "", " 10"],
    "--port": ["٨٥٠١", "99999", "65536", "-1", "0", "80.0", "abc", " 8501", "8_501", "1e3"],
    "--address": ["", " 0.0.0.0", "999.1.1.1", "hé", "a b", "[::1]", "a..b", "1.2.3"],
    "--price-per-gpu-hour": [
        "H200=nan",
        "H200=inf",
        "H200=1e3",
        "H200=-1",
        "H200=10000.01",
        "H200=٣",
        "H200=3_5",
        "H200=3.5,H200=4",
        "H200=",
        "=3",
        "H200",
        "H200=+3",
    ],
    "--itl-target": [
        "llama-3-8b=fast",
        "llama-3-8b=0",
        "llama-3-8b=500us",
        "llama-3-8b=61s",
        "llama-3-8b=1e3",
        "llama-3-8b=٥٠ms",
        "llama-3-8b=nan",
        "llama-3-8b=-50ms",
        "llama-3-8b=50ms,llama-3-8b=40ms",
        "llama-3-8b=",
        "=50ms",
        "llama-3-8b",
    ],
    "--ttft-target": [
        "llama-3-8b=fast",
        "llama-3-8b=0",
        "llama-3-8b=500us",
        "llama-3-8b=601s",
        "llama-3-8b=11m",
        "llama-3-8b=1h",
        "llama-3-8b=1e3",
        "llama-3-8b=٥٠٠ms",
        "llama-3-8b=-2s",
        "llama-3-8b=2s,llama-3-8b=3s",
        "llama-3-8b=",
        "=2s",
        "llama-3-8b",
    ],
}
SOURCE_BAD: dict[str, list[str]] = {
    "--prometheus": [
        "prom:9090",
        "ftp://prom",
        "http://",
        "http://prom:99999",
        "http://prom:0",
        "http://prom:-1",
        "http://prom:٩٠٩٠",
        "http://prom:",
        "http://pr om:9090",
        "http://prom:9090/?q=1",
        "http://999.1.2.3:9090",
        "http://prøm:9090",
    ],
    "--scrape": ["ftp://a", "a:99999", "a:٩٤٤٥", " , ", "http://", "a b:1", "a:0", "node:9445,ftp://b"],
}


@pytest.mark.parametrize("flag", sorted(DASHBOARD_BAD))
def test_each_dashboard_flag_refuses_nonsense_naming_itself(flag: str, dashboard_main: Callable[..., Outcome]) -> None:
    cases = [[*SOURCE, flag, bad] for bad in DASHBOARD_BAD[flag]]
    assert _refusals(dashboard_main, flag, cases) == []


@pytest.mark.parametrize("flag", sorted(SOURCE_BAD))
def test_the_source_urls_must_be_http_urls_with_a_host_and_a_valid_port(
    flag: str, dashboard_main: Callable[..., Outcome]
) -> None:
    assert _refusals(dashboard_main, flag, [[flag, bad] for bad in SOURCE_BAD[flag]]) == []


DASHBOARD_ENV_BAD: dict[str, list[str]] = {
    "PORT": ["abc", "٨٥٠١", "99999", "-1", "0"],
    "ADDRESS": ["a b", "999.1.1.1"],
    "PRICES": ["H200=nan", "H200=inf", "H200=1e3"],
    "ITL_TARGETS": ["llama-3-8b=fast", "llama-3-8b=0", "llama-3-8b", "a=1ms,a=2ms"],
    "TTFT_TARGETS": ["llama-3-8b=fast", "llama-3-8b=0", "llama-3-8b=11m", "llama-3-8b", "a=1s,a=2s"],
    "REFRESH_SECONDS": ["nan", "inf", "-1", "١"],
    "TIMEOUT_SECONDS": ["-5", "nan", "1e12", "0"],
    "SCRAPE_INTERVAL_SECONDS": ["nan", "0", "١"],
    "MAX_MARKS": ["١٠", "1_000", "0", "1e3"],
}


@pytest.mark.parametrize("key", sorted(DASHBOARD_ENV_BAD))
def test_each_environment_twin_is_read_and_refuses_nonsense_naming_itself(
    key: str, dashboard_main: Callable[..., Outcome]
) -> None:
    """A twin the command line leaves unset is used, so it is checked as strictly as its flag (an
    unchecked or ignored one is a setting silently not applied)."""
    name = DASH_ENV + key
    wrong = []
    for bad in DASHBOARD_ENV_BAD[key]:
        out = dashboard_main(SOURCE, {name: bad})
        if out.code != 2 or f"{name}=" not in out.stderr or "Traceback" in out.stderr:
            wrong.append(f"{name}={bad!r}: exit {out.code}, stderr {out.stderr[-200:]!r}")
    assert wrong == []


APP_ENV_BAD: dict[str, list[str]] = {
    "REFRESH_SECONDS": ["nan", "inf", "-1", "١", "0.5"],
    "TIMEOUT_SECONDS": ["-5", "nan", "inf", "1e12", "0", "2h"],
    "SCRAPE_INTERVAL_SECONDS": ["nan", "0", "5e0"],
    "MAX_MARKS": ["١٠", "1_000", "1.5", "1000001"],
    "PRICES": ["H200=nan", "H200=inf", "H200=٣", "H200=3,H200=4"],
    "ITL_TARGETS": ["llama-3-8b=fast", "llama-3-8b=90s", "a=1ms,a=2ms"],
    "TTFT_TARGETS": ["llama-3-8b=fast", "llama-3-8b=601s", "a=1s,a=2s"],
    "PROMETHEUS": ["prom:9090", "http://prom:99999", "ftp://prom"],
    "SCRAPE": ["ftp://a", "a:99999"],
}


@pytest.mark.parametrize("key", sorted(APP_ENV_BAD))
def test_the_app_reads_its_environment_with_the_same_parsers(key: str) -> None:
    """``streamlit run dashboard/app.py`` with the variables set directly: a ValueError naming the
    variable (the app shows it as "bad dashboard setting: ...")."""
    name = DASH_ENV + key
    wrong = []
    for bad in APP_ENV_BAD[key]:
        try:
            got = from_env({name: bad})
        except ValueError as exc:
            if f"{name}={bad!r}" not in str(exc):
                wrong.append(f"{name}={bad!r}: message {exc}")
        else:
            wrong.append(f"{name}={bad!r} accepted: {got}")
    assert wrong == []


def test_documented_forms_and_the_ends_of_each_range_are_taken(dashboard_main: Callable[..., Outcome]) -> None:
    """Each flag takes the forms docs/dashboard.md shows, units too, and both ends of its stated range."""

    def started(*argv: str) -> dict[str, str]:
        out = dashboard_main([*SOURCE, *argv])
        assert out.started, f"{argv} refused: {out.stderr}"
        return out.started["env"]

    cases: list[tuple[tuple[str, ...], str, str]] = [
        (("--refresh", "0"), "REFRESH_SECONDS", "0"),
        (("--refresh", "15"), "REFRESH_SECONDS", "15"),
        (("--refresh", "1"), "REFRESH_SECONDS", "1"),
        (("--refresh", "2m"), "REFRESH_SECONDS", "120"),
        (("--refresh", "1d"), "REFRESH_SECONDS", "86400"),
        (("--timeout", "10"), "TIMEOUT_SECONDS", "10"),
        (("--timeout", "100ms"), "TIMEOUT_SECONDS", "0.1"),
        (("--timeout", "1h"), "TIMEOUT_SECONDS", "3600"),
        (("--timeout", "2.5"), "TIMEOUT_SECONDS", "2.5"),
        (("--scrape-interval", "1"), "SCRAPE_INTERVAL_SECONDS", "1"),
        (("--scrape-interval", "1h"), "SCRAPE_INTERVAL_SECONDS", "3600"),
        (("--max-marks", "1"), "MAX_MARKS", "1"),
        (("--max-marks", "1000000"), "MAX_MARKS", "1000000"),
        (("--price-per-gpu-hour", "H200=3.5,A100=1.6,*=2"), "PRICES", "H200=3.5,A100=1.6,*=2"),
        (("--price-per-gpu-hour", "NVIDIA H200=0, A100=10000"), "PRICES", "NVIDIA H200=0,A100=10000"),
        (("--itl-target", "llama-3-8b=50ms"), "ITL_TARGETS", "llama-3-8b=0.05"),
        (("--itl-target", "meta-llama/Llama-3.1-8B=1ms, q=1m"), "ITL_TARGETS", "meta-llama/Llama-3.1-8B=0.001,q=60"),
        (("--itl-target", "a=b=0.04"), "ITL_TARGETS", "a=b=0.04"),
        (("--ttft-target", "llama-3-8b=800ms"), "TTFT_TARGETS", "llama-3-8b=0.8"),
        (("--ttft-target", "Qwen/Qwen2.5-7B=1ms, q=10m"), "TTFT_TARGETS", "Qwen/Qwen2.5-7B=0.001,q=600"),
        (("--ttft-target", "a=b=2"), "TTFT_TARGETS", "a=b=2"),
    ]
    wrong = [f"{argv}: {key}={got!r}" for argv, key, want in cases if (got := started(*argv)[DASH_ENV + key]) != want]
    assert wrong == []
    for port in ("1", "8501", "65535"):
        out = dashboard_main([*SOURCE, "--port", port])
        assert f"--server.port={port}" in out.started["argv"]
    for address in ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost", "gpulens-dashboard.monitoring.svc"):
        out = dashboard_main([*SOURCE, "--address", address])
        assert f"--server.address={address}" in out.started["argv"]
    out = dashboard_main(["--prometheus", "https://thanos.example:10902/prefix/"])
    assert out.started["env"][DASH_ENV + "PROMETHEUS"] == "https://thanos.example:10902/prefix/"
    out = dashboard_main(["--scrape", "node-a:9445, http://[::1]:9445/metrics,https://b/metrics?x=1"])
    assert out.started["env"][DASH_ENV + "SCRAPE"] == "node-a:9445,http://[::1]:9445/metrics,https://b/metrics?x=1"


def test_environment_twins_reach_the_app_when_no_flag_is_given(dashboard_main: Callable[..., Outcome]) -> None:
    """docs/dashboard.md gives ``GPULENS_DASHBOARD_MAX_MARKS`` as ``--max-marks``' twin: the command
    line must pass it on rather than overwrite it with the default; a flag still wins."""
    twins = {
        "MAX_MARKS": "10",
        "REFRESH_SECONDS": "0",
        "TIMEOUT_SECONDS": "2.5",
        "SCRAPE_INTERVAL_SECONDS": "2",
        "PRICES": "H200=3.5",
        "ITL_TARGETS": "llama-3-8b=0.05",
        "TTFT_TARGETS": "llama-3-8b=0.8",
        "PORT": "8600",
        "ADDRESS": "127.0.0.1",
    }
    out = dashboard_main(SOURCE, {DASH_ENV + k: v for k, v in twins.items()})
    env = out.started["env"]
    assert {k: env[DASH_ENV + k] for k in twins if k not in ("PORT", "ADDRESS")} == {
        k: v for k, v in twins.items() if k not in ("PORT", "ADDRESS")
    }
    assert "--server.port=8600" in out.started["argv"] and "--server.address=127.0.0.1" in out.started["argv"]
    out = dashboard_main([*SOURCE, "--max-marks", "20"], {DASH_ENV + "MAX_MARKS": "10"})
    assert out.started["env"][DASH_ENV + "MAX_MARKS"] == "20"
    out = dashboard_main(SOURCE, {DASH_ENV + "MAX_MARKS": ""})
    assert out.started["env"][DASH_ENV + "MAX_MARKS"] == "4000", "an empty variable is an unset one"


def test_settings_survive_the_environment_exactly() -> None:
    """The CLI hands settings to the app as text: every value comes back as it was, in the form the
    parsers take (``f"{x:g}"`` wrote 1e-05, which is refused, and cut 1234.5678 to 1234.57)."""
    cfg = DashboardSettings(
        prometheus_url="http://prom:9090",
        prices_per_gpu_hour={"H200": 0.00001, "A100": 1234.5678, "*": 2.0},
        itl_targets_seconds={"meta-llama/Llama-3.1-8B-Instruct": 0.0123456789, "a=b": 60.0, "c": 0.001},
        ttft_targets_seconds={"meta-llama/Llama-3.1-8B-Instruct": 1.23456789, "a=b": 600.0, "c": 0.001},
        refresh_seconds=86399.125,
        timeout_seconds=0.123456789,
        scrape_interval_seconds=1.5,
        max_marks=123457,
    )
    assert from_env(to_env(cfg)) == cfg


def test_prices_are_plain_decimals_in_range() -> None:
    assert parse_prices("H200=3.5, A100=1.6,*=2") == {"H200": 3.5, "A100": 1.6, "*": 2.0}
    assert parse_prices("H200=0,A100=10000") == {"H200": 0.0, "A100": 10000.0}
    for bad, why in [
        ("H200=nan", "not a finite number"),
        ("H200=inf", "not a finite number"),
        ("H200=1e3", "exponent"),
        ("H200=٣", "outside ASCII"),
        ("H200=3_5", "'_'"),
        ("H200=10000.000000000000001", "at most 10000"),
        ("H200=3,H200=4", "priced twice"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_prices(bad)


def test_the_dashboard_help_states_each_range() -> None:
    text = " ".join(dashboard_cli.build_parser().format_help().split())
    for flag, span in [
        ("--port", "1..65535"),
        ("--refresh", "0 = off, else 1s..1d"),
        ("--timeout", "100ms..1h"),
        ("--scrape-interval", "1s..1h"),
        ("--max-marks", "1..1000000"),
        ("--price-per-gpu-hour", "USD 0..10000"),
        ("--itl-target", "1ms..1m"),
        ("--ttft-target", "1ms..10m"),
    ]:
        assert flag in text and span in text, (flag, span)
    for key in (
        "PORT",
        "ADDRESS",
        "PRICES",
        "ITL_TARGETS",
        "TTFT_TARGETS",
        "REFRESH_SECONDS",
        "TIMEOUT_SECONDS",
        "SCRAPE_INTERVAL_SECONDS",
        "MAX_MARKS",
    ):
        assert DASH_ENV + key in text


# --- the advisor --------------------------------------------------------------------------------------

ADVISOR_BAD: dict[str, list[str]] = {
    "--timeout": ["nan", "inf", "١", "0", "-1", "2h", "1e3", "30 ", "0.01"],
    "--headroom": ["nan", "inf", "0.8", "4.0000000000000000001", "5", "1e0", "١.٥", "-1", "1_2"],
    "--compute-headroom": ["1e308", "nan", "inf", "0.99", "-1", "4.5"],
    "--window": ["٧d", " 7d ", "999999999999w", "0d", "7x", "30m", "366d", "53w", "3600.5s", "7D", "nan", "w", "1e3d"],
    "--step": ["0.0000001s", "0", "2d", "90.5s", "nan", "1e3s", "-1m", "٦٠"],
    "--price": ["H200=nan", "H200=inf", "H200=-1", "H200=1e2", "H200=٣", "H200=20000", "H200=3,H200=4"],
    "--itl-target": ["llama-3-8b=fast", "llama-3-8b=0", "llama-3-8b=2m", "a=1ms,a=2ms", "llama-3-8b"],
    "--ttft-target": ["llama-3-8b=fast", "llama-3-8b=0", "llama-3-8b=11m", "a=1s,a=2s", "llama-3-8b"],
}


@pytest.mark.parametrize("flag", sorted(ADVISOR_BAD))
def test_each_advisor_flag_refuses_nonsense_naming_itself(flag: str, advisor_main: Callable[..., Outcome]) -> None:
    assert _refusals(advisor_main, flag, [[flag, bad] for bad in ADVISOR_BAD[flag]]) == []


def test_the_advisor_refuses_a_bad_prometheus_url(advisor_main: Callable[..., Outcome]) -> None:
    def run(argv: list[str]) -> Outcome:
        return advisor_main([], prometheus=argv[0])

    bad = ["http://prom:99999", "http://", "http://prom:٩٠٩٠", "http://p:9090/?x=1", "http://pr om", "http://prom:"]
    assert _refusals(run, "--prometheus", [[b] for b in bad]) == []


def test_the_advisor_refuses_what_only_a_pair_of_flags_makes_nonsense(advisor_main: Callable[..., Outcome]) -> None:
    """A step longer than the window has no step inside it; one model priced twice keeps one price."""
    out = advisor_main(["--window", "2h", "--step", "3h"])
    assert out.code == 2 and "--step" in out.stderr and "--window" in out.stderr
    out = advisor_main(["--price", "H200=3", "--price", "H200=4"])
    assert out.code == 2 and "--price" in out.stderr and "priced twice" in out.stderr


def test_advisor_documented_forms_and_range_ends_are_taken(advisor_main: Callable[..., Outcome]) -> None:
    """docs/advisor.md's forms (``7d``, ``--step 30m``, ``--price H200=3.5``), ``w`` and ``ms`` units,
    and both ends of each stated range; windows and steps in whole seconds."""
    cases: list[tuple[list[str], str, Any]] = [
        (["--window", "7d"], "window_s", 7 * 86400),
        (["--window", "2w"], "window_s", 14 * 86400),
        (["--window", "1h"], "window_s", 3600),
        (["--window", "365d"], "window_s", 365 * 86400),
        (["--window", "1.1h"], "window_s", 3960),
        (["--window", "1d", "--step", "30m"], "step_s", 1800),
        (["--step", "1s"], "step_s", 1),
        (["--step", "1d"], "step_s", 86400),
        (["--timeout", "100ms"], "timeout_s", 0.1),
        (["--timeout", "1h"], "timeout_s", 3600),
        (["--timeout", "2"], "timeout_s", 2),
        (["--headroom", "1"], "headroom", 1.0),
        (["--headroom", "4"], "headroom", 4.0),
        (["--compute-headroom", "1.25"], "compute_headroom", 1.25),
    ]
    wrong = []
    for argv, what, want in cases:
        out = advisor_main(argv)
        if out.code != 0:
            wrong.append(f"{argv} refused: {out.stderr[-200:]}")
            continue
        s = out.started
        got = {
            "window_s": s["window"].window_s,
            "step_s": s["window"].step_s,
            "timeout_s": s["timeout_s"],
            "headroom": s["policy"].headroom,
            "compute_headroom": s["policy"].compute_headroom,
        }[what]
        if got != want:
            wrong.append(f"{argv}: {what} {got!r}, not {want!r}")
    assert wrong == []
    out = advisor_main(["--price", "H200=3.5", "--price", "H100=2.5", "--price", "A100=0,*=10000"])
    assert out.started["prices"] == {"H200": 3.5, "H100": 2.5, "A100": 0.0, "*": 10000.0}


def test_both_commands_read_itl_targets_with_one_parser(
    dashboard_main: Callable[..., Outcome], advisor_main: Callable[..., Outcome]
) -> None:
    """``--itl-target`` takes ``MODEL=DURATION[,...]`` in the advisor (repeatable) and the dashboard
    alike: the same targets, the same refusals."""
    argv = ["--itl-target", "llama-3-8b=50ms,qwen=0.04", "--itl-target", "big=1m"]
    got = advisor_cli.options(advisor_cli.parser().parse_args(["--prometheus", CLOSED, *argv]))
    assert got.itl_targets == {"llama-3-8b": 0.05, "qwen": 0.04, "big": 60.0}
    env = dashboard_main([*SOURCE, "--itl-target", "llama-3-8b=50ms,qwen=0.04,big=1m"]).started["env"]
    assert from_env(env).itl_targets_seconds == got.itl_targets
    twice = advisor_cli.parser().parse_args(["--prometheus", CLOSED, "--itl-target", "a=1ms", "--itl-target", "a=2ms"])
    with pytest.raises(ValueError, match="'a' has two targets"):
        advisor_cli.options(twice)
    for bad, why in (("a=fast", "'fast' is not a duration in 1ms..1m"), ("a=2m", "it is longer than 1m")):
        for out in (dashboard_main([*SOURCE, "--itl-target", bad]), advisor_main(["--itl-target", bad])):
            assert out.code == 2 and f"--itl-target {bad!r}" in out.stderr and why in out.stderr, out.stderr


def test_both_commands_read_ttft_targets_with_the_same_parser(
    dashboard_main: Callable[..., Outcome], advisor_main: Callable[..., Outcome]
) -> None:
    """``--ttft-target`` takes ``MODEL=DURATION[,...]`` in the advisor (repeatable) and the dashboard
    alike, read by the ITL targets' parser with the TTFT range (1ms..10m): a 2-minute TTFT target is
    taken where the same ITL target is refused, 11 minutes is refused; each refusal names the flag."""
    argv = ["--ttft-target", "llama-3-8b=800ms,qwen=1.5", "--ttft-target", "big=2m"]
    got = advisor_cli.options(advisor_cli.parser().parse_args(["--prometheus", CLOSED, *argv]))
    assert got.ttft_targets == {"llama-3-8b": 0.8, "qwen": 1.5, "big": 120.0}
    assert got.itl_targets == {}, "a TTFT target is no ITL target"
    env = dashboard_main([*SOURCE, "--ttft-target", "llama-3-8b=800ms,qwen=1.5,big=2m"]).started["env"]
    assert from_env(env).ttft_targets_seconds == got.ttft_targets
    assert from_env(env).itl_targets_seconds == {}
    both = ["--prometheus", CLOSED, "--ttft-target", "a=1s", "--ttft-target", "a=2s"]
    with pytest.raises(ValueError, match="--ttft-target: 'a' has two targets"):
        advisor_cli.options(advisor_cli.parser().parse_args(both))
    assert parse_ttft_targets("a=10m") == {"a": 600.0}
    with pytest.raises(ValueError, match="it is longer than 1m"):
        parse_itl_targets("a=2m")
    for bad, why in (("a=fast", "'fast' is not a duration in 1ms..10m"), ("a=11m", "it is longer than 10m")):
        for out in (dashboard_main([*SOURCE, "--ttft-target", bad]), advisor_main(["--ttft-target", bad])):
            assert out.code == 2 and f"--ttft-target {bad!r}" in out.stderr and why in out.stderr, out.stderr
    out = dashboard_main(SOURCE, {DASH_ENV + "TTFT_TARGETS": "a=11m"})
    assert out.code == 2 and f"{DASH_ENV}TTFT_TARGETS='a=11m'" in out.stderr, out.stderr


def test_the_advisor_help_states_each_range() -> None:
    text = " ".join(advisor_cli.parser().format_help().split())
    spans = ("1h..365d", "1s..1d", "100ms..1h", "1..4", "USD 0..10000", "http:// or https://", "1ms..1m", "1ms..10m")
    for span in spans:
        assert span in text, span


# --- the real command lines ----------------------------------------------------------------------------


def _run(module: str, argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGV`` with no GPULENS_* variables but ``env``. A dashboard that accepted its
    flags would start Streamlit: it is stopped by the timeout, and the test fails."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=REPO,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "env", "name"),
    [
        (["--refresh", "nan"], {}, "--refresh"),
        (["--timeout", "inf"], {}, "--timeout"),
        (["--timeout", "١"], {}, "--timeout"),
        (["--port", "٨٥٠١"], {}, "--port"),
        (["--max-marks", "1_000"], {}, "--max-marks"),
        (["--price-per-gpu-hour", "H200=nan"], {}, "--price-per-gpu-hour"),
        (["--itl-target", "llama-3-8b=fast"], {}, "--itl-target"),
        ([], {"GPULENS_DASHBOARD_ITL_TARGETS": "llama-3-8b=0"}, "GPULENS_DASHBOARD_ITL_TARGETS"),
        (["--ttft-target", "llama-3-8b=11m"], {}, "--ttft-target"),
        ([], {"GPULENS_DASHBOARD_TTFT_TARGETS": "llama-3-8b=0"}, "GPULENS_DASHBOARD_TTFT_TARGETS"),
        ([], {"GPULENS_DASHBOARD_PORT": "abc"}, "GPULENS_DASHBOARD_PORT"),
        ([], {"GPULENS_DASHBOARD_REFRESH_SECONDS": "nan"}, "GPULENS_DASHBOARD_REFRESH_SECONDS"),
        ([], {"GPULENS_DASHBOARD_MAX_MARKS": "١٠"}, "GPULENS_DASHBOARD_MAX_MARKS"),
    ],
)
def test_the_dashboard_command_exits_2_naming_the_input(argv: list[str], env: dict[str, str], name: str) -> None:
    proc = _run("dashboard", ["--scrape", "127.0.0.1:9", "--address", "127.0.0.1", *argv], env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert name in proc.stderr and "Traceback" not in proc.stderr and UNKNOWN not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("usage: gpulens-dashboard"), "argparse's usage, then the error"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["--timeout", "nan"], "--timeout"),
        (["--headroom", "inf"], "--headroom"),
        (["--compute-headroom", "1e308"], "--compute-headroom"),
        (["--window", "٧d"], "--window"),
        (["--step", "0.0000001s"], "--step"),
        (["--price", "H200=nan"], "--price"),
        (["--itl-target", "llama-3-8b=fast"], "--itl-target"),
        (["--ttft-target", "llama-3-8b=11m"], "--ttft-target"),
    ],
)
def test_the_advisor_command_exits_2_naming_the_flag(argv: list[str], name: str) -> None:
    proc = _run("dashboard.advisor", ["--prometheus", CLOSED, *argv])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert name in proc.stderr and "Traceback" not in proc.stderr and UNKNOWN not in proc.stderr, proc.stderr
