"""ui.table and its header map: every column a human header, numbers with thousands separators,
missing values in words, the caller's settings kept; the right-sizing evidence in words; the
Sharing chart's colours; and the browser checks' text rules (tests/support/browser.py)."""

from __future__ import annotations

import pandas as pd
import pytest
import streamlit as st

from dashboard import ui
from dashboard.figures.sharing import MIG_LABEL_CHARS, _wrap, kernel_time_bar
from dashboard.figures.vega import data_of
from tests.support.browser import SNAKE_CASE, text_findings

pytestmark = pytest.mark.integration

DEFAULTED = {
    # column names a page may show that the map does not list, and the header each gets
    "memory_used_bytes": "Memory used bytes",
    "pci_bus_id": "PCI bus ID",
    "numa_node": "NUMA node",
    "gpu_util": "GPU util",
    "peers": "Peers",
    "nics": "NICs",
    "what": "What",
    "count": "Count",
    "nearest": "Nearest",
    "ready": "Ready",
    "kind": "Kind",
    "state": "State",
    "utilization": "Utilization",
    "line_rate": "Line rate",
    "shared": "Shared",
    "tx": "Tx",
    "rx": "Rx",
}


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("namespace", "Namespace"),
        ("workload_kind", "Owner kind"),
        ("gpu_hours", "GPU-hours"),
        ("mig_uuid", "MIG instance"),
        ("first_seen", "First seen"),
        ("cost_usd", "Cost (USD)"),
        ("kernel_time", "Kernel time"),
        ("idle_for", "Idle for"),
    ],
)
def test_known_columns_have_their_headers(name: str, shown: str) -> None:
    assert ui.header(name) == shown


@pytest.mark.parametrize(("name", "shown"), sorted(DEFAULTED.items()))
def test_unknown_columns_read_as_words(name: str, shown: str) -> None:
    assert name not in ui.HEADERS, "listed here because the map does not know it"
    assert ui.header(name) == shown
    assert not SNAKE_CASE.match(ui.header(name))


def test_no_header_in_the_map_is_snake_case_or_blank() -> None:
    bad = {k: v for k, v in ui.HEADERS.items() if not v.strip() or SNAKE_CASE.match(v) or "_" in v}
    assert bad == {}


def _label(config: dict[str, object], column: str) -> str:
    setting = config[column]
    assert isinstance(setting, dict)
    return str(setting["label"])


def _format(config: dict[str, object], column: str) -> object:
    setting = config[column]
    assert isinstance(setting, dict)
    return (setting.get("type_config") or {}).get("format")


def test_table_frame_gives_every_column_a_header_and_numbers_their_separators() -> None:
    df = pd.DataFrame(
        {
            "namespace": ["a", "b"],
            "gpu_hours": [12884.5, 1.0],
            "bytes": [12884901888, 5],
            "pci_bus_id": ["00000000:18:00.0", "00000000:19:00.0"],
        }
    )
    shown, config = ui.table_frame(df)
    assert shown.equals(df), "no missing value: the data is left as it is"
    assert [_label(config, c) for c in df.columns] == ["Namespace", "GPU-hours", "Bytes", "PCI bus ID"]
    assert _format(config, "gpu_hours") == "%,.2f"
    assert _format(config, "bytes") == "localized"


def test_missing_values_read_as_the_reason_given_and_numbers_stay_formatted() -> None:
    df = pd.DataFrame(
        {
            "namespace": ["a", None],
            "cost_usd": [1234.5, float("nan")],
            "kernel_time": [0.5, float("nan")],
            "count": [12884901888.0, float("nan")],
        }
    )
    shown, config = ui.table_frame(
        df,
        {"kernel_time": st.column_config.ProgressColumn("Kernel time", format="percent", min_value=0, max_value=1)},
        {"cost_usd": "no price set", "kernel_time": ["-", "MPS: not split"]},
    )
    assert shown["cost_usd"].tolist() == ["$1,234.50", "no price set"]
    assert shown["kernel_time"].tolist() == ["50 %", "MPS: not split"], "the pages' one percentage style"
    assert shown["count"].tolist() == ["12,884,901,888", ui.DEFAULT_MISSING]
    assert shown["namespace"].tolist() == ["a", ui.DEFAULT_MISSING]
    assert _label(config, "kernel_time") == "Kernel time" and _label(config, "cost_usd") == "Cost (USD)"
    for c in ("cost_usd", "kernel_time", "count"):
        setting = config[c]
        assert isinstance(setting, dict) and setting["alignment"] == "right", "numbers as text, right aligned"
    for value in shown.to_numpy().ravel():
        assert str(value) not in ("None", "nan", "NaN", "<NA>")


