"""The default backend is NVML and a node that cannot read its GPUs exits instead of serving."""

from __future__ import annotations

import socket
import sys

import pytest

from exporter import cli
from exporter.config import parse_config
from tests.fakes.fake_pynvml import FakeNvml, code
from tests.support.net import free_port
from tests.support.nvml_node import h200


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


@pytest.mark.parametrize(("argv", "gpm"), [([], True), (["--no-collect.gpm"], False)])
def test_the_gpm_switch_reaches_the_nvml_backend(monkeypatch: pytest.MonkeyPatch, argv: list[str], gpm: bool) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([h200(0, gpm={2: 50.0})]))
    backend = cli.make_backend(parse_config(argv, env={}))
    try:
        backend.sample()
        second = backend.sample()
        assert second.gpm_supported is gpm
        assert (second.gpus[0].leaves[0].gpm is not None) is gpm
    finally:
        backend.close()


@pytest.mark.parametrize(("argv", "gpm"), [([], True), (["--no-collect.gpm"], False)])
def test_the_gpm_switch_reaches_the_simulator(argv: list[str], gpm: bool) -> None:
    backend = cli.make_backend(parse_config(["--backend", "sim", *argv], env={}))
    try:
        backend.sample()
        second = backend.sample()
        assert backend.name == "sim"
        assert all((leaf.gpm is not None) is gpm for g in second.gpus for leaf in g.leaves)
    finally:
        backend.close()
