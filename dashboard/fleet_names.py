"""The names behind the Fleet page's counts: which devices are allocated but idle (where, whose, for
how long) and which GPUs run slow (clocks held down), as tables people read.

Pure pandas over the sources' frames (no queries, no Streamlit calls); durations are written as the
rest of the dashboard writes them (:func:`dashboard.ui.fmt_duration`). Idle, in use and the
slowdown events are the ones of dashboard/definitions.py and dashboard/sources/source.py, never redefined:
the allocated-but-idle devices listed here are exactly those :func:`frames.fleet.fleet_counts` counts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import pandas as pd

from dashboard import jobs, words
from dashboard.definitions import LEAF
from dashboard.frames.columns import col, with_cols
from dashboard.frames.jobs import keyed
from dashboard.sources.source import SLOWDOWN_REASONS
from dashboard.ui import fmt_duration

ROWS_SHOWN = 10
"""Most rows each Fleet table shows; the rest are counted and left to the Workloads and Health pages."""
NAMES_SHOWN = 3
"""Most pods (or owners) named in one cell; more read ``+N more``."""
CLOCK_HELD_BELOW = 0.90
"""SM clock over its maximum (0..1, mean over the idle definition's window) under which a GPU in
use is slow, whatever held it there (a power cap, an application clock set low, a clock the driver
would not raise). Only GPUs in use count: an idle GPU lowers its clocks by design. Above it, a
power cap is normal: a busy H200 at its power limit runs at 97-99 % of its maximum clock."""
PEERS_GAP_AT_LEAST = 0.05
"""How far (0..1 of the maximum, absolute) a GPU in use runs below the median SM clock ratio of
its peers (the other GPUs of its model in use in view, at least ``PEERS_AT_LEAST``) to be slow."""
PEERS_AT_LEAST = 2
FAULT_REASONS: tuple[str, ...] = tuple(r for r in SLOWDOWN_REASONS if r != "sw_power_cap")
"""Clock events that are a fault, not a GPU working at its limit: thermal, power brake, hardware
slowdown. A GPU one of them held down is slow in any state (it says the cooling or the board
failed); the power cap alone is not."""
WHOLE_RANGE_SLACK = 0.05
"""Share of the range by which an allocation seen first after the range's start still counts as
held since the start (the activity's first step lies a step after it): the Workloads page's
``frames.fleet.idle_allocations`` allows the same."""
NO_HISTORY = "no history yet"
"""The idle-for text of a device the source has no allocation history for (a first scrape)."""
NO_POD = "no pod (free)"
"""The pod column of a GPU that no pod holds."""
BARE_POD_OWNER = "none (bare pod)"
"""The owner column of a pod no controller owns."""
IDLE_CLOCK = "idle now"
"""The SM clock column of an idle GPU: its clocks are low by design, not slow."""
APPLICATION_CLOCKS = "applications_clocks_setting"
"""The clock event of an application clock set by the operator (not throttling, but a GPU held at
it is slower than its maximum)."""

IDLE_COLUMNS: tuple[str, ...] = (
    "node",
    "gpu",
    "pods",
    "owners",
    "idle_for",
    "idle_seconds",
    "whole_range",
    "sm_active",
    "uuid",
    "mig_uuid",
)
"""Columns of :func:`allocated_idle`."""
SLOW_COLUMNS: tuple[str, ...] = ("node", "gpu", "pods", "owners", "why", "sm_clock", "sm_clock_ratio", "uuid")
"""Columns of :func:`slow_gpus`."""


def _names(values: Iterable[str]) -> str:
    """Distinct ``values`` sorted and joined with ", ", at most NAMES_SHOWN of them then ``+N more``."""
    distinct = sorted({v for v in values if v})
    shown = ", ".join(distinct[:NAMES_SHOWN])
    return f"{shown} +{len(distinct) - NAMES_SHOWN} more" if len(distinct) > NAMES_SHOWN else shown


def _owner(kind: object, name: object) -> str:
    """A pod's owner workload as ``Kind/name``; BARE_POD_OWNER where no controller owns it."""
    kind, name = (v if isinstance(v, str) else "" for v in (kind, name))
    if not name or kind == jobs.BARE_POD_KIND:
        return BARE_POD_OWNER
    return f"{kind}/{name}" if kind else name


def holders(allocation: pd.DataFrame, keys: Iterable[str] = LEAF) -> pd.DataFrame:
    """Who holds each device (``keys``: a leaf by default, ``("uuid",)`` for a physical GPU with any
    of its MIG instances): ``pods`` (``namespace/pod``) and ``owners`` (``Kind/name``), each
    :func:`_names`-joined."""
    keys = list(keys)
    if allocation.empty:
        return pd.DataFrame(columns=[*keys, "pods", "owners"])
    a = with_cols(allocation, [*keys, "namespace", "pod", "workload_kind", "workload"])
    # one pass over the rows in plain Python: a groupby with a Python aggregation is a second at 10,000 leaves
    pods: dict[tuple[str, ...], set[str]] = {}
    owners: dict[tuple[str, ...], set[str]] = {}
    rows = zip(
        zip(*(a[k].astype(str).tolist() for k in keys), strict=True),
        *(a[c].tolist() for c in ("namespace", "pod", "workload_kind", "workload")),
        strict=True,
    )
    for key, ns, pod, kind, name in rows:
        pods.setdefault(key, set()).add(f"{ns}/{pod}")
        owners.setdefault(key, set()).add(_owner(kind, name))
    out = pd.DataFrame(list(pods), columns=keys)
    out["pods"] = [_names(v) for v in pods.values()]
    out["owners"] = [_names(owners[k]) for k in pods]
    return out[[*keys, "pods", "owners"]]


def with_holders(gpus: pd.DataFrame, allocation: pd.DataFrame) -> pd.DataFrame:
    """``gpus`` (rows with a physical GPU's ``uuid``) with ``pods`` and ``owners`` of every pod
    holding it or one of its MIG instances (:func:`holders` by uuid), NO_POD and ``none: free``
    where none does: every GPU row names who holds it."""
    out = gpus.drop(columns=[c for c in ("pods", "owners") if c in gpus.columns])
    out = out.merge(holders(allocation, ["uuid"]), on="uuid", how="left")
    out["pods"] = out["pods"].fillna("").replace("", NO_POD)
    out["owners"] = out["owners"].fillna("").replace("", "none: free")
    return out


def places(info: pd.DataFrame, mig_info: pd.DataFrame) -> pd.DataFrame:
    """Where each leaf is: uuid, mig_uuid, node (its node, else its exporter), gpu (the index on
    the node) and ``device`` in words (:func:`device_words`), from gpulens_gpu_info and
    gpulens_mig_instance_info; every whole GPU and every MIG instance gets a row."""
    g = with_cols(info, ["uuid", "gpu", "node", "instance"]).drop_duplicates("uuid")
    g = g.assign(node=col(g, "node").where(g["node"] != "", g["instance"]))
    whole = g.assign(mig_uuid="", mig_profile="", gpu_instance_id="")
    m = with_cols(mig_info, ["uuid", "mig_uuid", "mig_profile", "gpu_instance_id"])
    m = m[m["mig_uuid"] != ""].drop_duplicates(list(LEAF))[["uuid", "mig_uuid", "mig_profile", "gpu_instance_id"]]
    parts = m.merge(g[["uuid", "gpu", "node"]], on="uuid", how="left")
    out = pd.concat([whole[[*LEAF, "node", "gpu", "mig_profile", "gpu_instance_id"]], parts], ignore_index=True)
    out = out.fillna("").astype(str)
    # device_words, column-wise (a fleet has tens of thousands of leaves)
    text = ("GPU " + out["gpu"]).where(out["gpu"] != "", "GPU (index not reported)")
    instance = (", instance " + out["gpu_instance_id"]).where(out["gpu_instance_id"] != "", "")
    profile = out["mig_profile"].where(out["mig_profile"] != "", "instance")
    out["device"] = text.where(out["mig_uuid"] == "", text + " · MIG " + profile + instance)
    return out[[*LEAF, "node", "gpu", "device"]]


def device_words(gpu: object, mig_uuid: object = "", mig_profile: object = "", gpu_instance_id: object = "") -> str:
    """A leaf as people name it: ``GPU 3``, or a MIG instance ``GPU 3 · MIG 3g.71gb, instance 2``;
    ``GPU (index not reported)`` where the GPU's index is unknown."""
    text = f"GPU {gpu}" if str(gpu or "") else "GPU (index not reported)"
    if not str(mig_uuid or ""):
        return text
    instance = f", instance {gpu_instance_id}" if str(gpu_instance_id or "") else ""
    return f"{text} · MIG {mig_profile or 'instance'}{instance}"


NO_NODE = "node not reported"
"""The node column of a device that neither gpulens_gpu_info nor its allocation places."""


def _placed(df: pd.DataFrame, where: pd.DataFrame, allocation: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``df`` with node and gpu (the device in words) joined from ``where`` (:func:`places`) on
    ``keys``, and ``_i`` (the GPU's index as a number, for sorting); a device gpulens_gpu_info does
    not list takes its node from its allocation."""
    placed = where.drop_duplicates(keys)[[*keys, "node", "device", "gpu"]].rename(columns={"gpu": "_i"})
    out = df.merge(placed, on=keys, how="left")
    a = with_cols(allocation, [*keys, "node", "instance"])
    a = a.assign(_at=a["node"].where(a["node"] != "", a["instance"]))
    out = out.merge(a[a["_at"] != ""].drop_duplicates(keys)[[*keys, "_at"]], on=keys, how="left")
    node = out["node"].where(out["node"].notna() & (out["node"] != ""), out["_at"])
    unplaced = device_words("", "")
    mig_unplaced = device_words("", "MIG", "")
    gpu = out["device"].where(
        out["device"].notna(), col(out, "mig_uuid").map(lambda m: mig_unplaced if m else unplaced)
    )
    return out.assign(
        node=node.fillna(NO_NODE).replace("", NO_NODE), gpu=gpu, _i=pd.to_numeric(out["_i"], errors="coerce")
    ).drop(columns=["device", "_at"])


def idle_for_words(idle_seconds: float, whole_range: bool, since_allocated: bool, window_s: float) -> str:
    """How long a device has been idle, no more precise than the history allows: ``12m 30s`` since
    its last busy step; ``whole range (≥ 15m 00s)`` when it was idle at every step of the range;
    ``7m 00s, since allocated`` when it was never busy since its pod got it within the range;
    NO_HISTORY when the source has no history of it, or only the present moment's."""
    if whole_range:
        return f"whole range (≥ {fmt_duration(window_s)})"
    if idle_seconds != idle_seconds or (since_allocated and idle_seconds < 1.0):
        return NO_HISTORY  # none, or its first step is the range's last: a first scrape
    return f"{fmt_duration(idle_seconds)}, since allocated" if since_allocated else fmt_duration(idle_seconds)


def allocated_idle(
    info: pd.DataFrame,
    mig_info: pd.DataFrame,
    allocation: pd.DataFrame,
    idle: pd.DataFrame,
    activity: pd.DataFrame,
    *,
    now: float,
    window_s: float,
) -> pd.DataFrame:
    """The devices allocated now whose leaf is idle now (dashboard/definitions.py; exactly the
    devices :func:`frames.fleet.fleet_counts` counts as ``allocated_idle``), one row per leaf
    (IDLE_COLUMNS), the longest idle first.

    ``node``, ``gpu`` (the device in words), ``pods`` and ``owners`` holding it; ``idle_seconds``:
    ``now`` (Unix s) less the later of its last busy step in the range and the first step its
    current holders held it (``activity``: MetricSource.idle_since, or allocation_activity, over the range of
    ``window_s`` seconds), NaN without history; ``whole_range``: never busy and held since the
    range's start, so idle at least ``window_s``; ``idle_for``: :func:`idle_for_words`;
    ``sm_active``: its mean activity over the idle definition's window (0..1)."""
    if allocation.empty or idle.empty:
        return pd.DataFrame(columns=list(IDLE_COLUMNS))
    verdict = with_cols(idle, [*LEAF, "sm_mean"])
    verdict = verdict[verdict["value"] >= 0.5].drop_duplicates(list(LEAF))[[*LEAF, "sm_mean"]]
    # only the idle leaves' allocations, named (a fleet holds thousands; a few are idle)
    allocation = with_cols(allocation, LEAF).merge(verdict[list(LEAF)], on=list(LEAF), how="inner")
    held = holders(allocation)
    out = held.merge(verdict.rename(columns={"sm_mean": "sm_active"}), on=list(LEAF), how="inner")
    if out.empty:
        return pd.DataFrame(columns=list(IDLE_COLUMNS))
    # the history of the current holders only (a pod that held the leaf earlier in the range is gone)
    pod_keys = ["namespace", "pod", "container", *LEAF]
    holding = with_cols(allocation, pod_keys)[pod_keys].drop_duplicates()
    act = with_cols(activity, [*pod_keys, "first_allocated", "last_busy"])
    act = act.merge(holding, on=pod_keys, how="inner")
    act = act.assign(
        first_allocated=pd.to_numeric(act["first_allocated"], errors="coerce"),
        last_busy=pd.to_numeric(act["last_busy"], errors="coerce"),
    )
    history = act.groupby(list(LEAF), as_index=False).agg(
        held_since=("first_allocated", "min"), last_busy=("last_busy", "max")
    )
    out = out.merge(history, on=list(LEAF), how="left")
    start = now - window_s
    # both are steps of the range; a time outside it (a store's odd answer) is read as "before the
    # range" for the allocation and as "not busy in the range" for the last busy step
    held_since = pd.to_numeric(out["held_since"], errors="coerce").clip(lower=start, upper=now)
    last_busy = pd.to_numeric(out["last_busy"], errors="coerce")
    last_busy = last_busy.where((last_busy >= start) & (last_busy <= now))
    since = pd.concat([held_since, last_busy], axis=1).max(axis=1, skipna=True)
    out["idle_seconds"] = (now - since).clip(lower=0.0)
    out["whole_range"] = last_busy.isna() & held_since.notna() & (held_since - start < WHOLE_RANGE_SLACK * window_s)
    since_allocated = (last_busy.isna() | (last_busy < held_since)) & held_since.notna()
    out["idle_for"] = [
        idle_for_words(float(s), bool(w), bool(a), window_s)
        for s, w, a in zip(
            out["idle_seconds"].tolist(), out["whole_range"].tolist(), since_allocated.tolist(), strict=True
        )
    ]
    gpus = set(out["uuid"])
    out = _placed(out, places(_of(info, gpus), _of(mig_info, gpus)), allocation, list(LEAF))
    out = out.assign(_rank=out["idle_seconds"].where(~out["whole_range"], math.inf).fillna(-1.0))
    out = out.sort_values(["_rank", "node", "_i", "gpu"], ascending=[False, True, True, True], kind="stable")
    return out[list(IDLE_COLUMNS)].reset_index(drop=True)


def _of(df: pd.DataFrame, gpus: set[str]) -> pd.DataFrame:
    """The rows of ``df`` on the physical GPUs ``gpus`` (uuid)."""
    return df[col(df, "uuid").isin(gpus)] if not df.empty else df


def _pct(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def slow_gpus(
    info: pd.DataFrame,
    allocation: pd.DataFrame,
    events: pd.DataFrame,
    clock: pd.DataFrame,
    clock_max: pd.DataFrame,
    idle: pd.DataFrame,
) -> pd.DataFrame:
    """The physical GPUs running well below what they can (SLOW_COLUMNS), the slowest first. A GPU
    is slow when

    - it is in use and its SM clock is under CLOCK_HELD_BELOW of its maximum, or
    - it is in use and its SM clock ratio lies PEERS_GAP_AT_LEAST or more under the median of its
      peers (the other GPUs of its model in use in view, at least PEERS_AT_LEAST of them), or
    - a fault (FAULT_REASONS: thermal, power brake, hardware slowdown) held its clocks down at some
      point of the range, in any state.

    A power cap alone is not slowness: a busy GPU at its power limit near its maximum clock is
    working as designed. A GPU with no verdict (no activity data, or its window still collecting)
    counts as in use only where a power cap says it drew its full power.

    ``events``: each clock event's share of the range (the mean of gpulens_gpu_clock_event_active:
    uuid, reason, value 0..1); ``clock``: the SM clock's mean over the idle definition's window
    (gpulens_gpu_sm_clock_hertz, Hz, per uuid); ``clock_max``: gpulens_gpu_sm_clock_max_hertz (Hz);
    ``idle``: the idle verdict per leaf (MetricSource.leaf_idle, the verdicts whose window is full),
    whose busy leaves make their GPU in use. ``sm_clock_ratio`` (0..1) is NaN for an idle GPU (its
    clocks are low by design), and ``sm_clock`` says so in words; ``why`` names the events with
    their share of the range, and the clock's gap where it alone says so."""
    ev = with_cols(events, ["uuid", "reason"])
    ev = ev.assign(value=pd.to_numeric(col(ev, "value"), errors="coerce"))
    ev = ev[(ev["value"] > 0) & ev["reason"].isin([*SLOWDOWN_REASONS, APPLICATION_CLOCKS])]
    ev = ev.groupby(["uuid", "reason"], as_index=False)["value"].max()
    hz = keyed(clock, ["uuid"], "hz").merge(keyed(clock_max, ["uuid"], "max_hz"), on="uuid")
    ratio = dict(zip(hz["uuid"], hz["hz"] / hz["max_hz"].where(hz["max_hz"] > 0), strict=True))
    verdict = with_cols(idle, ["uuid"])
    value = pd.to_numeric(col(verdict, "value"), errors="coerce")
    in_use = set(verdict.loc[value < 0.5, "uuid"])
    # idle: every leaf of it idle (a GPU with no verdict is neither)
    idle_gpus = set(verdict.loc[value >= 0.5, "uuid"]) - in_use
    capped = set(ev.loc[ev["reason"] == "sw_power_cap", "uuid"]) - idle_gpus - in_use
    working = in_use | capped
    faults = set(ev.loc[ev["reason"].isin(FAULT_REASONS), "uuid"])
    below = {u for u in working if ratio.get(u, math.nan) < CLOCK_HELD_BELOW}
    peers = _peer_medians(info, working, ratio)
    behind = {u for u in working if ratio.get(u, math.nan) <= peers.get(u, math.nan) - PEERS_GAP_AT_LEAST + 1e-12}
    slow = sorted(faults | below | behind)
    if not slow:
        return pd.DataFrame(columns=list(SLOW_COLUMNS))
    shares: dict[str, list[tuple[float, str]]] = {}
    for u, why, share in zip(ev["uuid"], ev["reason"], ev["value"], strict=True):
        shares.setdefault(str(u), []).append((float(share), str(why)))
    out = pd.DataFrame({"uuid": slow, "mig_uuid": ""})
    out["sm_clock_ratio"] = [math.nan if u in idle_gpus else ratio.get(u, math.nan) for u in slow]
    out["sm_clock"] = [
        IDLE_CLOCK if u in idle_gpus else _pct(r) if r == r else "not reported"
        for u, r in zip(slow, out["sm_clock_ratio"], strict=True)
    ]
    out["why"] = [
        slow_words(shares.get(u, []), u in below, peers.get(u, math.nan) if u in behind and u not in below else None)
        for u in slow
    ]
    out["_share"] = [max((s for s, _ in shares.get(u, [])), default=0.0) for u in slow]
    out = with_holders(out, _of(allocation, set(slow)))
    out = _placed(out, places(_of(info, set(slow)), pd.DataFrame()), _of(allocation, set(slow)), list(LEAF))
    out = out.sort_values(
        ["sm_clock_ratio", "_share", "node", "_i"], ascending=[True, False, True, True], na_position="last"
    )
    return out[list(SLOW_COLUMNS)].reset_index(drop=True)


def _peer_medians(info: pd.DataFrame, working: set[str], ratio: dict[str, float]) -> dict[str, float]:
    """Per GPU in ``working``, the median SM clock ratio of the other working GPUs of its model
    (gpulens_gpu_info's ``name``), where there are at least PEERS_AT_LEAST of them."""
    models = dict(zip(col(info, "uuid").astype(str), col(info, "name").astype(str), strict=True))
    by_model: dict[str, list[tuple[str, float]]] = {}
    for u in working:
        r = ratio.get(u, math.nan)
        if r == r:
            by_model.setdefault(models.get(u, ""), []).append((u, r))
    out: dict[str, float] = {}
    for members in by_model.values():
        for u, _ in members:
            others = [r for v, r in members if v != u]
            if len(others) >= PEERS_AT_LEAST:
                out[u] = float(pd.Series(others).median())
    return out


def slow_words(shares: list[tuple[float, str]], clock_below: bool, peers: float | None = None) -> str:
    """Why a GPU is slow, in words: each clock event with its share of the range, the largest
    first (``HW Thermal Slowdown 100 %``), ``SM clock under 90 % of max`` where the clock is under
    CLOCK_HELD_BELOW, and ``SM clock behind its peers' 97 %`` where it trails its peers' median
    (``peers``)."""
    parts = [f"{words.clock_event(why)} {_pct(share)}" for share, why in sorted(shares, key=lambda p: (-p[0], p[1]))]
    if clock_below:
        events = any(why in SLOWDOWN_REASONS for _, why in shares)
        parts.append(f"SM clock under {_pct(CLOCK_HELD_BELOW)} of max" + ("" if events else ", no slowdown event"))
    elif peers is not None:
        parts.append(f"SM clock behind its peers' {_pct(peers)} of max")
    return " · ".join(parts)


def shown(table: pd.DataFrame, rows: int = ROWS_SHOWN) -> tuple[pd.DataFrame, int]:
    """The first ``rows`` rows of ``table`` and how many more there are."""
    return table.head(rows), max(0, len(table) - rows)
