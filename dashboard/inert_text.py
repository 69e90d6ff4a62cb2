"""Text a page shows as it is: the one escape that makes any value inert in Streamlit's Markdown.

Streamlit draws the text of ``st.markdown``, captions, alerts, headers, metric labels and values,
radio options, page links and tooltips (``help``) as GitHub-flavoured Markdown with its own
extensions. A label value (a pod, namespace, workload, node or claim name: a tenant's words) or a URL
parameter put there as it is can become a live link, a remote image the browser fetches, a heading,
a table, LaTeX, an emoji or a coloured span (issue 51). :func:`inert` turns any value into Markdown
that shows exactly its characters, on one line:

- every ASCII punctuation character is backslash-escaped (CommonMark: an escaped punctuation
  character is always literal): links and images, emphasis, code, headings, lists, tables, HTML
  tags, ``<…>`` autolinks, ``$`` LaTeX, ``:colour[…]`` directives and Streamlit's ``:emoji:`` and
  ``:material/…:`` shortcodes never start (Streamlit 1.67 in Chromium, as
  tests/test_dashboard_browser_hostile.py checks);
- GFM's bare ``http://…``, ``www.…`` and ``name@host`` links, and Streamlit's ``:streamlit:`` logo,
  are found in the text *after* escapes are resolved, so a WORD JOINER (U+2060, invisible and
  zero-width) splits them: after a ``:`` followed by ``/`` or ``streamlit`` (or ending the value),
  before the ``.`` of a ``www.`` and before every ``@``. Nowhere else: ``node-1:9445`` and
  ``GPU 3: compute`` copy from the page as they read;
- line breaks and other control characters become spaces (a value never starts a new block), and
  a lone surrogate U+FFFD.

The rendered text reads as the original (a copied string carries a joiner only where it split one
of those patterns). Vega-Lite
labels, tooltips and ``st.dataframe`` cells are not Markdown: they take values as they are, never
through here (an escape there would show its backslashes).
"""

from __future__ import annotations

import re
import string
import unicodedata

JOINER = "\u2060"
"""WORD JOINER: invisible, zero width, no line break; splits the patterns Markdown finds in text."""

_PUNCTUATION = frozenset(string.punctuation)
_BLANK = {"Cc": " ", "Zl": " ", "Zp": " ", "Cs": "\ufffd"}
"""What a character of these Unicode categories becomes: control characters (line breaks, tabs) and
line and paragraph separators a space, a lone surrogate (which no page can send) U+FFFD."""
_WWW = re.compile(r"(?i)(www)(?=\\\.)")
"""``www`` before an (escaped) dot: GFM's literal autolink starts there."""
_COLON = re.compile(r"(?i)(\\:)(?=/|\\/|streamlit|$)")
"""An (escaped) colon before ``/`` (``http://``), before ``streamlit`` (the logo's shortcode, which
Streamlit finds after escapes are resolved), or at the value's end (the text after it is not known)."""


def inert(value: object) -> str:
    """``value`` (``str()`` of it) as Markdown that Streamlit draws as exactly its characters, on
    one line: no link, image, emphasis, heading, list, table, code, HTML, LaTeX, emoji, icon or
    colour can come of it. For a value put into Markdown; never for a chart label or a table cell."""
    out: list[str] = []
    for c in str(value):
        if c in _PUNCTUATION:
            if c == "@":
                out.append(JOINER)
            out.append("\\" + c)
        else:
            out.append(_BLANK.get(unicodedata.category(c), c))
    escaped = _WWW.sub(r"\1" + JOINER, "".join(out))
    return _COLON.sub(r"\1" + JOINER, escaped)
