"""No label value or URL parameter reaches Streamlit's Markdown as it is (issue 51, defects 2 and 3).

Two checks: the escape itself (dashboard/inert_text.py ``inert``), read back by CommonMark's and
GFM's rules and Streamlit's own extensions; and a lint over every module under dashboard/ that
draws with Streamlit: each text that Streamlit renders as Markdown (``st.markdown``, captions,
alerts, headers, metric labels and values, radio options, page-link and widget labels, every
``help`` tooltip) is a constant, an ``inert(...)`` call, or an f-string / ``+`` / conditional of
those whose every placeholder is ``inert(...)``, a number with a numeric format, a number-only
formatter (``ui.fmt_duration``…) or a code constant (``UPPER_CASE``); a text passed on as it
was checked where it was written says so on its line (``# inert: why``). Anything else is flagged:
the lint reads the syntax, not the data flow, so a sentence built elsewhere from label values is
passed through ``inert`` where it is drawn (the modules that build sentences, gpu_panels and
frames, return plain text, never Markdown). The browser test over every page
(tests/test_dashboard_browser_hostile.py) is the proof in the real renderer.
"""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from dashboard.inert_text import inert
from tests.support.markdown import shown

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "dashboard"

HOSTILE = (
    "[Reset password](http://evil.test/) ![b](http://evil.test/beacon.png)",
    "<img src=http://evil.test/x.png> <b>bold</b> <a href='http://evil.test'>a</a>",
    "bare http://evil.test/x, www.evil.test and mail@evil.test",
    ":skull: :material/home: :red[red] :streamlit: :Streamlit $x^2$ $$y$$ http: a:",
    "# heading\n- item\n1. one\n| a | b |\n|---|---|\n> quote\n```\ncode\n```",
    "**bold** _it_ `code` ~~strike~~ &amp; &#60; \\[x] \\",
    "a\r\nb\tc\x00d\u2028e\u2029f",
)

# --- the escape (tests.support.markdown.shown: CommonMark's escapes resolved, joiners dropped) ----


@pytest.mark.parametrize("value", HOSTILE)
def test_the_escaped_text_shows_the_original_characters_on_one_line(value: str) -> None:
    flat = re.sub(r"[\x00-\x1f\x7f\u2028\u2029]", " ", value)
    assert shown(inert(value)) == flat


@pytest.mark.parametrize("value", HOSTILE)
def test_no_markdown_syntax_survives_the_escape(value: str) -> None:
    out = inert(value)
    # every ASCII punctuation character is escaped: nothing CommonMark or GFM reads as syntax is left
    bare = re.sub(r"\\[" + re.escape(string.punctuation) + "]", "", out)
    assert not set(bare) & set(string.punctuation), out
    assert "\n" not in out and "\r" not in out and "\t" not in out
    # the patterns found in text after escapes are resolved (GFM's literal autolinks, Streamlit's
    # logo) match nothing
    text = out.replace("\\", "")
    assert not re.search(r"https?://|(?i:www)\.|[-.\w+]@[-\w]|(?i::streamlit)", text), text


def test_plain_words_are_left_alone() -> None:
    """Escapes only, no joiner, where no pattern needs one: an address copies from the page as it reads."""
    assert inert("gpu-3 GPU 7 ready") == "gpu\\-3 GPU 7 ready"
    assert inert("node-1:9445 GPU 3: compute") == "node\\-1\\:9445 GPU 3\\: compute"
    assert inert(12.5) == "12\\.5"
    assert inert("München — 東京") == "München — 東京"


def test_a_lone_surrogate_becomes_a_replacement_character() -> None:
    assert inert("a\ud800b") == "a\ufffdb"


# --- the lint ------------------------------------------------------------------------------------

MARKDOWN_ARGS: dict[str, tuple[int, ...]] = {
    # Streamlit call -> positions of the arguments it renders as Markdown
    "markdown": (0,),
    "caption": (0,),
    "info": (0,),
    "warning": (0,),
    "error": (0,),
    "success": (0,),
    "exception": (0,),
    "toast": (0,),
    "title": (0,),
    "header": (0,),
    "subheader": (0,),
    "write": (0, 1, 2, 3),
    "metric": (0, 1, 2),
    "page_link": (1,),
    "link_button": (0,),
    "button": (0,),
    "download_button": (0,),
    "expander": (0,),
    "popover": (0,),
    "status": (0,),
    "tabs": (0,),
    "radio": (0, 1),
    "pills": (0, 1),
    "segmented_control": (0, 1),
    "selectbox": (0,),
    "multiselect": (0,),
    "select_slider": (0,),
    "slider": (0,),
    "checkbox": (0,),
    "toggle": (0,),
    "text_input": (0,),
    "number_input": (0,),
    "date_input": (0,),
    "time_input": (0,),
    "no_data": (0,),  # dashboard.ui.no_data: an info box
}
MARKDOWN_KEYWORDS = frozenset({"body", "label", "help", "caption", "placeholder"})
"""Keyword arguments Streamlit renders as Markdown (``label`` of the calls above, and ``value`` and
``delta`` of ``metric``; ``help`` of every element, column settings included)."""
METRIC_KEYWORDS = frozenset({"value", "delta"})
SAFE_CALLS = frozenset(
    {
        "inert",
        "len",
        "int",
        "float",
        "round",
        "sum",
        "fmt_duration",
        "fmt_time",
        "fmt_bytes",
        "fmt_rate",
        "fmt_bitrate",
        "fmt_percent",  # ui.fmt_percent: a ratio as "96 %"
        "fmt_line_rate",  # ui.fmt_line_rate: "100 Gb/s (12.5 GB/s)"
        "collecting_words",  # definitions.collecting_words: "collecting (14 s of 5 m)"
        "over",  # ui.over: a span of time in words
        "devices",  # ui.devices: counts of GPUs and MIG slices in words
        "format_number",
    }
)
"""Calls whose result is Markdown-safe: the escape, numbers, and formatters of numbers and times."""
NUMERIC_SPEC = re.compile(r"^[<>=^]?[+\- ]?#?0?\d*(?:[,_](?:\.\d+)?[bdeEfFgGnoxX%]?|[,_]?(?:\.\d+)?[bdeEfFgGnoxX%])$")
"""A format spec a string refuses (``,``, ``.0f``, ``.1%``): the value is a number."""
NOT_STREAMLIT = frozenset({"parser", "p", "log", "logger", "logging", "warnings", "gpu_panels"})
"""Receivers of calls named like Streamlit's that are not Streamlit (argparse, logging, the GPU
page's header builder)."""


