"""The GPU page's table and frames (dashboard/gpu_panels.py): series named in words, counters as
rates, values in the unit on the axis, the header's state of a lost GPU and a true reason where a
GPU has no boundness class; the fixtures' expositions read through the direct-scrape source."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from dashboard import gpu_panels
from dashboard.figures.vega import data_of
from dashboard.frames.series import state_timeline
from dashboard.sources.scrape import ScrapeSource
from dashboard.sources.source import Window
from exporter.render.metrics import BY_NAME

FIX = Path(__file__).parent / "fixtures" / "dashboard"
H200 = (FIX / "h200x8.prom").read_text()
GPU0 = re.search(r'gpulens_gpu_info\{[^}]*gpu="0"[^}]*uuid="([^"]+)"', H200).group(1)  # type: ignore[union-attr]
STEP = 15.0
SNAKE = re.compile(r"\b[a-z0-9]+_[a-z0-9_]+\b")


class _Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def _source(pages: list[str]) -> ScrapeSource:
    """A scrape source that has scraped ``pages`` in turn, one every STEP seconds."""
    clock, queue = _Clock(), list(pages)

    def fetch(_url: str) -> str:
        return queue.pop(0)

    src = ScrapeSource(["http://node-3:9445/metrics"], fetch=fetch, clock=clock, history=720, interval_s=STEP)
    for i in range(len(pages)):
        if i:
            clock.t += STEP
        src.scrape_once()
    return src


def _set(text: str, metric: str, uuid: str, value: float, **labels: str) -> str:
    """``text`` with the sample of ``metric`` on ``uuid`` (and ``labels``) set to ``value``."""
    hits = []

    def edit(m: re.Match[str]) -> str:
        head = m.group(1)
        if f'uuid="{uuid}"' not in head or any(f'{k}="{v}"' not in head for k, v in labels.items()):
            return m.group(0)
        hits.append(head)
        return f"{head} {value!r}"

    out = re.sub(rf"^({re.escape(metric)}\{{[^}}]*\}}) \S+$", edit, text, flags=re.M)
    assert len(hits) == 1, f"{len(hits)} samples of {metric} on {uuid} {labels}"
    return out


def _without(text: str, uuid: str, keep: Callable[[str], bool] = lambda _line: False) -> str:
    """``text`` without the samples of ``uuid`` (but those ``keep`` keeps)."""
    return "\n".join(line for line in text.splitlines() if f'"{uuid}"' not in line or keep(line)) + "\n"


def _series(src: ScrapeSource, uuid: str = GPU0) -> pd.DataFrame:
    return src.device_series(uuid, window=Window(600), step_s=STEP)


def _drawn(series: pd.DataFrame, steps: int = 1) -> dict[str, gpu_panels.Drawn]:
    return {d.panel.title: d for d in gpu_panels.panels(series, steps)}


def _header(src: ScrapeSource, uuid: str = GPU0) -> gpu_panels.Header:
    return gpu_panels.header(uuid, _series(src, uuid), src.instant("gpulens_gpu_up"), src.instant("gpulens_gpu_info"))


# --- the table -----------------------------------------------------------------------------
def test_the_table_agrees_with_the_catalogue_on_counters_and_units() -> None:
    """Each line's counter flag is the catalogue's type; its panel's unit takes the catalogue's base
    unit; a rate per hour is only ever a counter's; no family is both drawn and shown elsewhere."""
    placed: list[str] = []
    for panel in gpu_panels.PANELS:
        assert panel.group in gpu_panels.GROUPS and panel.title and not SNAKE.search(panel.title)
        for line in panel.lines:
            spec = BY_NAME[line.metric]
            assert line.counter == (spec.type == "counter"), line.metric
            assert spec.unit == panel.unit.base, (line.metric, spec.unit, panel.unit)
            assert (panel.unit is gpu_panels.PER_HOUR) == line.counter, line.metric
            assert not line.label or line.label in spec.labels, line.metric
            assert "{}" in line.words or not line.label, line.metric
            placed.append(line.metric)
    assert len(placed) == len(set(placed)), "a family is on one panel"
    assert not set(placed) & set(gpu_panels.ELSEWHERE)


