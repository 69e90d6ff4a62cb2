"""Pure figure builders: a DataFrame in, a plotly Figure out (no I/O, no Streamlit), unit-tested."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from dashboard.definitions import UNKNOWN_CLASS
from exporter.model import POD_BOUNDNESS_CLASSES

CLASS_COLORS: dict[str, str] = {
    "idle": "#9e9e9e",
    "launch": "#ff9800",
    "latency": "#ffd54f",
    "memory": "#1e88e5",
    "compute": "#43a047",
    "mixed": "#8e24aa",
    "shared": "#00897b",
    "unknown": "#d7ccc8",
}
"""One colour per boundness class, the same on every page."""

CLASS_ORDER = [*POD_BOUNDNESS_CLASSES, UNKNOWN_CLASS]
"""The exporter's classes (``shared``: a pod's class when several pods have processes on its leaf,
the recording rule gpulens:pod_gpu_boundness:class; a leaf itself never has it), then ``unknown``."""

_UNIT_SCALE: dict[str, tuple[float, str, str]] = {
    # unit -> (divide by, axis title, tick format)
    "ratio": (1.0, "", ".0%"),
    "bytes": (2**30, "GiB", ""),
    "bytes_per_second": (1e9, "GB/s", ""),
    "watts": (1.0, "W", ""),
    "celsius": (1.0, "°C", ""),
    "hertz": (1e6, "MHz", ""),
    "": (1.0, "", ""),
}


def _short(uuid: str) -> str:
    return uuid[:12] + "…" if len(uuid) > 13 else uuid


def empty_figure(message: str = "no data") -> go.Figure:
    """A blank figure that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, font={"size": 16}, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def sm_heatmap(sm: pd.DataFrame) -> go.Figure:
    """SM activity (0..1) per node (rows) and GPU index (columns); MIG slices take their max."""
    if sm.empty:
        return empty_figure()
    df = sm.assign(node=sm["node"] if "node" in sm.columns and sm["node"].any() else sm.get("instance", ""))
    df = df.assign(gpu=df["gpu"] if "gpu" in df.columns else "")
    grid = df.pivot_table(index="node", columns="gpu", values="value", aggfunc="max")
    grid = grid.reindex(sorted(grid.columns, key=lambda g: (len(str(g)), str(g))), axis=1)
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy(),
            x=[f"GPU {g}" for g in grid.columns],
            y=list(grid.index),
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            colorbar={"title": "SM active", "tickformat": ".0%"},
            hovertemplate="%{y} %{x}<br>SM active %{z:.0%}<extra></extra>",
        )
    )
    fig.update_layout(height=max(260, min(1600, 22 * len(grid.index) + 120)), margin={"t": 30})
    fig.update_yaxes(autorange="reversed")  # first node on top, like a table
    return fig


def roofline_scatter(points: pd.DataFrame) -> go.Figure:
    """x = DRAM bandwidth active, y = busiest pipe active, colour = boundness class, pods on hover;
    each point carries ``customdata`` [uuid, mig_uuid, holders, leaf] (a click opens its GPU)."""
    if points.empty:
        return empty_figure()
    df = points.assign(
        leaf=[
            _short(m) if m else f"{i} GPU {g}"
            for m, i, g in zip(points["mig_uuid"], points["instance"], points["gpu"], strict=True)
        ]
    )
    present = set(df["class"])
    traces = []
    for cls in [*CLASS_ORDER, *sorted(present - set(CLASS_ORDER))]:
        if cls not in present:
            continue
        part = df[df["class"] == cls]
        traces.append(
            go.Scatter(
                x=part["dram_active"].round(4),
                y=part["pipe_active"].round(4),
                mode="markers",
                name=cls,
                marker={"size": 11, "color": CLASS_COLORS.get(cls), "line": {"width": 1, "color": "white"}},
                customdata=part[["uuid", "mig_uuid", "holders", "leaf"]].to_numpy(),
                hovertemplate=(
                    "<b>%{customdata[3]}</b><br>holders: %{customdata[2]}<br>uuid: %{customdata[0]}<br>"
                    "DRAM bandwidth active: %{x:.0%}<br>busiest pipe active: %{y:.0%}<br>"
                    f"class: {cls}<extra></extra>"
                ),
            )
        )
    fig = go.Figure(traces)
    fig.update_xaxes(range=[-0.02, 1.02], tickformat=".0%", title_text="DRAM bandwidth active")
    fig.update_yaxes(range=[-0.02, 1.02], tickformat=".0%", title_text="busiest pipe active (tensor/FP)")
    fig.add_shape(type="line", x0=0, y0=0, x1=1, y1=1, line={"dash": "dot", "color": "#bbb"})
    fig.update_layout(height=480, legend_title_text="bound by", showlegend=True)
    return fig


