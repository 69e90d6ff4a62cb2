"""Streamlit entry point: sidebar range and filters (kept in the URL), then st.navigation over the pages.

Run through ``python -m dashboard`` (which sets the GPULENS_DASHBOARD_* environment) or directly
with ``streamlit run dashboard/app.py``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import streamlit as st

from dashboard import ui
from dashboard.inert_text import inert
from dashboard.sources.source import Filters, SourceError, bounded_step

HERE = Path(__file__).parent
PAGES = [  # (script, title, url path, icon); the first is the default page, served at "/"
    ("views/fleet.py", "Fleet", "fleet", ":material/dns:"),
    ("views/efficiency.py", "Efficiency", "efficiency", ":material/speed:"),
    ("views/workloads.py", "Workloads", "workloads", ":material/work:"),
    ("views/jobs.py", "Jobs", "jobs", ":material/hub:"),
    ("views/sharing.py", "Sharing", "sharing", ":material/grid_view:"),
    ("views/health.py", "Health", "health", ":material/monitor_heart:"),
    ("views/network.py", "Network", "network", ":material/lan:"),
    ("views/serving.py", "Serving", "serving", ":material/smart_toy:"),
    ("views/rightsizing.py", "Right-sizing", "rightsizing", ":material/tune:"),
    ("views/job.py", "Job", "job", ":material/account_tree:"),
    ("views/gpu.py", "GPU", "gpu", ":material/memory:"),
]


def _choice(label: str, options: list[str], key: str, param: str) -> str | None:
    """A sidebar filter: "All" or one of ``options``; the URL's ``?param=`` preselects it on the
    first run; a choice that a wider filter just ruled out (a node of another cluster) falls back
    to "All"."""
    if not options:
        return None
    if key not in st.session_state:
        st.session_state[key] = str(st.query_params.get(param, "All"))
    if st.session_state[key] not in ("All", *options):
        st.session_state[key] = "All"
    picked = st.sidebar.selectbox(inert(label), ["All", *options], key=key)
    return None if picked == "All" else picked


def _asked(key: str, param: str) -> str | None:
    """The choice of sidebar filter ``key`` this run will make if its options allow it: the
    session's, else the URL's ``?param=`` (None: All)."""
    value = str(st.session_state.get(key, st.query_params.get(param, "All")))
    return None if value in ("All", "") else value


def _parse_utc(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text).replace(tzinfo=UTC)
    except ValueError:
        return None


def _time_range() -> tuple[float, float | None, dict[str, str]]:
    """The sidebar's time range: (window seconds, absolute end or None, its URL parameters)."""
    labels = [*ui.WINDOWS, ui.ABSOLUTE]
    if "window" not in st.session_state:
        start, end = _parse_utc(str(st.query_params.get("from", ""))), _parse_utc(str(st.query_params.get("to", "")))
        if start and end and start < end:
            st.session_state["window"] = ui.ABSOLUTE
            st.session_state["abs_from"] = (start.date(), start.time().replace(second=0, microsecond=0))
            st.session_state["abs_to"] = (end.date(), end.time().replace(second=0, microsecond=0))
        else:
            st.session_state["window"] = ui.RANGE_PARAM.get(str(st.query_params.get("range", "1h")), "Last hour")
    label = st.sidebar.selectbox("Time range", labels, key="window")
    if label != ui.ABSOLUTE:
        param = next(k for k, v in ui.RANGE_PARAM.items() if v == label)
        return ui.WINDOWS[label], None, {"range": param}
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    d0, t0 = st.session_state.get("abs_from", ((now - timedelta(hours=1)).date(), (now - timedelta(hours=1)).time()))
    d1, t1 = st.session_state.get("abs_to", (now.date(), now.time()))
    c1, c2 = st.sidebar.columns(2)
    start = datetime.combine(c1.date_input("From (UTC)", d0), c2.time_input("at", t0, key="t_from"), UTC)
    c3, c4 = st.sidebar.columns(2)
    end = datetime.combine(c3.date_input("To (UTC)", d1), c4.time_input("at ", t1, key="t_to"), UTC)
    st.session_state["abs_from"], st.session_state["abs_to"] = (start.date(), start.time()), (end.date(), end.time())
    if end <= start:
        st.sidebar.warning("The range ends before it starts: showing the hour before its end.")
        start = end - timedelta(hours=1)
    fmt = "%Y-%m-%dT%H:%M"
    return (end - start).total_seconds(), end.timestamp(), {"from": start.strftime(fmt), "to": end.strftime(fmt)}