# --- units ---------------------------------------------------------------------------------
def _counting_ecc(n: int) -> list[str]:
    return [_set(H200, "gpulens_gpu_ecc_errors_total", GPU0, float(3 * i), severity="corrected") for i in range(n)]


def test_a_counter_is_drawn_as_a_rate_per_hour_and_summed_in_words() -> None:
    """ECC errors counted 3 a scrape (15 s): 720 an hour on an axis titled per hour, the total in a
    sentence; an error panel where nothing happened is left out."""
    series = _series(_source(_counting_ecc(8)))
    drawn = _drawn(series)
    ecc = drawn["Memory errors (ECC)"]
    corrected = ecc.lines[ecc.lines["series"] == "corrected ECC errors"]
    assert len(corrected) >= 6 and corrected["value"].round(6).eq(720.0).all(), corrected
    assert set(ecc.lines["series"]) == {"corrected ECC errors", "uncorrected ECC errors"}
    spec = gpu_panels.lines_chart(ecc.lines, ecc.panel.unit)
    assert spec["encoding"]["y"]["title"] == "per hour"
    assert "Link errors" not in drawn, "its counters stayed at zero: no chart, a sentence"
    happened, quiet = gpu_panels.errors_words(series)
    assert "21 corrected ECC errors in the range." in happened, happened
    assert "Link errors" in quiet and "Memory errors (ECC)" not in quiet


def test_hertz_are_drawn_as_megahertz() -> None:
    series = _series(_source([H200, H200, H200]))
    clocks = _drawn(series)["Clocks"]
    sm = clocks.lines[clocks.lines["series"] == "SM clock"]["value"]
    assert not sm.empty and sm.eq(1980.0).all(), "1.98e+09 Hz is 1980 MHz"
    spec = gpu_panels.lines_chart(clocks.lines, clocks.panel.unit)
    assert spec["encoding"]["y"]["title"] == "MHz"
    assert {t.get("title") for t in spec["encoding"]["tooltip"]} >= {"MHz"}
    assert set(clocks.lines["series"]) == {"SM clock", "SM clock at most", "memory clock"}


def test_bytes_are_gib_in_the_values_the_axis_and_the_tooltip_alike() -> None:
    series = _series(_source([H200, H200]))
    memory = _drawn(series)["Memory used of its total"]
    used = memory.lines[memory.lines["series"] == "used"]["value"]
    assert not used.empty and used.round(3).eq(48.0).all(), "5.1539607552e+10 bytes is 48 GiB"
    spec = gpu_panels.lines_chart(memory.lines, memory.panel.unit)
    assert spec["encoding"]["y"]["title"] == "GiB"
    assert [t["title"] for t in spec["encoding"]["tooltip"] if t["field"] == "value"] == ["GiB"]
    assert all(r["value"] < 200 for r in data_of(spec)), "no value left in bytes"
    assert not any("bytes" in str(n) for n in memory.lines["series"])


def test_counts_get_whole_number_axes() -> None:
    series = _series(_source([H200, H200]))
    link = _drawn(series)["PCIe link: generation and lanes, now and at most"]
    axis = gpu_panels.lines_chart(link.lines, link.panel.unit)["encoding"]["y"]["axis"]
    assert axis["tickMinStep"] == 1 and axis["format"] == ",d"
    assert gpu_panels.lines_chart(link.lines, gpu_panels.PERCENT)["encoding"]["y"]["axis"].get("tickMinStep") is None


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIX.glob("*.prom")))
def test_every_legend_entry_and_header_field_is_in_words(fixture: str) -> None:
    """Every GPU of every fixture: no metric name, no label name, no snake_case in a legend, a
    strip, a panel title or the header; no ``?`` and no empty value in the header."""
    text = (FIX / fixture).read_text()
    src = _source([text, text, text])
    info = src.instant("gpulens_gpu_info").sort_values("gpu")
    # the first two GPUs and every GPU in MIG mode (the GPUs of a fixture differ little otherwise)
    uuids = list(dict.fromkeys([*info["uuid"][:2], *info.loc[info["mig_mode"] == "enabled", "uuid"]]))
    assert uuids
    for uuid in uuids:
        series = _series(src, uuid)
        drawn = gpu_panels.panels(series)
        names = [str(n) for d in drawn for n in set(d.lines["series"])] + [d.panel.title for d in drawn]
        events = state_timeline(series.assign(value=1.0), "gpulens_gpu_clock_event_active", "reason")
        names += list(gpu_panels.in_words(events, "reason", gpu_panels.CLOCK_EVENT_WORDS)["reason"])
        head = _header(src, uuid)
        names += list(head.facts.values())
        assert names
        for name in names:
            assert name and "gpulens_" not in name and "=" not in name and "?" not in name, (uuid, name)
            assert not SNAKE.search(name), (uuid, name)
        assert head.state == "answering" and not head.lost


