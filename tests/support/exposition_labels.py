"""Reading one family of an exposition by one label, whatever other labels its series carry (every
series has ``node`` since the exporter names its node): for benches and tests that look at a page's
bytes without a full parser."""

from __future__ import annotations

import re


def by_label(body: bytes, metric: bytes, label: bytes) -> list[tuple[str, float]]:
    """``(value of label, sample)`` for every series of ``metric`` in an exposition, whatever other
    labels it carries (every series has ``node`` since the exporter names its node)."""
    found = re.findall(rb"^" + re.escape(metric) + rb"\{([^}]*)\} (\S+)$", body, re.M)
    out = []
    for labels, value in found:
        named = re.search(rb"(?:^|,)" + re.escape(label) + rb'="([^"]*)"', labels)
        if named:
            out.append((named.group(1).decode(), float(value)))
    return out


def stage_success(body: bytes) -> dict[str, float]:
    """``gpulens_stage_success`` by stage, from an exposition."""
    return dict(by_label(body, b"gpulens_stage_success", b"stage"))


UNRESOLVED = ("not_found", "forbidden", "error")
"""Owner-walk outcomes that mean the chain's API lacked a controller (``limited`` is the start-up
rate bound: those walks are taken again)."""


def unresolved_walks(body: bytes) -> int:
    """Owner walks that did not resolve, from an exposition (``gpulens_kubernetes_owner_walks_total``)."""
    found = by_label(body, b"gpulens_kubernetes_owner_walks_total", b"outcome")
    return int(sum(v for outcome, v in found if outcome in UNRESOLVED))