def test_the_callers_settings_are_kept() -> None:
    link = st.column_config.LinkColumn("GPU", display_text="open")
    df = pd.DataFrame({"gpu_page": ["gpu?uuid=G"], "uuid": ["G"], "x": [1]})
    _shown, config = ui.table_frame(df, {"gpu_page": link, "uuid": None, "x": "Ex"})
    assert config["gpu_page"] == link
    assert config["uuid"] is None, "hidden stays hidden"
    assert _label(config, "x") == "Ex"
    unlabelled = st.column_config.NumberColumn(format="dollar")
    _shown, config = ui.table_frame(pd.DataFrame({"cost_usd": [1.0]}), {"cost_usd": unlabelled})
    assert _label(config, "cost_usd") == "Cost (USD)" and _format(config, "cost_usd") == "dollar"


@pytest.mark.parametrize(
    ("value", "fmt", "shown"),
    [
        (12884901888, None, "12,884,901,888"),
        (0.5005807999999999, "localized", "0.501"),
        (0.425, "percent", "42 %"),
        (1234.5, "dollar", "$1,234.50"),
        (42.4, "%.0f%%", "42%"),
        (1234567.891, "%,.2f GiB", "1,234,567.89 GiB"),
        (12345, "%,d", "12,345"),
        (5.0, "accounting", "5.00"),
    ],
)
def test_format_number_draws_as_streamlit_does(value: float, fmt: str | None, shown: str) -> None:
    assert ui.format_number(value, fmt) == shown


def test_right_sizing_evidence_reads_in_words_and_units() -> None:
    evidence = {
        "workload": "ml/Deployment/x",
        "gpu_model": "NVIDIA H200",
        "mig_profile": None,
        "memory_peak_bytes": 12884901888,
        "sm_active_p95": 0.5005807999999999,
        "dram_active_p95": None,
        "boundness_memory": 0.25,
        "headroom": 1.2,
        "new_metric_ratio": 0.123456789,
    }
    table = ui.evidence_table(evidence)
    rows = dict(zip(table["What"], table["Value"], strict=True))
    assert rows["Holds"] == "whole GPU"
    assert rows["Peak GPU memory used"] == "12.0 GiB"
    assert rows["SM active, 95th percentile"] == "50 %"
    assert rows["DRAM active, 95th percentile"] == "not measured"
    assert rows["Bound by memory, share of the time held"] == "25 %"
    assert rows["Memory headroom"] == "1.20x"
    assert rows["New metric ratio"] == "0.123"
    assert "workload" not in rows and "ml/Deployment/x" not in rows.values()
    text = " ".join(f"{k} {v}" for k, v in rows.items())
    assert text_findings(text, "evidence") == [], text
    assert ui.evidence_table({"mig_profile": "1g.18gb"})["Value"].tolist() == ["1g.18gb"]


def test_sharing_chart_gives_every_pod_its_own_colour_and_names_gpus_by_node() -> None:
    pods = [f"p{i}" for i in range(25)]
    shares = pd.DataFrame(
        {
            "uuid": ["GPU-aaaaaaaa-bbbb-cccc"] * 25,
            "node": ["node-2"] * 25,
            "instance": [""] * 25,
            "gpu": ["3"] * 25,
            "namespace": ["ml"] * 25,
            "pod": pods,
            "kernel_time": [0.01] * 25,
        }
    )
    chart = kernel_time_bar(shares)
    scale = chart["encoding"]["color"]["scale"]
    assert sorted(scale["domain"]) == sorted(f"ml/{p}" for p in pods)
    assert len(set(scale["range"])) == len(scale["domain"]) == 25, "no two pods in one colour"
    assert {r["gpu"] for r in data_of(chart)} == {"node-2 GPU 3"}, "no bare UUID on the axis"