def test_a_line_is_named_by_its_label_in_words_and_its_mig_instance() -> None:
    t = [0.0, 15.0, 30.0]

    def rows(metric: str, values: list[float], **labels: object) -> pd.DataFrame:
        return pd.DataFrame({"metric": metric, "timestamp": t, "value": values, "uuid": "GPU-1", **labels})

    series = pd.concat(
        [
            rows("gpulens_probe_efficiency_ratio", [1.0, 0.9, 0.8], probe="hbm_copy"),
            rows("gpulens_probe_efficiency_ratio", [0.5, 0.6, 0.7], probe="h2d"),
            rows("gpulens_gpu_sm_active_ratio", [0.5, 0.6, 0.7], mig_uuid="MIG-abcdefghijkl", mig_profile="3g.71gb"),
            rows("gpulens_gpu_xid_errors_total", [1.0, 1.0, 3.0], xid="79"),
            rows("gpulens_gpu_xid_errors_total", [0.0, 0.0, 0.0], xid=""),  # every GPU's zero series
            rows("gpulens_gpu_new_family_ratio", [0.1, 0.2, 0.3]),
        ],
        ignore_index=True,
    ).sample(frac=1.0, random_state=3)  # rows in no particular order
    drawn = _drawn(series)
    probes = drawn["Probe bandwidth against a healthy GPU of its model"].lines
    assert {n: sorted(g["value"]) for n, g in probes.groupby("series")} == {
        "HBM copy (device memory)": [0.8, 0.9, 1.0],
        "Host to device (PCIe)": [0.5, 0.6, 0.7],
    }
    assert set(drawn["How busy it is"].lines["series"]) == {"SM active [3g.71gb MIG-abcdefgh]"}
    xid = drawn["Xid errors"].lines.sort_values("timestamp")
    assert set(xid["series"]) == {"Xid 79", "Xid errors: none"}, "the zero series in words, not 'Xid '"
    assert xid[xid["series"] == "Xid 79"]["value"].tolist() == [0.0, 2 / 15 * 3600]
    assert set(drawn["New family ratio"].lines["series"]) == {"new family ratio"}, "a new family, in words"


# --- the header, lost GPUs and true empty messages --------------------------------------------
def _lost(text: str, uuid: str) -> str:
    """What the exporter serves for a GPU it lists but cannot read: gpulens_gpu_up 0, no identity,
    no readings (the allocation is the kubelet's, kept)."""
    kept = _without(text, uuid, keep=lambda line: line.startswith(("gpulens_gpu_up{", "gpulens_pod_gpu_allocation{")))
    return _set(kept, "gpulens_gpu_up", uuid, 0.0)