def boundness_area(series: pd.DataFrame) -> go.Figure:
    """How many GPUs/slices are in each boundness class over time (stacked)."""
    if series.empty or "class" not in series.columns:
        return empty_figure()
    df = series.assign(time=pd.to_datetime(series["timestamp"], unit="s", utc=True)).sort_values("time")
    present = set(df["class"])
    traces = [
        go.Scatter(
            x=part["time"],
            y=part["value"],
            mode="lines",
            name=cls,
            stackgroup="classes",
            line={"color": CLASS_COLORS.get(cls)},
            hovertemplate=f"{cls}: %{{y}}<extra></extra>",
        )
        for cls in [*CLASS_ORDER, *sorted(present - set(CLASS_ORDER))]
        if cls in present
        for part in [df[df["class"] == cls]]
    ]
    fig = go.Figure(traces)
    fig.update_yaxes(title_text="GPUs / MIG slices")
    fig.update_layout(height=360, legend_title_text="bound by", hovermode="x unified", showlegend=True)
    return fig


def waste_bar(waste: pd.DataFrame) -> go.Figure:
    """Wasted (allocated but idle) GPU-hours per namespace, cost on hover."""
    if waste.empty:
        return empty_figure()
    df = waste.assign(cost=[f"${c:,.2f}" if pd.notna(c) else "no price" for c in waste["cost_usd"]])
    fig = px.bar(
        df,
        x="namespace",
        y="gpu_hours",
        hover_data={"cost": True, "pods": True},
        labels={"gpu_hours": "idle GPU-hours while allocated"},
        color_discrete_sequence=["#e53935"],
    )
    fig.update_layout(height=340)
    return fig


def mig_layout_figure(layout: pd.DataFrame) -> go.Figure:
    """Each MIG GPU as a row of its slices (width = compute slices), labelled with the profile and
    who holds it; free slices are grey."""
    if layout.empty:
        return empty_figure("no MIG GPUs")
    where = layout["node"] if "node" in layout.columns and (layout["node"] != "").any() else layout["instance"]
    rows = layout.assign(row=[f"{i} GPU {g}" for i, g in zip(where, layout["gpu"], strict=True)])
    fig = go.Figure()
    for _, r in rows.iterrows():
        held = bool(r["holders"])
        label = f"{r['mig_profile']}<br>{r['holders'] or 'free'}"
        fig.add_trace(
            go.Bar(
                y=[r["row"]],
                x=[r["slices"]],
                orientation="h",
                text=[label],
                textposition="inside",
                insidetextanchor="middle",
                marker={"color": "#43a047" if held else "#cfd8dc", "line": {"color": "white", "width": 2}},
                hovertemplate=(
                    f"{r['row']}<br>{r['mig_profile']} (GI {r['gpu_instance_id']})<br>"
                    f"{r['mig_uuid']}<br>held by: {r['holders'] or 'nobody'}<extra></extra>"
                ),
                showlegend=False,
            )
        )
    order = list(dict.fromkeys(rows["row"]))
    fig.update_layout(barmode="stack", height=max(200, 70 * len(order) + 80), xaxis_title="compute slices")
    # first GPU on top, in the layout's order
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1])
    return fig


def sm_share_bar(shares: pd.DataFrame) -> go.Figure:
    """Per time-sliced GPU, each pod's share of SM time (stacked; the gap to 1 is idle time)."""
    df = shares[shares["pod"] != ""] if not shares.empty else shares
    if df.empty:
        return empty_figure("no per-pod SM share")
    df = df.assign(gpu=[_short(u) for u in df["uuid"]], who=df["namespace"] + "/" + df["pod"])
    fig = px.bar(
        df,
        x="gpu",
        y="sm_share",
        color="who",
        labels={"sm_share": "share of SM time", "gpu": "GPU", "who": "pod"},
        hover_data={"uuid": True},
    )
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    fig.update_layout(barmode="stack", height=360)
    return fig


