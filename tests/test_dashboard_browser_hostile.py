"""Tenants' names and crafted URLs never become the dashboard's own links, images or markup (issue 51,
defects 2 and 3), in headless Chromium over every page.

Three exporters are served from copies of the dashboard fixtures (a jobs node with NICs, a MIG node,
a DRA node) in which every name a tenant or an operator chooses carries Markdown and HTML: a link, an
image on another host, an ``<img>`` tag, bare ``http://`` and ``www.`` addresses, an e-mail address,
an emoji, a Material icon and a colour shortcode, LaTeX and emphasis. Pods, namespaces, owners and
their kinds, containers, GPU and MIG UUIDs, NIC and DRA devices, claims, pools and the node. The
dashboard scrapes them itself (the source whose node is the series' own ``node`` label), and every
page is opened once with the same Markdown in each of its URL parameters (the sidebar's filters and
range, the GPU page's ``uuid``/``mig_uuid``, the Job page's ``job``/``job_cluster``); the GPU page
for a GPU a hostile workload holds, and the Job page for a hostile job and for a crafted one. On
Fleet a chart's tooltip is opened over a GPU hostile pods hold (chart labels and tooltips are text,
not Markdown: they show names as they are).

A page fails on any link (``a[href]``) or image whose address is not the dashboard's own, any
request to another host, a LaTeX formula, an emoji or icon drawn from a name's shortcode, a
Streamlit exception, or a Markdown link shown as anything but its own characters. Screenshots land
in artifacts/dashboard/hostile-*.png.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlencode

import pytest

from tests.fixtures.dashboard.fake_prometheus import FIXTURES, serve_exposition
from tests.support.browser import CHART, PageWatch, chromium_page, load, run_dashboard

pytestmark = [pytest.mark.integration, pytest.mark.long]

EVIL = "evil.test"


def linky(what: str) -> str:
    """Markdown and HTML with addresses on another host, named by ``what`` (so a request or a link
    found says which value carried it); no ``"`` or ``\\`` (an exposition escapes them)."""
    return (
        f"[Reset {what}](http://{EVIL}/{what}) ![b](http://{EVIL}/{what}.png) "
        f"<img src=http://{EVIL}/{what}-tag.png> http://{EVIL}/bare-{what} :material/home: "
    ) + slashless(what)


def slashless(what: str) -> str:
    """Markdown without ``/``, for the parts of a job's ``namespace/Kind/name`` that cannot hold one:
    a ``www.`` and an e-mail autolink, an emoji, a colour, LaTeX, emphasis and a heading."""
    return f"www.{EVIL} {what}@{EVIL} :skull: :red[red] $x^2$ **{what}** # "


LINKY_LABELS = ("pod", "container", "workload", "uuid", "peer_uuid", "mig_uuid", "device", "claim_name", "pool")
"""Labels that take :func:`linky` as a prefix of their value (each value stays distinct)."""
SLASHLESS_LABELS = ("namespace", "workload_kind", "claim_namespace")
SOURCES = ("jobs-0.prom", "mig.prom", "dra.prom")
"""A node of two-node jobs with 32 EFA NICs, a MIG node, a DRA node."""
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{.*\})?(\s.*)$")


def hostile(text: str, node: str) -> str:
    """``text`` (an exposition) with :data:`LINKY_LABELS` and :data:`SLASHLESS_LABELS` prefixed by
    hostile Markdown (an empty value stays empty: it means absent) and ``node`` on every sample, in
    place of the exporter's own."""

    def label(m: re.Match[str]) -> str:
        name, value = m.group(1), m.group(2)
        if value and name in LINKY_LABELS:
            value = linky(name) + value
        elif value and name in SLASHLESS_LABELS:
            value = slashless(name) + value
        return f'{name}="{value}"'

    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if line.startswith("#") or not m:
            out.append(line)
            continue
        name, labels, rest = m.group(1), (m.group(2) or "{}")[1:-1], m.group(3)
        # the exporter's own node label gives way to the hostile one (one node label per sample)
        labels = ",".join(_LABEL.sub(label, m.group(0)) for m in _LABEL.finditer(labels) if m.group(1) != "node")
        labels = f'node="{node}"' + ("," + labels if labels else "")
        out.append(f"{name}{{{labels}}}{rest}")
    return "\n".join(out) + "\n"