def test_mig_labels_wrap_instead_of_being_cut() -> None:
    lines = _wrap("inference/asr-stream-fx5qr9vj7p-kg8fn", 1)
    assert "".join(lines) == "inference/asr-stream-fx5qr9vj7p-kg8fn" and len(lines) > 1
    assert all(len(x) <= MIG_LABEL_CHARS for x in lines)
    assert _wrap("free", 7) == ["free"]


@pytest.mark.parametrize(
    "text",
    ["10000 GPUs", "a None cell", "0.5005807999999999", "gpulens_gpu_info", '{"mig_profile": null}', "NaN"],
)
def test_the_browser_text_rules_fire(text: str) -> None:
    assert text_findings(text, "t") != []


@pytest.mark.parametrize(
    "text",
    [
        "10,000 GPUs",
        "127.0.0.1:47919",
        "00000000:18:00.0",
        "None of the GPUs is idle",
        "gpulens · scrape of 2 exporters",
        "pod-12345-abc",
        "GPU-9692e00a-4d82-50fd",
        "2026-12-02 12:08:28 UTC",
        "3.5 GiB",
    ],
)
def test_the_browser_text_rules_let_people_text_through(text: str) -> None:
    assert text_findings(text, "t") == []


def test_every_driver_reason_and_probe_reads_in_words() -> None:
    """Each clock event reason the exporter can export and each probe has its words (nvidia-smi's
    for the reasons), and none of them reads as a program's name."""
    from dashboard import words
    from exporter.backends.nvml.device import CLOCK_EVENT_REASONS
    from probes.expected import PROBES

    for reason in CLOCK_EVENT_REASONS.values():
        shown = words.clock_event(reason)
        assert reason in words.CLOCK_EVENT_WORDS and "_" not in shown, reason
    assert words.clock_event("sw_power_cap") == "SW Power Cap"
    assert words.clock_event("hw_thermal_slowdown") == "HW Thermal Slowdown"
    for probe in PROBES:
        assert probe in words.PROBE_WORDS and "_" not in words.probe(probe), probe
    assert words.probe("hbm_copy") == "HBM copy (device memory)"


def test_throttling_chart_puts_a_thermal_gpu_in_its_own_row_above_the_power_capped_ones() -> None:
    """One GPU at 100 % HW Thermal Slowdown among 15 power-capped ones: a row (facet) per reason,
    the thermal one first, each GPU its own bar; no raw reason names in the spec's data."""
    from dashboard.figures.health import clock_event_bar

    rows = [("n0", str(i), f"GPU-{i}", "sw_power_cap", 0.9) for i in range(15)]
    rows.append(("n1", "3", "GPU-t", "hw_thermal_slowdown", 1.0))
    events = pd.DataFrame(rows, columns=["node", "gpu", "uuid", "reason", "share"]).assign(instance="")
    spec = clock_event_bar(events)
    assert spec["facet"]["row"]["sort"][0] == "HW Thermal Slowdown", spec["facet"]["row"]["sort"]
    shown = pd.DataFrame(data_of(spec))
    thermal = shown[shown["reason_words"] == "HW Thermal Slowdown"]
    assert thermal["gpu_label"].tolist() == ["n1 GPU 3"] and thermal["share"].tolist() == [1.0]
    assert len(shown) == 16 and set(shown["reason_words"]) == {"HW Thermal Slowdown", "SW Power Cap"}


def test_every_percentage_of_a_table_reads_in_one_style() -> None:
    """A 0..1 ratio column (``percent``), a progress bar of one and a 0..100 column all draw
    ``NN %`` (ui.PERCENT_FORMAT); a ratio's values are scaled once."""
    df = pd.DataFrame({"sm_active": [0.425], "bar": [0.5], "use": [80.0]})
    shown, config = ui.table_frame(
        df,
        {
            "bar": st.column_config.ProgressColumn("Bar", format="percent", min_value=0.0, max_value=1.0),
            "use": st.column_config.ProgressColumn("Use", format="%.0f%%", min_value=0, max_value=100),
        },
    )
    for c in ("sm_active", "bar", "use"):
        assert config[c]["type_config"]["format"] == ui.PERCENT_FORMAT, c
    assert shown["sm_active"].tolist() == [42.5] and shown["bar"].tolist() == [50.0] and shown["use"].tolist() == [80.0]
    assert config["bar"]["type_config"]["max_value"] == 100.0
    assert ui.fmt_percent(0.963) == "96 %" and ui.format_number(0.425, "percent") == "42 %"