def test_a_held_gpus_header_names_its_holder_owner_sharing_and_class_in_words() -> None:
    head = _header(_source([H200, H200]))
    assert head.model == "NVIDIA H200" and head.node == "h200x8"  # the exporter's node label
    # short facts: the pod, its owner apart, the node and index (the holder read "ns/pod (CronJob x)")
    assert head.holder == "research/embedding-reindex-29484576-p4sbd"
    assert head.owner == "CronJob/embedding-reindex"
    assert (head.facts["Node"], head.facts["GPU"]) == ("h200x8", "0")
    assert list(head.facts) == ["Node", "GPU", "Model", "State", "Held by", "Owner", "Class now", "Sharing"]
    assert head.sharing.startswith("exclusive")
    assert head.boundness == gpu_panels.CLASS_WORDS["memory"]
    assert not head.lost and head.banner == ""
    unheld = _without(H200, GPU0, keep=lambda line: not line.startswith("gpulens_pod_"))
    assert _header(_source([unheld, unheld])).holder == "no pod holds it now"


def test_a_lost_gpus_header_says_lost_since_when_and_no_clock_event_box() -> None:
    src = _source([H200, H200, H200, _lost(H200, GPU0), _lost(H200, GPU0)])
    head = _header(src)
    assert head.lost and head.state == "LOST"
    assert "cannot read it" in head.banner and "it last answered at " in head.banner
    assert head.model == "NVIDIA H200", "the model from the range, while it answered"
    assert head.holder.startswith("research/embedding-reindex"), "the kubelet still says who holds it"
    assert "nothing is known while it is lost" in head.boundness
    assert "needs GPM" not in head.boundness and "?" not in " ".join(head.facts.values())
    # a GPU gone from the exports since a time in the range: LOST, and since when
    gone = _without(H200, GPU0)
    head = _header(_source([H200, H200, gone, gone]))
    assert head.lost and "not exported now: it was last seen at 2023-11-14 22:13:35 UTC" in head.banner
    assert head.holder.startswith("not known")