PRAGMA = "# inert:"
"""A line that passes on a text already checked where it was written (a caller's column setting)
says so, with the reason: ``help=setting.get("help"),  # inert: the caller's setting``."""


def _safe(node: ast.expr) -> bool:
    """True when ``node``'s value cannot carry Markdown from outside the code."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.JoinedStr):
        return all(_safe(v) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        spec = ast.unparse(node.format_spec)[2:-1] if node.format_spec else ""
        numeric = bool(spec) and NUMERIC_SPEC.match(spec) is not None and node.conversion == -1
        return numeric or _safe(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _safe(node.left) and _safe(node.right)
    if isinstance(node, ast.IfExp):
        return _safe(node.body) and _safe(node.orelse)
    if isinstance(node, ast.BoolOp):
        return all(_safe(v) for v in node.values)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
        return name in SAFE_CALLS
    if isinstance(node, ast.Name):
        return node.id.isupper()
    if isinstance(node, ast.Attribute):
        return node.attr.isupper()
    if isinstance(node, ast.List | ast.Tuple):
        return all(_safe(e) for e in node.elts)
    return False


def unescaped_markdown(code: str, path: str = "<code>") -> list[str]:
    """``line: call`` for every argument Streamlit renders as Markdown that is not :func:`_safe`."""
    out = []
    lines = code.splitlines()
    for node in ast.walk(ast.parse(code, path)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        method = node.func.attr
        receiver = node.func.value
        if isinstance(receiver, ast.Name) and receiver.id in NOT_STREAMLIT:
            continue
        args: list[ast.expr] = []
        if method in MARKDOWN_ARGS:
            args += [a for i, a in enumerate(node.args) if i in MARKDOWN_ARGS[method]]
            words = MARKDOWN_KEYWORDS | (METRIC_KEYWORDS if method == "metric" else frozenset())
            args += [k.value for k in node.keywords if k.arg in words]
        else:  # a column setting's header is canvas text; every element's help is Markdown
            args += [k.value for k in node.keywords if k.arg == "help"]
        for a in args:
            if not _safe(a) and PRAGMA not in lines[a.lineno - 1]:
                out.append(f"{path}:{a.lineno}: {method}(... {ast.unparse(a)[:100]} ...)")
    return out


STREAMLIT_MODULES = sorted(p for p in DASHBOARD.rglob("*.py") if "import streamlit" in p.read_text())


def test_the_lint_finds_a_value_put_into_markdown() -> None:
    bad = (
        "import streamlit as st\n"
        "def page(name, mig, exc, row):\n"
        "    st.caption(f'Opened for MIG instance {mig}')\n"
        "    st.subheader(name)\n"
        "    st.info(str(exc))\n"
        "    st.metric('Pods', row['pod'])\n"
        "    c1.markdown('**' + name + '**')\n"
        "    st.column_config.TextColumn(name, help=f'of {name}')\n"
        "    st.warning(f'{name:>10}')\n"
    )
    found = unescaped_markdown(bad)
    assert [f.split(":")[1] for f in found] == ["3", "4", "5", "6", "7", "8", "9"], found
    good = (
        "import streamlit as st\n"
        "def page(name, n, ctx):\n"
        "    st.caption(f'Opened for MIG instance {inert(name)}; {n:,} GPUs over {ui.over(ctx)}')\n"
        "    st.subheader(inert(name))\n"
        "    st.metric('Pods', f'{n:,}', help=f'last {definitions.MEAN_WINDOW}')\n"
        "    c1.markdown('**' + inert(name) + '**' if n else inert(name))\n"
        "    st.column_config.TextColumn(name, help='the node')\n"
        "    st.dataframe(frame, column_config={'a': st.column_config.TextColumn(name)})\n"
    )
    assert unescaped_markdown(good) == []


def test_the_lint_reads_every_module_that_draws() -> None:
    names = {p.relative_to(REPO).as_posix() for p in STREAMLIT_MODULES}
    assert {"dashboard/ui.py", "dashboard/app.py", "dashboard/views/gpu.py", "dashboard/views/job.py"} <= names


@pytest.mark.parametrize("path", STREAMLIT_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_value_drawn_as_markdown_goes_through_inert(path: Path) -> None:
    found = unescaped_markdown(path.read_text(), str(path.relative_to(REPO)))
    assert found == [], "put these through dashboard.inert_text.inert:\n" + "\n".join(found)
