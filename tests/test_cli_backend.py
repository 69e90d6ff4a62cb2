"""The default backend is NVML and a node that cannot read its GPUs exits instead of serving."""

from __future__ import annotations

import socket
import sys

import pytest

from exporter import cli
from exporter.config import parse_config
from tests.fakes.fake_pynvml import FakeNvml, code
from tests.support.net import free_port


def _no_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([])
    fake.init_error = code("LIBRARY_NOT_FOUND")
    monkeypatch.setitem(sys.modules, "pynvml", fake)


def test_the_default_backend_is_nvml() -> None:
    assert parse_config([], env={}).backend == "nvml"


def test_without_a_driver_the_exporter_exits_1_naming_the_cause_and_serves_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _no_driver(monkeypatch)
    port = free_port()
    assert cli.main(["--web.listen-address", f"127.0.0.1:{port}", "--no-probes"]) == 1
    err = capsys.readouterr().err
    assert "--backend nvml: cannot read the GPUs" in err and "--backend sim" in err
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "nothing may listen"


def test_auto_still_falls_back_to_the_simulator_when_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_driver(monkeypatch)
    backend = cli.make_backend(parse_config(["--backend", "auto"], env={}))
    try:
        assert backend.name == "sim"
    finally:
        backend.close()
