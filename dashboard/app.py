"""Streamlit entry point: sidebar filters, then st.navigation over the five pages.

Run through ``python -m dashboard`` (which sets the GPULENS_DASHBOARD_* environment) or directly
with ``streamlit run dashboard/app.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from dashboard import ui
from dashboard.source import Filters, SourceError, bounded_step

HERE = Path(__file__).parent
PAGES = [  # (script, title, url path, icon); the first is the default page, served at "/"
    ("views/fleet.py", "Fleet", "fleet", ":material/dns:"),
    ("views/efficiency.py", "Efficiency", "efficiency", ":material/speed:"),
    ("views/workloads.py", "Workloads", "workloads", ":material/work:"),
    ("views/sharing.py", "Sharing", "sharing", ":material/grid_view:"),
    ("views/health.py", "Health", "health", ":material/monitor_heart:"),
    ("views/rightsizing.py", "Right-sizing", "rightsizing", ":material/tune:"),
]


def _choice(label: str, options: list[str], key: str) -> str | None:
    """A sidebar filter: "All" or one of ``options``; a choice that a wider filter just ruled out
    (a node of another cluster) falls back to "All"."""
    if not options:
        return None
    if st.session_state.get(key, "All") not in ("All", *options):
        st.session_state[key] = "All"
    picked = st.sidebar.selectbox(label, ["All", *options], key=key)
    return None if picked == "All" else picked


def main() -> None:
    # a file, not a :material/: icon or an emoji: those make the browser fetch the favicon from a
    # public host, which air-gapped clusters cannot reach
    st.set_page_config(page_title="gpulens", page_icon=str(HERE / "favicon.svg"), layout="wide")
    started = time.perf_counter()
    error: str | None = None
    try:
        cfg = ui.settings()
    except ValueError as exc:
        st.error(f"bad dashboard setting: {exc}")
        st.stop()
    st.sidebar.markdown("### gpulens")
    try:
        src = ui.source(cfg)
    except SourceError as exc:
        st.error(str(exc))
        st.stop()
    labels = list(ui.WINDOWS)
    wanted = ui.RANGE_PARAM.get(str(st.query_params.get("range", "1h")), "Last hour")
    window_label = st.sidebar.selectbox("Time range", labels, index=labels.index(wanted), key="window")
    window, step = bounded_step(ui.WINDOWS[window_label], ui.WINDOWS[window_label] / ui.POINTS_PER_CHART)
    step = max(step, cfg.scrape_interval_seconds if cfg.scrape_urls and not cfg.prometheus_url else 1.0)
    filters = Filters()
    ctx = ui.PageContext(cfg, src, filters, window, step, None)
    try:
        clusters = ui.fetch(ctx, "label_values", "cluster")
        cluster = _choice("Cluster", clusters, "f_cluster")
        nodes = ui.fetch(ctx, "label_values", "node", within=Filters(cluster=cluster))
        node = _choice("Node", nodes, "f_node")
        instances = [] if nodes else ui.fetch(ctx, "label_values", "instance", within=Filters(cluster=cluster))
        instance = _choice("Exporter (instance)", instances, "f_inst")
        targets = Filters(cluster=cluster, node=node, instance=instance)
        namespaces = ui.fetch(ctx, "label_values", "namespace", "gpulens_pod_gpu_allocation", within=targets)
        namespace = _choice("Namespace", namespaces, "f_ns")
        filters = Filters(cluster=cluster, node=node, instance=instance, namespace=namespace)
    except SourceError as exc:
        error = str(exc)
        st.sidebar.button("Retry", key="retry")
    auto = st.sidebar.toggle("Auto-refresh", value=cfg.refresh_seconds > 0, key="auto")
    st.sidebar.caption(f"Source: {src.description}")
    ui.set_context(
        ui.PageContext(
            settings=cfg,
            source=src,
            filters=filters,
            window_s=window,
            step_s=step,
            refresh_s=cfg.refresh_seconds if auto and cfg.refresh_seconds > 0 else None,
            source_error=error,
            started=started,
        )
    )
    nav = st.navigation(
        [
            st.Page(str(HERE / path), title=title, url_path=url, icon=icon, default=i == 0)
            for i, (path, title, url, icon) in enumerate(PAGES)
        ]
    )
    nav.run()


main()
