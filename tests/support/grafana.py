"""The Grafana dashboards as the tests read them: scripts/grafana_dashboard.py and
scripts/grafana_panels/ loaded from their files (scripts/ is not a package), and the shipped JSON
models of deploy/grafana/."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tests.support.deploy import renderer

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "deploy" / "grafana"
CHART_GRAFANA = REPO / "deploy" / "helm" / "gpulens" / "files" / "grafana"


gd = renderer._grafana_module()
"""scripts/grafana_dashboard.py: the SDK builder."""
gp = sys.modules["grafana_panels"]
"""scripts/grafana_panels/: the boards' declarations, one module per board."""


def docs() -> dict[str, dict[str, Any]]:
    """uid -> the shipped JSON model of each board."""
    return {b.uid: json.loads((GRAFANA / gd.file_name(b)).read_text()) for b in gd.BOARDS}


def panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A board's panels, rows left out."""
    return [p for p in doc["panels"] if p["type"] != "row"]
