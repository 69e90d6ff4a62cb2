"""Build gpulens's Grafana dashboards (deploy/grafana/gpulens-*.json) with Grafana's typed SDK.

Role: turns the boards ``scripts/grafana_panels/`` declares into Grafana's JSON model through
``grafana-foundation-sdk`` (builders generated from Grafana's schema, a ``dev`` dependency: this
runs at build time, never in the exporter). ``scripts/render_manifests.py`` writes the files (and
the chart's copies) and its ``--check`` fails when they drift; ``python scripts/grafana_dashboard.py
--markdown`` prints the list of dashboards and panels docs/grafana.md holds.

Every board has the same variables (data source, cluster, node, GPU index ``gpu`` as Grafana
dashboard 12239 users pick it: node first, then the GPU, and namespace), a link bar to the other
boards that keeps the time range and the variables, and rows of panels. Tables are instant queries
aggregated ``by`` the columns they show, organised (``Time``, ``__name__`` and target labels hidden,
headers renamed, columns ordered) and sorted. A target marked ``limit`` (a GPU's own limit) is drawn
dashed. No datasource UID is written: every panel uses the ``${datasource}`` variable.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m

HERE = Path(__file__).resolve().parent


def _sibling(name: str) -> Any:
    """scripts/ is not a package: the sibling package ``name`` (a folder) loaded from its files, once."""
    if name not in sys.modules:
        folder = HERE / name
        spec = importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its modules import one another relatively, through this entry
        spec.loader.exec_module(module)
    return sys.modules[name]


panels = _sibling("grafana_panels")
Board, Panel, Table, Target = panels.Board, panels.Panel, panels.Table, panels.Target
BOARDS: tuple[Any, ...] = panels.BOARDS

DATASOURCE = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "gpulens"
SCHEMA_VERSION = 39
"""Grafana 10's dashboard schema version (the SDK's builder writes 36; Grafana migrates either)."""
HIDDEN = ("Time", "__name__", "job", "instance", "cluster", "endpoint", "service", "uuid", "mig_uuid")
"""Fields a table never shows: the sample time, the metric name and target labels. ``cluster`` is in
every ``by`` (rows of two clusters stay apart) but hidden: the Cluster variable says which are in view."""
LIMIT_STYLE = (
    dash_m.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
    dash_m.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
    dash_m.DynamicConfigValue(id_val="custom.lineWidth", value=1),
)


def file_name(board: Any) -> str:
    """The board's file under deploy/grafana/ (and the chart's files/grafana/)."""
    return f"{board.uid}.json"


# --- variables -------------------------------------------------------------------------------------
def _variable(name: str, label: str, query: str, single: bool = False) -> dash_b.QueryVariable:
    """A query variable: multi-valued with "All" (sent as ``.*``), or, ``single``, one value (Grafana
    selects the first); GPU indices sorted as numbers."""
    sort = dash_m.VariableSort.NUMERICAL_ASC if name == "gpu" else dash_m.VariableSort.ALPHABETICAL_ASC
    v = (
        dash_b.QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(sort)
    )
    if single:
        return v.include_all(False).multi(False)
    all_ = dash_m.VariableOption(selected=True, text=["All"], value=["$__all"])
    return v.include_all(True).multi(True).all_value(".*").current(all_)


VARIABLE_QUERIES: tuple[tuple[str, str, str], ...] = (
    ("cluster", "Cluster", "label_values(gpulens_up, cluster)"),
    ("node", "Node", 'label_values(gpulens_up{cluster=~"$cluster"}, node)'),
    ("gpu", "GPU", 'label_values(gpulens_gpu_info{cluster=~"$cluster", node=~"$node"}, gpu)'),
    (
        "namespace",
        "Namespace",
        'label_values(gpulens_pod_gpu_allocation{cluster=~"$cluster", node=~"$node"}, namespace)',
    ),
)
"""(name, label, query) of the query variables: the GPU by its index on the chosen node(s), as 12239."""


def _variables(single: Sequence[str] = ()) -> list[Any]:
    source = dash_b.DatasourceVariable("datasource").label("Data source").type("prometheus")
    return [source, *(_variable(*v, single=v[0] in single) for v in VARIABLE_QUERIES)]


# --- panels ----------------------------------------------------------------------------------------
def value_field(refid: str, targets: int) -> str:
    """The name Grafana gives a query's value column in a table (format table, instant): ``Value``
    for a panel of one query, ``Value #A`` etc. for several."""
    return "Value" if targets == 1 else f"Value #{refid}"