def probe_efficiency_bar(probes: pd.DataFrame) -> go.Figure:
    """Probe bandwidth as a fraction of the expected one per GPU (1.0 line = as expected)."""
    df = probes.dropna(subset=["efficiency"]) if not probes.empty else probes
    if df.empty:
        return empty_figure("no probe results")
    where = df["node"] if "node" in df.columns and (df["node"] != "").any() else df.get("instance", "")
    mig = df["mig_uuid"] if "mig_uuid" in df.columns else pd.Series([""] * len(df), index=df.index)
    df = df.assign(
        gpu_label=[
            (f"{w} GPU {g}" if w else _short(u)) + (f" {_short(m)}" if m else "")
            for w, g, u, m in zip(where, df["gpu"], df["uuid"], mig, strict=True)
        ]
    )
    hover: dict[str, bool | str] = {c: True for c in ("uuid", "mig_uuid") if c in df.columns}
    if "vs_peers" in df.columns:
        hover["vs_peers"] = ":.0%"
    fig = px.bar(
        df,
        x="gpu_label",
        y="efficiency",
        color="probe",
        barmode="group",
        hover_data=hover,
        labels={"efficiency": "measured / expected", "gpu_label": "GPU"},
    )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    fig.add_hline(y=0.8, line_dash="dash", line_color="#d62728", annotation_text="slow")
    fig.update_yaxes(tickformat=".0%")
    fig.update_layout(height=360)
    return fig


def clock_event_bar(events: pd.DataFrame) -> go.Figure:
    """How many GPUs each clock-event (throttle) reason holds down now."""
    if events.empty:
        return empty_figure("no clock events active")
    counts = events.groupby("reason", as_index=False).size().rename(columns={"size": "gpus"})
    fig = px.bar(counts, x="reason", y="gpus", labels={"gpus": "GPUs affected"}, color_discrete_sequence=["#fb8c00"])
    fig.update_layout(height=300)
    return fig


def time_lines(df: pd.DataFrame, unit: str) -> go.Figure:
    """Lines over time (timestamp, series, value) in a readable unit (GiB, GB/s, MHz, %).

    Built from graph_objects, not plotly.express: the GPU page draws a dozen of these, and express
    costs about 0.1 s of server time per figure."""
    if df.empty:
        return empty_figure()
    scale, title, fmt = _UNIT_SCALE.get(unit, (1.0, unit, ""))
    d = df.assign(time=pd.to_datetime(df["timestamp"], unit="s", utc=True), value=df["value"] / scale)
    d = d.sort_values("time", kind="stable")
    traces = [
        go.Scatter(
            x=part["time"],
            y=part["value"],
            mode="lines",
            name=str(name),
            hovertemplate="%{y}<extra>%{fullData.name}</extra>",
        )
        for name, part in d.groupby("series", sort=False)
    ]
    fig = go.Figure(traces)
    fig.update_yaxes(title_text=title, tickformat=fmt or None)
    # a legend even for one line: it names the series
    fig.update_layout(height=300, margin={"t": 20, "b": 10}, legend_title_text="", hovermode="x", showlegend=True)
    return fig


def state_strip(timeline: pd.DataFrame, label: str) -> go.Figure:
    """Which state (boundness class, throttle reason) each leaf was in over time, as coloured marks."""
    if timeline.empty:
        return empty_figure("never")
    d = timeline.assign(time=pd.to_datetime(timeline["timestamp"], unit="s", utc=True))
    y = "leaf" if label == "class" else label
    states = list(dict.fromkeys(d[label]))
    if label == "class":
        states = [c for c in CLASS_ORDER if c in states] + [c for c in states if c not in CLASS_ORDER]
    traces = [
        go.Scatter(
            x=part["time"],
            y=part[y],
            mode="markers",
            name=str(state),
            marker={
                "symbol": "square",
                "size": 9,
                **({"color": CLASS_COLORS[state]} if label == "class" and state in CLASS_COLORS else {}),
            },
            hovertemplate=f"%{{y}}: {state}<br>%{{x}}<extra></extra>",
        )
        for state in states
        for part in [d[d[label] == state]]
    ]
    fig = go.Figure(traces)
    fig.update_layout(
        height=max(200, 60 + 40 * d[y].nunique()), margin={"t": 20}, legend_title_text=label, showlegend=True
    )
    return fig