@pytest.fixture(scope="module")
def hostile_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A dashboard scraping the three hostile exporters: (its URL, the folder of their expositions)."""
    folder = tmp_path_factory.mktemp("hostile")
    files = []
    for i, name in enumerate(SOURCES):
        path = folder / name
        path.write_text(hostile((FIXTURES / name).read_text(), linky("node") + f"node-{i}"))
        files.append(str(path))
    with ExitStack() as es:
        targets = es.enter_context(serve_exposition(*files))  # absolute paths: FIXTURES / path is path
        dash = es.enter_context(run_dashboard("--scrape", ",".join(targets), "--scrape-interval", "1"))
        yield dash, folder


def _first(exposition: str, metric: str, label: str, where: tuple[str, str] | None = None) -> str:
    """The value of ``label`` on the first ``metric`` sample (with ``where``'s label value) of an exposition."""
    for line in exposition.splitlines():
        if line.startswith(metric + "{"):
            labels = dict(_LABEL.findall(line))
            if where is None or labels.get(where[0]) == where[1]:
                return labels[label]
    raise AssertionError(f"no {metric} with {label}")


FOREIGN_ELEMENTS_JS = """
() => {
  const here = location.host;
  const out = [];
  for (const a of document.querySelectorAll('a[href]')) {
    const u = new URL(a.getAttribute('href'), location.href);
    const inert = ['data:', 'blob:', 'about:'].includes(u.protocol);
    if (u.protocol === 'javascript:' || (u.host !== here && !inert))
      out.push('a link to ' + a.href + ' reading ' + JSON.stringify(a.innerText.slice(0, 80)));
  }
  for (const img of document.querySelectorAll('img, image, source, video, audio, iframe')) {
    const src = img.getAttribute('src') || img.getAttribute('href') || '';
    if (!src) continue;
    const u = new URL(src, location.href);
    if (u.host !== here && !['data:', 'blob:'].includes(u.protocol))
      out.push('an image from ' + u.href);
  }
  const katex = document.querySelectorAll('.katex').length;
  if (katex) out.push(katex + ' LaTeX formula(s) drawn');
  const icons = document.querySelectorAll('[data-testid="stMarkdownContainer"] span[aria-label="home icon"]').length;
  if (icons) out.push(icons + ' Material icon(s) "home" drawn from a shortcode');
  const colours = document.querySelectorAll('.stMarkdownColoredText').length;
  if (colours) out.push(colours + ' coloured span(s) drawn from a :red[...] directive');
  return out;
}
"""
"""JavaScript: what a hostile name may not become on the page (links and images of other hosts,
LaTeX, an icon or a colour from a shortcode; the dashboard itself draws neither in Markdown)."""


SHOWN = {
    "gpu": ["Held by", f"[Reset workload](http://{EVIL}/workload)", "Opened for MIG instance [Reset param]"],
    "job": ["Its GPUs now", f"PyTorchJob in namespace www.{EVIL}"],
    "job-crafted": [f"/[Reset param](http://{EVIL}/param)", "holds no GPU now"],
    "jobs": ["Jobs by GPU-hours"],
    "network": ["[Reset node](http"],
    "fleet": ["held by", f"[Reset pod](http://{EVIL}/pod)"],
}
"""Texts each page must show (the GPU a hostile workload holds, the hostile job found, the crafted
one named as it is, the heatmap's tooltip naming hostile pods), so that a page that drew none of the
names cannot pass."""


def page_problems(page: object, shown: list[str]) -> list[str]:
    """What a hostile name or parameter made of the loaded page; and each of ``shown`` missing."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    out: list[str] = list(page.evaluate(FOREIGN_ELEMENTS_JS))
    text = page.locator("body").inner_text().replace("\u2060", "")
    out += [f"not on the page: {t!r}" for t in shown if t not in text]
    if "\N{SKULL}" in text:
        out.append("the emoji :skull: drawn from a shortcode")
    # a Markdown link is shown as its characters, "[Reset pod](http://…": a drawn one reads "Reset pod "
    # (a cell or a selectbox may cut it short with "…", or wrap it)
    out += [f"a link drawn from Markdown: {m.group(0)!r}" for m in re.finditer(r"Reset \w+ ", text)]
    exceptions = page.locator('[data-testid="stException"]')
    out += [f"Streamlit exception: {exceptions.nth(i).inner_text()[:300]}" for i in range(exceptions.count())]
    return out


def _urls(dash: str, folder: Path) -> dict[str, str]:
    """Every page (a name for its screenshot -> URL), each with hostile Markdown in every parameter
    it reads."""
    crafted = linky("param")
    common = {p: crafted for p in ("cluster", "node", "instance", "namespace", "range", "from", "to")}
    jobs = (folder / "jobs-0.prom").read_text()
    held = _first(jobs, "gpulens_pod_gpu_allocation", "uuid")
    ns, kind, name = (_first(jobs, "gpulens_pod_gpu_allocation", k) for k in ("namespace", "workload_kind", "workload"))
    pages = ("", "efficiency", "workloads", "jobs", "sharing", "health", "serving", "rightsizing", "network")
    urls = {path or "fleet": f"{dash}/{path}?{urlencode(common)}" for path in pages}
    urls["gpu"] = f"{dash}/gpu?" + urlencode({**common, "uuid": held, "mig_uuid": crafted})
    urls["job"] = f"{dash}/job?" + urlencode({**common, "job": f"{ns}/{kind}/{name}"})
    urls["job-crafted"] = f"{dash}/job?" + urlencode(
        {**common, "job": f"{slashless('ns')}/{slashless('kind')}/{crafted}", "job_cluster": crafted}
    )
    return urls


def test_no_name_or_url_parameter_becomes_a_link_an_image_or_markup(
    hostile_dashboard: tuple[str, Path], artifacts_dir: Path
) -> None:
    dash, folder = hostile_dashboard
    out = artifacts_dir / "dashboard"
    out.mkdir(exist_ok=True)
    found: dict[str, list[str]] = {}
    with chromium_page() as page:
        from playwright.sync_api import Page

        assert isinstance(page, Page)
        watch = PageWatch(page, dash)
        load(page, f"{dash}/?range=15m")  # the scraper's first scrapes, before the pages are read
        page.wait_for_timeout(3000)
        for name, url in _urls(dash, folder).items():
            load(page, url)
            if name == "fleet":  # a chart's tooltip (vega-tooltip) over a GPU that hostile pods hold
                page.locator(f"{CHART} svg.marks g.mark-rect.role-mark path").first.hover()
                page.locator("#vg-tooltip-element").wait_for(timeout=10000)
            page.wait_for_timeout(500)  # an image's request goes out after the render
            page.screenshot(path=str(out / f"hostile-{name}.png"), full_page=True)
            seen = page_problems(page, SHOWN.get(name, [])) + [
                p for p in watch.problems() if "request to another host" in p
            ]
            watch.foreign_requests.clear()
            if seen:
                found[name] = seen
    lines = [f"{name}: {p}" for name, problems in found.items() for p in sorted(set(problems))]
    (artifacts_dir / "hostile-findings.txt").write_text("\n".join(lines) + "\n")
    assert found == {}, "\n".join(lines)


def test_the_hostile_exposition_keeps_every_sample() -> None:
    """The copy changes label values only: as many samples, each with the node and its prefix."""
    text = (FIXTURES / "dra.prom").read_text()
    out = hostile(text, "n")
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    changed = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(changed) == len(samples) and all(line.split("{", 1)[1].startswith('node="n"') for line in changed)
    assert any(f'claim_name="{linky("claim_name")}' in line for line in changed)