def _refid(i: int) -> str:
    return chr(ord("A") + i)


def _mapping(words: Mapping[str, str]) -> list[dash_m.ValueMapping]:
    """Grafana value mappings: each raw value shown as its words."""
    options = {raw: dash_m.ValueMappingResult(text=text, index=i) for i, (raw, text) in enumerate(words.items())}
    return [dash_m.ValueMap(options=options)]


def _organize(spec: Any, n: int) -> dict[str, Any]:
    """The ``organize`` options of a table: hidden fields, column order, headers."""
    if len(spec.values) != n:
        raise ValueError(f"{n} queries but {len(spec.values)} value headers")
    values = [(value_field(_refid(i), n), header) for i, header in enumerate(spec.values)]
    order = [*(label for label, _ in spec.columns), *(name for name, header in values if header)]
    return {
        "excludeByName": {**dict.fromkeys(HIDDEN, True), **{name: True for name, header in values if header is None}},
        "indexByName": {name: i for i, name in enumerate(order)},
        "renameByName": {**dict(spec.columns), **{name: header for name, header in values if header}},
    }


def _query(target: Any, i: int, kind: str) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(target.expr).ref_id(_refid(i)).datasource(DATASOURCE)
    q = q.legend_format(target.legend) if target.legend else q
    q = q.instant() if target.instant else q.range()
    return q.format(prom_m.PromQueryFormat.TABLE) if kind == "table" else q


def _legend() -> common_b.VizLegendOptions:
    return (
        common_b.VizLegendOptions()
        .display_mode(common_m.LegendDisplayMode.TABLE)
        .placement(common_m.LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["mean", "max", "lastNotNull"])
    )


def _tooltip() -> common_b.VizTooltipOptions:
    return common_b.VizTooltipOptions().mode(common_m.TooltipDisplayMode.MULTI).sort(common_m.SortOrder.DESCENDING)


def _reduce() -> common_b.ReduceDataOptions:
    return common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False)


def _builder(panel: Any) -> Any:
    """The SDK builder of ``panel``'s kind, with the options that kind needs."""
    if panel.kind == "timeseries":
        return timeseries.Panel().legend(_legend()).tooltip(_tooltip()).fill_opacity(0)
    if panel.kind == "state-timeline":
        band = statetimeline.Panel().legend(_legend()).tooltip(_tooltip())
        return band.show_value(common_m.VisibilityMode.NEVER).line_width(0).fill_opacity(70)
    if panel.kind == "stat":
        big = stat.Panel().reduce_options(_reduce()).graph_mode(common_m.BigValueGraphMode.NONE)
        if panel.options.get("textMode") == "value_and_name":
            big = big.text_mode(common_m.BigValueTextMode.VALUE_AND_NAME).color_mode(common_m.BigValueColorMode.NONE)
            big = big.orientation(common_m.VizOrientation.HORIZONTAL)
        return big
    if panel.kind == "bargauge":
        return (
            bargauge.Panel()
            .reduce_options(_reduce())
            .orientation(common_m.VizOrientation.HORIZONTAL)
            .display_mode(common_m.BarGaugeDisplayMode.BASIC)
        )
    if panel.kind == "table":
        if panel.table is None:
            raise ValueError(f"table panel {panel.title!r} has no Table (columns, headers)")
        sort: list[Any] = [common_b.TableSortByFieldState().display_name(panel.table.sort).desc(panel.table.desc)]
        return table.Panel().show_header(True).sort_by(sort if panel.table.sort else [])
    raise ValueError(f"panel {panel.title!r}: unknown kind {panel.kind!r}")


def _link(uid: str, title: str) -> dash_b.DashboardLink:
    return (
        dash_b.DashboardLink(title)
        .type(dash_m.DashboardLinkType.LINK)
        .url(f"/d/{uid}?${{__url_time_range}}&${{__all_variables}}")
        .keep_time(True)
        .include_vars(True)
    )


