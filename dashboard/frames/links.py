"""PCIe and NVLink: which series hold a link's bytes, rates and capacity (bytes/s, ratios 0..1),
leaves moving data while their SMs idle, the busiest links, and the GPU page's links section."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

from dashboard import definitions
from dashboard.frames.columns import LEAF, col, with_cols
from dashboard.frames.series import counter_rate
from exporter.model import LINKS, NVLINK, PCIE
from exporter.render.metrics import BY_NAME

TRANSFER_CLASS = definitions.TRANSFER_CLASS
"""The class of a leaf whose links are busy while its SMs idle or wait: it is moving data (a data
loader copying host memory to the GPU)."""


LINK_NAMES: dict[str, str] = {PCIE: "PCIe", NVLINK: "NVLink"}


DIRECTION_NAMES: dict[str, str] = {"rx": "in", "tx": "out"}
"""A link's directions in words: ``rx`` is into the GPU (host to GPU over PCIe, from its peers
over NVLink), ``tx`` out of it."""


LINK_SOURCE_NAMES: dict[str, str] = {
    "counter": "NVML byte counters",
    "gpm": "GPM counters, each cycle",
    "sampled": "NVML samples (20 ms windows)",
}
"""Where the exporter read a leaf's link bytes (``gpulens_gpu_link_info{source}``), in words."""


def _catalogued(name: str) -> str:
    """``name`` as the metric catalogue has it: importing fails if the exporter stops serving it."""
    return BY_NAME[name].name


LINK_COUNTERS: dict[tuple[str, str], str] = {
    (link, d): _catalogued(f"gpulens_gpu_{link}_{d}_bytes_total") for link in LINKS for d in DIRECTION_NAMES
}
"""(link, direction) -> the leaf's byte counter (rate() gives bytes per second)."""


LINK_GAUGES: dict[tuple[str, str], str] = {
    (link, d): _catalogued(f"gpulens_gpu_{link}_{d}_bytes_per_second") for link in LINKS for d in DIRECTION_NAMES
}
"""(link, direction) -> the physical GPU's sampled throughput: what an exporter without the
counters has (a 20 ms window per cycle), drawn only where the counters are missing."""


LINK_UTILIZATION: dict[str, str] = {link: _catalogued(f"gpulens_gpu_{link}_utilization_ratio") for link in LINKS}


LINK_CAPACITY: dict[str, str] = {link: _catalogued(f"gpulens_gpu_{link}_capacity_bytes_per_second") for link in LINKS}


LINK_INFO = _catalogued("gpulens_gpu_link_info")


TRANSFER_ACTIVE = _catalogued("gpulens_gpu_transfer_active_ratio")


