"""Kept-alive connections with Nagle's algorithm off (now) and on (before), side by side.

    .venv/bin/python -m bench.keepalive --scrapes 400

Exporter: two sim h200x8 exporter processes, one as shipped (exporter.tcp.as_tcp: TCP_NODELAY on
each connection) and one with that step undone (a protocol-0 listener, as before), each scraped
``--scrapes`` times over one kept-alive connection, with ``Accept-Encoding: gzip`` as Prometheus
sends it and without. Dashboard: ``python -m dashboard`` (Streamlit through dashboard.server) and
plain ``python -m streamlit run dashboard/app.py``; a browser-like client fetches the script
files Streamlit's index.html names over 6 kept-alive connections, as a first page load does.
Latencies in ms, wall times in s.
"""

from __future__ import annotations

import argparse
import http.client
import re
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager

from tests.support.net import free_port
from tests.support.process import managed_process

NAGLE_ON = "import exporter.http.server as s; s.as_tcp = lambda sock: sock; from exporter.__main__ import main; main()"
"""The exporter with its listener left at protocol 0 (the behaviour before exporter.tcp)."""


@contextmanager
def exporter(nagle: bool) -> Iterator[int]:
    port = free_port()
    flags = ["--backend", "sim", "--sim.scenario", "h200x8", "--web.listen-address", f"127.0.0.1:{port}"]
    argv = [sys.executable, "-c", NAGLE_ON, *flags] if nagle else [sys.executable, "-m", "exporter", *flags]
    with managed_process(argv, f"http://127.0.0.1:{port}/readyz", timeout=30):
        yield port


def scrape_ms(port: int, n: int, gzip: bool) -> list[float]:
    """Milliseconds per /metrics request, ``n`` requests over one kept-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    headers = {"Accept-Encoding": "gzip"} if gzip else {}
    out = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/metrics", headers=headers)
        conn.getresponse().read()
        out.append((time.perf_counter() - t) * 1000.0)
    conn.close()
    return out


@contextmanager
def dashboard(nagle: bool) -> Iterator[int]:
    port = free_port()
    if nagle:
        argv = [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.headless=true",
                f"--server.port={port}", "--server.address=127.0.0.1", "--server.fileWatcherType=none"]  # fmt: skip
        env = {"GPULENS_DASHBOARD_SCRAPE": "127.0.0.1:9"}
    else:
        argv = [sys.executable, "-m", "dashboard", "--scrape", "127.0.0.1:9", "--port", str(port),
                "--address", "127.0.0.1"]  # fmt: skip
        env = {}
    with managed_process(argv, f"http://127.0.0.1:{port}/_stcore/health", timeout=60, env=env):
        yield port


def first_load_files(port: int) -> tuple[float, list[float]]:
    """Seconds to fetch the scripts index.html names over 6 kept-alive connections (as a browser
    does), and milliseconds per file."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/")
    paths = re.findall(r'(?:src|href)="\./(static/js/[^"]+\.js)"', conn.getresponse().read().decode())
    conn.close()
    per_file: list[float] = []

    def fetch(share: list[str]) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for p in share:
            t = time.perf_counter()
            c.request("GET", "/" + p)
            c.getresponse().read()
            per_file.append((time.perf_counter() - t) * 1000.0)
        c.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(fetch, [paths[i::6] for i in range(6)]))
    return time.perf_counter() - started, per_file


def _p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=400)
    ap.add_argument("--loads", type=int, default=5, help="rounds of the dashboard's script files")
    a = ap.parse_args()
    print("exporter, one kept-alive connection (ms per scrape): p50 / p99")
    with ExitStack() as es:
        ports = {name: es.enter_context(exporter(nagle)) for name, nagle in (("Nagle off", False), ("Nagle on", True))}
        for gzip in (True, False):
            for name, port in ports.items():
                scrape_ms(port, 20, gzip)  # warm
                ms = scrape_ms(port, a.scrapes, gzip)
                print(f"  {'gzip' if gzip else 'text'}  {name:<10} {_p(ms, 50):7.2f} / {_p(ms, 99):7.2f}")
    print("dashboard, index.html's script files over 6 kept-alive connections: wall s (median) / ms per file p50")
    with ExitStack() as es:
        sides = (("Nagle off", False), ("Nagle on", True))
        dports = {name: es.enter_context(dashboard(nagle)) for name, nagle in sides}
        for name, port in dports.items():
            first_load_files(port)  # warm the OS cache
            walls, files = [], []
            for _ in range(a.loads):
                wall, per = first_load_files(port)
                walls.append(wall)
                files += per
            wall_s, file_ms = statistics.median(walls), _p(files, 50)
            print(f"  {name:<10} {wall_s:6.3f} s / {file_ms:6.2f} ms ({len(files) // a.loads} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
