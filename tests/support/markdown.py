"""What a reader sees of Markdown the dashboard escaped (dashboard/inert_text.py ``inert``).

Streamlit's AppTest hands back an element's Markdown source, not the text a browser draws: with
every value escaped, ``Right\\-sizing`` reads ``Right-sizing`` on the page. :func:`shown` applies
CommonMark's rule for backslash escapes (an escaped ASCII punctuation character is that character)
and drops the invisible word joiners, so a test compares what a person reads.
"""

from __future__ import annotations

import re
import string

from dashboard.inert_text import JOINER

_ESCAPED = re.compile(r"\\([" + re.escape(string.punctuation) + "])")


def shown(markdown: object) -> str:
    """``markdown``'s text as drawn where none of it is syntax: escapes resolved, joiners removed."""
    return _ESCAPED.sub(r"\1", str(markdown)).replace(JOINER, "")
