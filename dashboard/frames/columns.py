"""Frame plumbing every transform uses: rows to a frame, a column that may be missing, sums by
labels, and a source's filters applied to a frame."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pandas as pd

from dashboard.sources.source import Filters

LEAF = ("uuid", "mig_uuid")


def from_rows(rows: Iterable[Mapping[str, object]], *, time: bool = False) -> pd.DataFrame:
    """Rows of ``{label: value, ..., "value": float}`` as a frame; absent labels become ``""``."""
    df = pd.DataFrame(list(rows))
    base = ["timestamp", "value"] if time else ["value"]
    if df.empty:
        return pd.DataFrame(columns=base)
    labels = [c for c in df.columns if c not in ("value", "timestamp")]
    for c in labels:
        df[c] = df[c].fillna("").astype(str)
    df["value"] = pd.to_numeric(df["value"], errors="coerce")
    if time:
        df["timestamp"] = pd.to_numeric(df["timestamp"], errors="coerce")
    return df[[*sorted(labels), *base]]


def col(df: pd.DataFrame, name: str) -> pd.Series:
    """Column ``name`` or a column of ``""`` when the label never occurred."""
    if name in df.columns:
        return df[name]
    return pd.Series([""] * len(df), index=df.index, dtype=object)


def with_cols(df: pd.DataFrame, names: Iterable[str]) -> pd.DataFrame:
    """``df`` with every label in ``names`` present (``""`` where absent)."""
    out = df.copy()
    for n in names:
        if n not in out.columns:
            out[n] = ""
    return out


def aggregate(df: pd.DataFrame, by: Sequence[str] | None) -> pd.DataFrame:
    """``sum by (by)`` (plus timestamp for series); NaN values are skipped like PromQL does."""
    if by is None:
        return df
    time = "timestamp" in df.columns
    keys = [*by, "timestamp"] if time else list(by)
    if df.empty:
        return pd.DataFrame(columns=[*keys, "value"])
    out = with_cols(df, by).groupby(keys, as_index=False, dropna=False)["value"].sum(min_count=1)
    return out


def restrict(df: pd.DataFrame, filters: Filters, allocation: pd.DataFrame, device_keys: Sequence[str]) -> pd.DataFrame:
    """Apply ``filters`` to a frame in pandas (what PromQL matchers do for Prometheus).

    The namespace filter keeps a device series only where ``allocation`` (same time, if series)
    holds the device for a pod of that namespace; series without a device are kept as they are.
    """
    out = df
    for key, value in filters.target_matchers().items():
        out = out[col(out, key) == value]
    if filters.namespace and not out.empty:
        if "namespace" in out.columns and "pod" in out.columns:
            out = out[out["namespace"] == filters.namespace]
        elif device_keys:
            alloc = with_cols(allocation, device_keys)
            alloc = alloc[col(alloc, "namespace") == filters.namespace]
            keys = list(device_keys)
            if "timestamp" in out.columns and "timestamp" in alloc.columns:
                keys.append("timestamp")
            held = alloc[keys].drop_duplicates()
            out = with_cols(out, device_keys).merge(held, on=keys, how="inner")
    return out