def _labelled(df: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """``df`` with the labels ``names`` present, ``""`` where absent or missing (a frame put
    together from sources that lack a label)."""
    out = with_cols(df, names)
    return out.assign(**{n: out[n].fillna("") for n in names})


def link_column(link: str, direction: str | None = None) -> str:
    """The column of a link's utilisation (``pcie``) or of its throughput one way
    (``pcie_in_bytes_per_second``) in the tables below."""
    return link if direction is None else f"{link}_{DIRECTION_NAMES[direction]}_bytes_per_second"


def leaf_links(
    leaves: pd.DataFrame,
    utilization: Mapping[str, pd.DataFrame],
    throughput: Mapping[tuple[str, str], pd.DataFrame],
) -> pd.DataFrame:
    """``leaves`` with each link's utilisation (``utilization``: link -> a value per leaf, 0..1)
    and throughput each way (``throughput``: (link, direction) -> bytes/s per leaf), in the
    columns :func:`link_column` names; NaN where unmeasured."""
    out = with_cols(leaves, LEAF)
    for link in LINKS:
        parts = [(link_column(link), utilization.get(link))]
        parts += [(link_column(link, d), throughput.get((link, d))) for d in DIRECTION_NAMES]
        for column, df in parts:
            if df is None or df.empty:
                out[column] = math.nan
                continue
            values = with_cols(df, LEAF).groupby(list(LEAF), as_index=False)["value"].max()
            out = out.merge(values.rename(columns={"value": column}), on=list(LEAF), how="left")
    return out


def per_second(moved: pd.DataFrame, seconds: float) -> pd.DataFrame:
    """Bytes moved over ``seconds`` (a counter's increase) as bytes per second."""
    return moved.assign(value=moved["value"] / max(seconds, 1e-9)) if not moved.empty else moved


def latest(series: pd.DataFrame) -> pd.DataFrame:
    """Each series' newest point (its labels and value, without the timestamp)."""
    if series.empty:
        return series
    labels = [c for c in series.columns if c not in ("timestamp", "value")]
    newest = series.sort_values("timestamp", kind="stable")
    newest = newest.groupby(labels, dropna=False, sort=False).tail(1) if labels else newest.tail(1)
    return newest.drop(columns=["timestamp"]).reset_index(drop=True)


def measured_links(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` without the link columns no row has a value for (a node without NVLink)."""
    columns = [link_column(link, d) for link in LINKS for d in (None, *DIRECTION_NAMES)]
    return df.drop(columns=[c for c in columns if c in df.columns and df[c].isna().all()])


def leaves_in_class(classes: pd.DataFrame, cls: str) -> pd.DataFrame:
    """The leaves whose current class (``current_state`` rows of gpulens_gpu_boundness) is ``cls``:
    node, instance, gpu, uuid, mig_uuid, mig_profile."""
    cols = ["node", "instance", "gpu", *LEAF, "mig_profile"]
    if classes.empty or "class" not in classes.columns:
        return pd.DataFrame(columns=cols)
    now = with_cols(classes, [*cols, "class"])
    now = now[(now["class"] == cls) & (now["value"] >= 0.5)]
    return now[cols].drop_duplicates(list(LEAF)).reset_index(drop=True)


def busy_but_sm_idle(util: pd.DataFrame, idle: pd.DataFrame, moving: pd.DataFrame) -> pd.DataFrame:
    """GPUs nvidia-smi calls busy (GPU-Util now at least the idle definition's kernel level) whose
    SMs idled over its window (``idle``'s ``sm_mean``, their busiest MIG instance), less those
    ``moving`` data (class transfer: the copy engines, not kernels, keep GPU-Util up): what is
    left is launch-bound or polling. node, instance, gpu, uuid, gpu_util, sm_active."""
    cols = ["node", "instance", "gpu", "uuid", "gpu_util", "sm_active"]
    if util.empty or idle.empty:
        return pd.DataFrame(columns=cols)
    sm = with_cols(idle, ["uuid"]).groupby("uuid", as_index=False)["sm_mean"].max()
    sm = sm.rename(columns={"sm_mean": "sm_active"})
    both = with_cols(util, ["node", "instance", "gpu", "uuid"]).merge(sm, on="uuid")
    both = both[
        (both["value"] >= definitions.KERNELS_UTIL_AT_LEAST) & (both["sm_active"] < definitions.IDLE_SM_ACTIVE_BELOW)
    ]
    both = both[~both["uuid"].isin(set(col(moving, "uuid")))]
    return both.rename(columns={"value": "gpu_util"})[cols].reset_index(drop=True)


def _where(df: pd.DataFrame) -> pd.Series:
    """Each row's node, or its exporter ``instance`` where Prometheus adds no node label."""
    node, instance = col(df, "node"), col(df, "instance")
    return node.where(node != "", instance)


def leaf_words(mig_uuid: object, mig_profile: object) -> str:
    """A leaf in words: ``GPU``, or a MIG instance as ``3g.71gb MIG-abcdefgh``."""
    return f"{mig_profile or 'MIG'} {str(mig_uuid)[:12]}" if mig_uuid else "GPU"


def outbound(lines: pd.DataFrame) -> list[str]:
    """The series of link lines (:func:`link_totals`, :func:`link_panels`) that are a link's
    outbound direction (drawn dashed)."""
    out = f" {DIRECTION_NAMES['tx']}"
    return [n for n in dict.fromkeys(col(lines, "series")) if str(n).endswith(out) or f"{out} [" in str(n)]


def link_totals(rates: Mapping[tuple[str, str], pd.DataFrame]) -> pd.DataFrame:
    """The throughput of every leaf in view together, per link and direction over time
    (``rates``: (link, direction) -> bytes/s summed, timestamp and value): timestamp, series
    (``PCIe in``...), value."""
    parts = [
        pd.DataFrame(
            {"timestamp": df["timestamp"], "series": f"{LINK_NAMES[link]} {DIRECTION_NAMES[d]}", "value": df["value"]}
        )
        for (link, d), df in rates.items()
        if not df.empty
    ]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["timestamp", "series", "value"])


def busiest_links(active: pd.DataFrame, top: int, at_least: float) -> pd.DataFrame:
    """The ``top`` leaves whose busiest link was the most utilised over the range, mean at least
    ``at_least`` (``active``: gpulens_gpu_transfer_active_ratio over time, a row per leaf and
    step): timestamp, series (``node GPU 3``, a MIG instance with its profile), value."""
    cols = ["timestamp", "series", "value"]
    if active.empty:
        return pd.DataFrame(columns=cols)
    df = with_cols(active, ["node", "instance", "gpu", *LEAF, "mig_profile"])
    means = df.groupby(list(LEAF))["value"].mean()
    keep = means[means >= at_least].sort_values(ascending=False).head(top)
    if keep.empty:
        return pd.DataFrame(columns=cols)
    df = df.set_index(list(LEAF)).loc[list(keep.index)].reset_index()
    names = [
        f"{w} GPU {g}" + (f" {leaf_words(m, p)}" if m else "")
        for w, g, m, p in zip(_where(df), df["gpu"], df["mig_uuid"], df["mig_profile"], strict=True)
    ]
    return pd.DataFrame({"timestamp": df["timestamp"], "series": names, "value": df["value"]})[cols]


def link_panels(series: pd.DataFrame, steps: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The GPU page's links from ``device_series`` rows: (throughput, utilisation), each a frame of
    timestamp, series (``PCIe in``, ``NVLink out``; a MIG instance's with its profile) and value.
    Throughput is bytes/s, the rate of each leaf's byte counters over the last ``steps`` steps
    (sources.source.rate_steps: a step at a scrape interval's length reads a scrape twice, then none,
    every so often), or the physical GPU's sampled throughput where the exporter has no counters;
    utilisation is 0..1."""
    cols = ["timestamp", "series", "value"]
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=cols), pd.DataFrame(columns=cols)
    df = _labelled(series, ["metric", *LEAF, "mig_profile"])
    counted = df["metric"].isin(set(LINK_COUNTERS.values())).any()
    throughput = []
    for (link, d), metric in (LINK_COUNTERS if counted else LINK_GAUGES).items():
        rows = df[df["metric"] == metric].drop(columns=["metric"]).dropna(axis=1, how="all")
        if counted:
            rows = counter_rate(with_cols(rows, [*LEAF, "mig_profile"]), steps=steps)
        if rows.empty:
            continue
        throughput.append(_link_lines(rows, f"{LINK_NAMES[link]} {DIRECTION_NAMES[d]}"))
    utilization = [
        _link_lines(df[df["metric"] == metric], LINK_NAMES[link])
        for link, metric in LINK_UTILIZATION.items()
        if (df["metric"] == metric).any()
    ]
    return (
        pd.concat(throughput, ignore_index=True) if throughput else pd.DataFrame(columns=cols),
        pd.concat(utilization, ignore_index=True) if utilization else pd.DataFrame(columns=cols),
    )


def _link_lines(rows: pd.DataFrame, name: str) -> pd.DataFrame:
    """``rows`` as lines named ``name``, a MIG instance's with its profile and UUID."""
    rows = with_cols(rows, [*LEAF, "mig_profile"])
    leaves = zip(rows["mig_uuid"], rows["mig_profile"], strict=True)
    names = [name + (f" [{leaf_words(m, p)}]" if m else "") for m, p in leaves]
    return pd.DataFrame({"timestamp": rows["timestamp"], "series": names, "value": rows["value"]})


def link_table(series: pd.DataFrame) -> pd.DataFrame:
    """Per leaf and link of ``device_series`` rows, what the range shows: device (``GPU`` or the
    MIG instance), link (``PCIe``), capacity each way (bytes/s, the newest), where the bytes come
    from (in words), the mean throughput in and out (bytes/s: the counters' growth over the time
    they cover) and the mean and peak utilisation (0..1)."""
    cols = ["device", "link", "capacity_bytes_per_second", "measured_by", "in_bytes_per_second",
            "out_bytes_per_second", "mean_utilization", "peak_utilization"]  # fmt: skip
    if series.empty or "metric" not in series.columns:
        return pd.DataFrame(columns=cols)
    df = _labelled(series, ["metric", *LEAF, "mig_profile", "link", "source"]).dropna(subset=["value"])
    out = []
    linked = {LINK_INFO, *LINK_CAPACITY.values(), *LINK_UTILIZATION.values(), *LINK_COUNTERS.values()}
    leaves = df[df["metric"].isin(linked)][[*LEAF, "mig_profile"]]
    for (uuid, mig), leaf in leaves.groupby(list(LEAF), sort=True):
        of_leaf = df[(df["uuid"] == uuid) & (df["mig_uuid"] == mig)]
        for link in LINKS:
            row = _link_row(of_leaf, link)
            if row is not None:
                out.append({"device": leaf_words(mig, leaf["mig_profile"].iloc[0]), "link": LINK_NAMES[link], **row})
    return pd.DataFrame(out, columns=cols)


def _link_row(df: pd.DataFrame, link: str) -> dict[str, object] | None:
    """One leaf's :func:`link_table` values for ``link``; None when the leaf has no such series."""
    info = df[(df["metric"] == LINK_INFO) & (df["link"] == link)]
    capacity = df[df["metric"] == LINK_CAPACITY[link]].sort_values("timestamp")
    util = df[df["metric"] == LINK_UTILIZATION[link]]["value"]
    moved = {d: _mean_rate(df[df["metric"] == LINK_COUNTERS[(link, d)]]) for d in DIRECTION_NAMES}
    if info.empty and capacity.empty and util.empty and all(math.isnan(v) for v in moved.values()):
        return None
    source = str(info.sort_values("timestamp")["source"].iloc[-1]) if not info.empty else ""
    return {
        "capacity_bytes_per_second": float(capacity["value"].iloc[-1]) if not capacity.empty else math.nan,
        "measured_by": LINK_SOURCE_NAMES.get(source, source),
        "in_bytes_per_second": moved["rx"],
        "out_bytes_per_second": moved["tx"],
        "mean_utilization": float(util.mean()) if not util.empty else math.nan,
        "peak_utilization": float(util.max()) if not util.empty else math.nan,
    }


def _mean_rate(counter: pd.DataFrame) -> float:
    """A counter's mean rate over the time its points span (a drop is a reset, as in
    :func:`counter_rate`); NaN with fewer than two points."""
    points = counter.sort_values("timestamp")
    values, times = points["value"].to_numpy(dtype=float), points["timestamp"].to_numpy(dtype=float)
    if len(values) < 2 or times[-1] <= times[0]:
        return math.nan
    steps = values[1:] - values[:-1]
    grown = steps.clip(min=0.0) + values[1:] * (steps < 0)
    return float(grown.sum() / (times[-1] - times[0]))