def test_an_h200_without_a_class_says_none_was_sent_never_that_it_needs_gpm() -> None:
    no_class = _without(H200, GPU0, keep=lambda line: not line.startswith("gpulens_gpu_boundness{"))
    src = _source([no_class, no_class])
    series = _series(src)
    assert state_timeline(series, "gpulens_gpu_boundness", "class").empty
    ident = gpu_panels.identity(series, src.instant("gpulens_gpu_info"))
    words = gpu_panels.no_class_words(series, ident, "answering")
    assert "sent no boundness class" in words and "GPM" not in words, words
    head = _header(src)
    assert head.boundness.startswith("none: ") and "GPM" not in head.boundness
    # the same without its analysis series: its compute capability (9.0) says it has GPM
    bare = series[series["metric"] != "gpulens_gpu_analysis_info"]
    assert "sent no boundness class" in gpu_panels.no_class_words(bare, ident, "answering")
    # a pre-Hopper GPU (an A100, coarse classes from NVML) does say it has no GPM
    a100 = bare.assign(name="NVIDIA A100-SXM4-80GB")
    old = {**ident, "name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    assert "has no GPM (before Hopper)" in gpu_panels.no_class_words(a100, old, "answering")
    assert gpu_panels.has_gpm_hardware({"name": "NVIDIA H100 80GB HBM3"}) is True
    assert gpu_panels.has_gpm_hardware({"name": "Tesla V100-SXM2-32GB"}) is False


def test_nvlinks_read_as_a_sentence_of_links_up_down_and_peers() -> None:
    def rows(states: dict[int, float], peers: dict[str, float], t: float = 2.0) -> list[dict[str, object]]:
        out: list[dict[str, object]] = [
            {"metric": "gpulens_gpu_nvlink_link_active", "timestamp": t, "value": v, "link": str(k)}
            for k, v in states.items()
        ]
        return out + [
            {"metric": "gpulens_gpu_nvlink_peer_links", "timestamp": t, "value": v, "peer_gpu": g}
            for g, v in peers.items()
        ]

    # An HGX GPU whose links 5 and 11 dropped after the range began: the newest readings count.
    before = rows(dict.fromkeys(range(18), 1.0), {str(i): 18.0 for i in range(1, 8)}, t=1.0)
    now = rows({i: 0.0 if i in (5, 11) else 1.0 for i in range(18)}, {str(i): 16.0 for i in range(1, 8)})
    assert gpu_panels.nvlink_words(pd.DataFrame(before + now)) == (
        "NVLink: 16 of 18 links up; links 5 and 11 are down. It reaches GPUs 1, 2, 3, 4, 5, 6 and 7 over 16 "
        "links each (NV16).",
        True,
    )
    assert gpu_panels.nvlink_words(pd.DataFrame(rows({0: 1.0, 1: 0.0}, {"10": 1.0, "2": 1.0}))) == (
        "NVLink: 1 of 2 links up; link 1 is down. It reaches GPUs 2 and 10 over 1 link each (NV1).",
        True,
    )
    assert gpu_panels.nvlink_words(pd.DataFrame(before)) == (
        "NVLink: 18 of 18 links up. It reaches GPUs 1, 2, 3, 4, 5, 6 and 7 over 18 links each (NV18).",
        False,
    )
    assert gpu_panels.nvlink_words(pd.DataFrame(rows({0: 1.0}, {}))) == (
        "NVLink: 1 of 1 links up. It reaches no other GPU of its node over NVLink.",
        False,
    )
    assert gpu_panels.nvlink_words(pd.DataFrame(columns=["metric", "timestamp", "value"])) == ("", False)


MIG = (FIX / "mig.prom").read_text()


def test_a_mig_gpus_header_is_short_facts_and_its_instances_a_row_each() -> None:
    """The MIG node's GPU of seven 1g instances: the header says how many pods and counts the
    classes (it read a run-on "ns/pod (Deployment x) on 1g.18gb MIG-…, …" and "1g.18gb MIG-…: …;
    …"), and the devices table has a row per instance with its pod, owner and class now."""
    src = _source([MIG, MIG])
    info = src.instant("gpulens_gpu_info")
    mig_gpus = info.loc[info["mig_mode"] == "enabled"].sort_values("gpu")
    uuid = str(mig_gpus["uuid"].iloc[0])
    head = _header(src, uuid)
    for value in head.facts.values():
        assert "MIG-" not in value and len(value) <= 80, value
    assert head.holder.endswith("pods, by instance below"), head.holder
    assert head.boundness.split(":")[0].endswith("instances"), head.boundness
    leaves = gpu_panels.leaves_now(_series(src, uuid))
    mig = src.instant("gpulens_mig_instance_info")
    assert len(leaves) == (mig["uuid"] == uuid).sum()
    assert list(leaves.columns) == ["device", "pods", "owners", "class"]
    assert "free" in set(leaves["pods"]) and all(d.startswith("1g.") for d in leaves["device"])
    # a whole GPU held by one pod has no table: the header says it all
    h200 = _source([H200, H200])
    assert gpu_panels.leaves_now(_series(h200)).empty


def test_a_mig_gpus_panels_are_small_multiples_a_chart_per_instance() -> None:
    """A MIG GPU's "How busy it is": a chart per instance (the GPU's own series first), each with
    its few lines in the same colours, never every instance's lines in one chart with a cut legend."""
    src = _source([MIG, MIG])
    info = src.instant("gpulens_gpu_info")
    uuid = str(info.loc[info["mig_mode"] == "enabled"].sort_values("gpu")["uuid"].iloc[0])
    busy = _drawn(_series(src, uuid))["How busy it is"]
    small = gpu_panels.multiples(busy.lines)
    assert len(small) >= 7, [leaf for leaf, _ in small]
    leaves = [leaf for leaf, _ in small]
    assert gpu_panels.WHOLE_GPU not in leaves or leaves[0] == gpu_panels.WHOLE_GPU, "the GPU's own series first"
    names = list(dict.fromkeys(busy.lines["line"]))
    assert len(names) <= 8
    for leaf, lines in small:
        assert set(lines["series"]) <= set(names) and "MIG-" not in " ".join(set(lines["series"])), leaf
        chart = gpu_panels.lines_chart(lines, busy.panel.unit, names=names, height=130)
        assert chart["encoding"]["color"]["scale"]["domain"] == names, "a line keeps its colour in every chart"
        assert chart["height"] == 130
    # a whole GPU's panel stays one chart
    assert gpu_panels.multiples(_drawn(_series(_source([H200, H200])))["How busy it is"].lines) == []
