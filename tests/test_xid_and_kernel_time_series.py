"""Issue 52, read from the page the exporter serves (``exporter.cli.build``): every GPU's Xid
counter is there at 0 from the first scrape, and the per-process NVML figure is exported under its
true name, ``gpulens_pod_gpu_kernel_time_ratio``, with the old name kept one release, deprecated."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import build
from exporter.config import parse_config

Page = dict[str, list[tuple[dict[str, str], float]]]


def _pages(argv: Sequence[str], cycles: int) -> tuple[list[Page], dict[str, str]]:
    """The page after each of ``cycles`` cycles, and each family's HELP."""
    sampler, exposition, _ = build(parse_config(["--backend", "sim", "--no-probes", *argv], env={}))
    pages: list[Page] = []
    helps: dict[str, str] = {}
    try:
        for _ in range(cycles):
            sampler.run_once()
            page: Page = {}
            for family in text_string_to_metric_families(exposition.render("text/plain")[0].decode()):
                helps[family.name] = family.documentation
                for s in family.samples:
                    page.setdefault(s.name, []).append((s.labels, s.value))
            pages.append(page)
    finally:
        sampler.stop()
    return pages, helps


def _uuids(page: Page) -> set[str]:
    return {labels["uuid"] for labels, _ in page["gpulens_gpu_info"]}


def test_every_gpu_has_an_xid_series_at_zero_from_the_first_scrape_and_keeps_it_after_an_xid() -> None:
    pages, helps = _pages(["--sim.scenario", "h200x8", "--sim.faults", "xid=3:79"], cycles=3)
    first = pages[0]
    zero = {
        labels["uuid"]: value
        for labels, value in first.get("gpulens_gpu_xid_errors_total", [])
        if labels.get("xid", "") == ""
    }
    assert zero == dict.fromkeys(_uuids(first), 0.0), "one series per GPU, at 0, from the first scrape"
    last = pages[-1]["gpulens_gpu_xid_errors_total"]
    coded = [(labels["gpu"], labels["xid"], value) for labels, value in last if labels.get("xid")]
    assert coded == [("3", "79", 1.0)], "a real event is its own series"
    assert sum(1 for labels, value in last if not labels.get("xid") and value == 0.0) == len(_uuids(pages[-1]))
    assert "stays 0 from the first scrape" in helps["gpulens_gpu_xid_errors"]


def test_kernel_time_is_exported_under_its_true_name_and_the_old_name_is_deprecated() -> None:
    pages, helps = _pages(["--sim.scenario", "timeslice"], cycles=3)
    page = pages[-1]
    new = {tuple(sorted(labels.items())): value for labels, value in page["gpulens_pod_gpu_kernel_time_ratio"]}
    old = {tuple(sorted(labels.items())): value for labels, value in page["gpulens_pod_gpu_sm_share_ratio"]}
    assert new and new == old, "the same series under both names for one release"
    assert "not SM activity" in helps["gpulens_pod_gpu_kernel_time_ratio"]
    assert "kernel" in helps["gpulens_pod_gpu_kernel_time_ratio"]
    assert helps["gpulens_pod_gpu_sm_share_ratio"].startswith("Deprecated: use gpulens_pod_gpu_kernel_time_ratio")