def panel_builder(panel: Any, pid: int, titles: Mapping[str, str]) -> Any:
    """One panel as an SDK builder; ``titles``: board uid -> title (for a panel's link)."""
    b = _builder(panel).id(pid).title(panel.title).datasource(DATASOURCE).span(panel.width).height(panel.height)
    b = b.description(panel.description).unit(panel.unit)
    b = b.targets([_query(target, i, panel.kind) for i, target in enumerate(panel.targets)])
    if panel.max is not None:
        b = b.min(0).max(panel.max)
    if panel.no_value:
        b = b.no_value(panel.no_value)
    if panel.mappings:
        b = b.mappings(_mapping(panel.mappings))
    if panel.link:
        b = b.links([_link(panel.link, f"Open {titles[panel.link]}")])
    for i, target in enumerate(panel.targets):
        if target.limit:
            b = b.override_by_query(_refid(i), list(LIMIT_STYLE))
    if panel.table is not None:
        spec = panel.table
        b = b.transformations(
            [
                *([dash_m.DataTransformerConfig(id_val="merge", options={})] if len(panel.targets) > 1 else []),
                dash_m.DataTransformerConfig(id_val="organize", options=_organize(spec, len(panel.targets))),
            ]
        )
        for header, words in spec.mappings.items():
            b = b.override_by_name(header, [dash_m.DynamicConfigValue(id_val="mappings", value=_mapping(words))])
        for header, unit in spec.units.items():
            b = b.override_by_name(header, [dash_m.DynamicConfigValue(id_val="unit", value=unit)])
    return b


def board_builder(board: Any) -> dash_b.Dashboard:
    """One board as the SDK's Dashboard builder: variables, links to the others, rows of panels."""
    titles = {b.uid: b.title for b in BOARDS}
    d = (
        dash_b.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags([TAG, "gpu", "kubernetes"])
        .editable()
        .tooltip(dash_m.DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .timezone("")
        .refresh("1m")
        .version(1)
        .variables(_variables(board.single))
        .links([_link(b.uid, b.title.removeprefix("gpulens / ")) for b in BOARDS if b.uid != board.uid])
    )
    pid = 1
    for title, row_panels in board.rows:
        d = d.with_row(dash_b.Row(title).id(pid))
        pid += 1
        for panel in row_panels:
            d = d.with_panel(panel_builder(panel, pid, titles))
            pid += 1
    return d


def dashboard(board: Any) -> dict[str, Any]:
    """The board as Grafana's JSON model."""
    doc: dict[str, Any] = json.loads(json.dumps(board_builder(board).build(), cls=JSONEncoder))
    doc["schemaVersion"] = SCHEMA_VERSION
    return doc


def render(board: Any) -> str:
    """The board file's text."""
    return json.dumps(dashboard(board), indent=2) + "\n"


def render_all() -> dict[str, str]:
    """File name -> text of every board."""
    return {file_name(b): render(b) for b in BOARDS}


def expressions(doc: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression in a dashboard JSON model (panel targets and variable queries)."""
    out = [str(t["expr"]) for p in doc["panels"] for t in p.get("targets", [])]
    out += [str(v["query"]) for v in doc["templating"]["list"] if v["type"] == "query"]
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NAME = re.compile(r"\b(?:[a-z_]+:[a-z0-9_]+:[a-z0-9_]+|gpulens_[a-z0-9_]+|ALERTS)\b")


def reads(exprs: Sequence[str]) -> list[str]:
    """The recording rules and series ``exprs`` read, sorted (string literals left out)."""
    return sorted({n for e in exprs for n in _NAME.findall(_STRING.sub('""', e))})


def markdown(boards: Sequence[Any] = BOARDS) -> str:
    """The list of dashboards and their panels with what each reads, for docs/grafana.md."""
    lines: list[str] = []
    for b in boards:
        lines += [f"### {b.title}", "", f"`deploy/grafana/{file_name(b)}` (uid `{b.uid}`): {b.description}", ""]
        lines += ["| row | panel | reads |", "|---|---|---|"]
        for row, row_panels in b.rows:
            for p in row_panels:
                names = ", ".join(f"`{n}`" for n in reads([t.expr for t in p.targets]))
                lines.append(f"| {row} | {p.title} | {names} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        sys.stdout.write(markdown())
    else:
        for name, text in render_all().items():
            sys.stdout.write(f"--- {name}\n{text}")