def main() -> None:
    # a file, not a :material/: icon or an emoji: those make the browser fetch the favicon from a
    # public host, which air-gapped clusters cannot reach
    st.set_page_config(page_title="gpulens", page_icon=str(HERE / "favicon.svg"), layout="wide")
    started = time.perf_counter()
    error: str | None = None
    try:
        cfg = ui.settings()
    except ValueError as exc:
        st.error(f"bad dashboard setting: {inert(exc)}")
        st.stop()
    st.sidebar.markdown("### gpulens")
    try:
        src = ui.source(cfg)
    except SourceError as exc:
        st.error(inert(exc))
        st.stop()
    window_s, end_s, url = _time_range()
    window, step = bounded_step(window_s, window_s / ui.POINTS_PER_CHART)
    step = max(step, cfg.scrape_interval_seconds if cfg.scrape_urls and not cfg.prometheus_url else 1.0)
    if st.sidebar.button("Refresh now", key="refresh_now", icon=":material/refresh:"):
        st.session_state["nonce"] = st.session_state.get("nonce", 0) + 1
    nonce = int(st.session_state.get("nonce", 0))
    filters = Filters()
    ctx = ui.PageContext(cfg, src, filters, window, step, None, end_s=end_s, nonce=nonce)
    # the filters' options at once, for the choices the session or the URL holds: each depends on the
    # wider filter's choice, checked against its options below (a choice ruled out asks again)
    asked = Filters(cluster=_asked("f_cluster", "cluster"), node=_asked("f_node", "node"),
                    instance=_asked("f_inst", "instance"))  # fmt: skip
    ui.prefetch(
        ctx,
        [
            ui.query("label_values", "cluster"),
            ui.query("label_values", "node", within=Filters(cluster=asked.cluster)),
            ui.query("label_values", "namespace", "gpulens_pod_gpu_allocation", within=asked),
        ],
    )
    try:
        clusters = ui.fetch(ctx, "label_values", "cluster")
        cluster = _choice("Cluster", clusters, "f_cluster", "cluster")
        nodes = ui.fetch(ctx, "label_values", "node", within=Filters(cluster=cluster))
        node = _choice("Node", nodes, "f_node", "node")
        instances = [] if nodes else ui.fetch(ctx, "label_values", "instance", within=Filters(cluster=cluster))
        instance = _choice("Exporter (instance)", instances, "f_inst", "instance")
        targets = Filters(cluster=cluster, node=node, instance=instance)
        namespaces = ui.fetch(ctx, "label_values", "namespace", "gpulens_pod_gpu_allocation", within=targets)
        namespace = _choice("Namespace", namespaces, "f_ns", "namespace")
        filters = Filters(cluster=cluster, node=node, instance=instance, namespace=namespace)
    except SourceError as exc:
        error = str(exc)
        st.sidebar.button("Retry", key="retry")
    url.update({k: v for k, v in vars(filters).items() if v})
    ui.set_url_state(url)
    auto = st.sidebar.toggle("Auto-refresh", value=cfg.refresh_seconds > 0 and end_s is None, key="auto")
    st.sidebar.caption(f"Source: {inert(src.description)}")
    ui.set_context(
        ui.PageContext(
            settings=cfg,
            source=src,
            filters=filters,
            window_s=window,
            step_s=step,
            refresh_s=cfg.refresh_seconds if auto and cfg.refresh_seconds > 0 and end_s is None else None,
            source_error=error,
            started=started,
            end_s=end_s,
            nonce=nonce,
        )
    )
    pages = [
        st.Page(str(HERE / path), title=title, url_path=url, icon=icon, default=i == 0)
        for i, (path, title, url, icon) in enumerate(PAGES)
    ]
    ui.PAGES.update({url: page for (_path, _title, url, _icon), page in zip(PAGES, pages, strict=True)})
    nav = st.navigation(pages)
    nav.run()


main()
