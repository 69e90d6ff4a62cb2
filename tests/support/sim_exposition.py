"""A seeded simulated node, sampled on a simulated clock and rendered: the one source of the golden
expositions (tests/golden) and of the dashboard fixtures (tests/fixtures/dashboard).

Everything is deterministic (seed 0, a fake clock, probes waited for each cycle) except two readings
of the wall clock, which are replaced by ``volatile``: the stage durations and the kubelet refresh
timestamp.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator, Sequence

from exporter.cli import make_attributor, make_classifier, make_network
from exporter.config import parse_config
from exporter.node_label import node_label_value
from exporter.probe_scheduler import ProbeOptions, ProbeScheduler
from exporter.render.collector import SnapshotCollector
from exporter.sampler import Sampler
from exporter.sim import Simulation

EPOCH = 1_790_000_000.0
"""Unix time of the simulated clock's zero."""
CYCLES = 15
VOLATILE = ("gpulens_stage_duration_seconds{", "gpulens_podresources_last_success_timestamp_seconds{")
"""Series whose values are wall-clock readings."""


def _probes(simulation: Simulation, tick: list[float]) -> ProbeScheduler:
    # As the demo (results within seconds, the scenario's slow GPU), on the fake clock and seeded.
    options = ProbeOptions(
        enabled=True, first_delay_seconds=simulation.probe_first_delay_seconds, interval_seconds=60.0
    )
    return ProbeScheduler(
        options,
        clock=lambda: tick[0],
        wall=lambda: EPOCH + tick[0],
        runner=simulation.probe_runner(),
        rng=random.Random(0),
    )


@functools.cache
def render(
    scenario: str, cycles: int = CYCLES, probes: bool = False, faults: str = "", volatile: str = "<wallclock>"
) -> str:
    """Exposition of ``scenario`` (seed 0) after ``cycles`` one-second cycles, without a final newline.

    ``probes`` runs the simulated probes; ``faults`` is a ``--sim.faults`` spec. Seeded on a fake
    clock, so the same arguments give the same text: it is kept per process, and the tests that
    read one scenario (golden, promtool, catalogue) simulate it once."""
    (last,) = render_cycles(scenario, cycles, probes, faults, volatile, last_only=True)
    return last


def render_cycles(
    scenario: str,
    cycles: int = CYCLES,
    probes: bool = False,
    faults: str = "",
    volatile: str = "<wallclock>",
    args: Sequence[str] = (),
    last_only: bool = False,
) -> Iterator[str]:
    """The exposition of ``scenario`` (seed 0) after each of ``cycles`` one-second cycles, as
    ``render`` gives the last one: what a scraper taking one page per cycle would read.

    ``args``: more exporter flags (``--no-collect.nic``, say); ``last_only``: render the last
    cycle's page only (nothing a page shows depends on the pages rendered before it, and rendering
    was half of each cycle's time)."""
    cfg = parse_config(["--backend", "sim", "--sim.scenario", scenario, "--no-probes", *args], env={})
    simulation = Simulation.create(scenario, seed=0, faults=faults)
    tick = [0.0]
    scheduler = _probes(simulation, tick) if probes else None
    network = make_network(cfg, simulation)
    sampler = Sampler(
        simulation.backend,
        attributor=make_attributor(cfg, simulation, network),
        classifier=make_classifier(cfg),
        probes=scheduler,
        network=network,
        clock=lambda: tick[0],
        wall=lambda: EPOCH + tick[0],
    )
    # The exporter's own encoder: byte for byte what prometheus_client writes for the same families
    # (tests/test_exposition.py), at a seventh of the cost.
    # Labelled as the exporter labels a simulated node without --kubernetes.node-name: the scenario's
    # name, never this machine's host name.
    node = node_label_value(cfg.node_name, scenario)
    collector = SnapshotCollector(sampler.latest, backend="sim", wall=lambda: EPOCH + tick[0], node=node)
    try:
        for k in range(cycles):
            sampler.run_once()
            if scheduler is not None:
                assert scheduler.wait_until_idle(10.0), "a simulated probe did not finish"
            tick[0] += 1.0
            if last_only and k < cycles - 1:
                continue
            text = collector.exposition(openmetrics=False)
            yield "\n".join(
                line.rsplit(" ", 1)[0] + f" {volatile}" if line.startswith(VOLATILE) else line
                for line in text.splitlines()
            )
    finally:
        sampler.stop()


DASHBOARD_FIXTURES: dict[str, str] = {
    "h200x8": "xid=3:79;transient=power_watts:2",
    "mig": "",
    "timeslice": "",
    "mps": "",
    "p5en": "",
    "p5en-nogdr": "",
    "jobs-0": "",
    "jobs-1": "",
    "dra": "",
}
"""Scenarios with a scrape in tests/fixtures/dashboard (the dashboard's tests read them), and the
simulated faults each has: the h200x8 node shows an Xid and NVML errors on its health page; the
p5en nodes (32 EFAs each, GPUDirect RDMA ready on ``p5en`` and not on ``p5en-nogdr``) fill the
Network page; the two jobs nodes (four two-node jobs) fill the Jobs pages; the dra node's GPUs
come through ResourceClaims (and a ComputeDomain channel is left out)."""


def dashboard_fixture(scenario: str) -> str:
    """A scrape of the simulated ``scenario`` for the dashboard's tests: every family the simulator
    exports, probes and the scenario's faults included, with fixed stand-ins for the wall-clock
    readings (1 ms per stage, the kubelet refreshed at the last cycle)."""
    text = render(scenario, probes=True, faults=DASHBOARD_FIXTURES[scenario])
    stamp = f"{EPOCH + CYCLES - 1:.1f}"
    kubelet = f'gpulens_podresources_last_success_timestamp_seconds{{node="{scenario}"}}'
    text = text.replace(f"{kubelet} <wallclock>", f"{kubelet} {stamp}")
    return text.replace("<wallclock>", "0.001") + "\n"
