"""If the sampling thread dies, /readyz stops saying 200 and the exporter exits non-zero.

The old exporter kept answering /readyz 200 (with ``gpulens_up 0`` for ever) after the thread died
of an OverflowError from ``--collect.interval 200000d``.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from exporter import cli
from exporter.http.server import MetricsServer
from exporter.render.collector import CachedExposition, SnapshotCollector
from exporter.sampler import Sampler, SamplerOptions
from tests.fakes_backend import ScriptedBackend, healthy

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")

# Larger than threading.TIMEOUT_MAX: the loop's wait between cycles raises OverflowError.
_FATAL = SamplerOptions(interval_seconds=1e12, deadline_seconds=5.0)


def _wait_until(predicate: object, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_readyz_turns_503_when_the_sampling_thread_dies() -> None:
    sampler = Sampler(ScriptedBackend(healthy(1)), _FATAL)
    reg = CollectorRegistry()
    reg.register(SnapshotCollector(sampler.latest))
    server = MetricsServer("127.0.0.1:0", reg, ready=lambda: sampler.latest() is not None and sampler.running())
    server.start()
    try:
        sampler.start()
        assert _wait_until(lambda: sampler.latest() is not None and not sampler.running(), 5)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5)
        assert err.value.code == 503
    finally:
        server.shutdown()
        sampler.stop()


def test_the_exporter_exits_1_when_the_sampling_thread_dies(monkeypatch: pytest.MonkeyPatch) -> None:
    def fatal_build(cfg: object) -> tuple[Sampler, CachedExposition, ScriptedBackend]:
        backend = ScriptedBackend(healthy(1))
        sampler = Sampler(backend, _FATAL)
        return sampler, CachedExposition(SnapshotCollector(sampler.latest, include_age=False), sampler.latest), backend

    monkeypatch.setattr(cli, "build", fatal_build)
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        t0 = time.monotonic()
        assert cli.main(["--backend", "sim", "--web.listen-address", "127.0.0.1:0", "--no-probes"]) == 1
        assert time.monotonic() - t0 < 10
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
