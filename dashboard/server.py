"""Run Streamlit's server in this process with TCP_NODELAY on every connection it accepts.

``python -m dashboard`` execs ``python -m dashboard.server run dashboard/app.py ...`` rather than
``python -m streamlit``: the same command line, after one fix to how Streamlit listens.

Why: Streamlit (1.67, its Starlette server) binds its listening socket as
``socket.socket(family)``, protocol 0. asyncio sets TCP_NODELAY on an accepted connection only
when the socket says ``IPPROTO_TCP``, so Streamlit's connections keep Nagle's algorithm on. A
response is written as headers, then body: on a kept-alive connection the body then waits for the
browser to acknowledge the headers, and browsers delay that acknowledgement (40 ms on Linux). A
first page load fetches dozens of script files over a few connections and lost a good part of a
second to it; websocket messages wait the same way (figures: docs/benchmarks.md, "Nagle").

The fix re-wraps the bound socket's file descriptor as ``IPPROTO_TCP`` (exporter.tcp.as_tcp;
nothing else about it changes), so asyncio sets TCP_NODELAY on each connection. When a Streamlit
release no longer has the function it wraps, the server still starts, and says on stderr that the
fix is not applied (tests/test_tcp_nodelay.py then fails).

With ``--scrape``, the server also starts scraping the exporters as it starts
(:func:`start_scraping`), not at the first page a browser opens.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from exporter.tcp import as_tcp

NOT_APPLIED = "gpulens dashboard: Streamlit's socket binding changed; TCP_NODELAY fix not applied"


def install() -> bool:
    """Wrap Streamlit's listening-socket binder with :func:`as_tcp`; False when this Streamlit
    has no such binder (nothing changed then)."""
    try:
        from streamlit.web.server.starlette import starlette_server
    except ImportError:
        return False
    bind: Callable[..., Any] | None = getattr(starlette_server, "_bind_socket", None)
    if bind is None:
        return False
    if getattr(bind, "gpulens_tcp", False):
        return True

    def bind_tcp(*args: Any, **kwargs: Any) -> Any:
        got = bind(*args, **kwargs)
        return as_tcp(got) if isinstance(got, socket.socket) else got

    bind_tcp.gpulens_tcp = True  # type: ignore[attr-defined]
    starlette_server._bind_socket = bind_tcp
    return True


def start_scraping() -> threading.Thread | None:
    """With a ``--scrape`` source (GPULENS_DASHBOARD_* environment, as dashboard.cli sets it), start
    its scraper on a thread now (the first scrape can take a timeout per unreachable exporter; the
    server must not wait for it): the history then starts with the dashboard, not with the first page
    a browser opens, whose 5-minute verdicts would otherwise read one scrape. The pages get the same
    source (dashboard.sources.scrape.running). None when there is nothing to scrape."""
    from dashboard.settings import from_env

    try:
        cfg = from_env()
    except ValueError:  # the page says which setting is bad
        return None
    if cfg.prometheus_url or not cfg.scrape_urls:
        return None

    def start() -> None:
        from dashboard.sources.scrape import running

        running(cfg.scrape_urls, interval_s=cfg.scrape_interval_seconds, timeout_s=cfg.timeout_seconds)

    thread = threading.Thread(target=start, name="gpulens-scrape-start", daemon=True)
    thread.start()
    return thread


def main() -> None:
    """``streamlit`` with the fix: ``python -m dashboard.server run APP [FLAGS]``."""
    if not install():
        print(NOT_APPLIED, file=sys.stderr)
    start_scraping()
    from streamlit.web.cli import main as streamlit_main

    streamlit_main(prog_name="streamlit")  # the command line Streamlit sees with python -m streamlit


if __name__ == "__main__":
    main()
