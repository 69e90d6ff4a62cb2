"""dashboard/definitions.py's behaviour: GPU shares, the advisor's inlined verdict, the pandas twin of
the idle rule, and the few properties of the rule file that generation does not imply (the rule
file itself is generated from the module: tests/test_rules_generated.py)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dashboard import definitions
from dashboard.frames.columns import from_rows
from dashboard.frames.health import SLOW_EFFICIENCY
from tests.support.documents import yaml_file

REPO = Path(__file__).resolve().parents[1]
RULES_FILE = REPO / "deploy" / "rules" / "gpulens.rules.yml"


def _alerts(name: str) -> list[str]:
    doc = yaml_file(RULES_FILE)
    return [r["expr"] for g in doc["groups"] for r in g["rules"] if r.get("alert") == name]


def test_the_probe_alert_and_the_health_page_call_a_gpu_slow_at_one_threshold() -> None:
    assert SLOW_EFFICIENCY == definitions.PROBE_SLOW_EFFICIENCY_BELOW


def test_a_hardware_xid_alert_holds_its_level() -> None:
    critical, _ = _alerts("GPUXidError")
    assert "increase(" not in critical, "a hardware Xid holds: its level, not its increase"


@pytest.mark.parametrize(
    ("profile", "model", "share"),
    [
        ("", "NVIDIA H200", 1.0),
        ("3g.71gb", "NVIDIA H200", 3 / 7),
        ("1g.18gb", "NVIDIA H200", 1 / 7),
        ("7g.141gb", "NVIDIA H200", 1.0),
        ("1g.6gb", "NVIDIA A30", 1 / 4),
        ("2g.12gb", "NVIDIA A30 24GB", 2 / 4),
        ("1c.3g.71gb", "NVIDIA H200", 1.0),
    ],
)
def test_gpu_share(profile: str, model: str, share: float) -> None:
    assert definitions.gpu_share(profile, model) == pytest.approx(share)


def test_the_advisors_inlined_verdict_keeps_its_filters_on_the_in_use_classes() -> None:
    """The advisor inlines the verdict with the target's matchers: the class regex must keep them."""
    promql = definitions.leaf_idle_promql({"cluster": "eu"})
    assert 'gpulens_gpu_boundness{cluster="eu",class=~"launch|transfer"}[5m]' in promql
    assert 'gpulens_gpu_boundness{class="transfer",cluster="eu"}[5m]' in definitions.transfer_share_promql(
        {"cluster": "eu"}
    )


def _raw(rows: list[dict[str, object]], ts: np.ndarray) -> pd.DataFrame:
    """One sample per row and time (labels + timestamp + value), as the scrape source hands them."""
    return from_rows([{**r, "timestamp": t} for r in rows for t in ts], time=True)


def test_leaf_idle_frame_counts_a_transfer_bound_leaf_as_in_use() -> None:
    """The pandas twin of the rule: class ``transfer`` at any moment in the 5 m window keeps a leaf
    busy, on a whole GPU (beside its GPU-Util) and on a MIG instance (no GPU-Util at all); a leaf
    whose only class is ``idle`` stays idle."""
    ts = np.arange(0.0, 601.0, 10.0)
    leaves = [
        {"uuid": "GPU-x", "mig_uuid": ""},  # whole GPU copying: SM 0, GPU-Util 0 here (the class alone)
        {"uuid": "GPU-m", "mig_uuid": "MIG-1"},  # MIG instance copying: no GPU-Util series
        {"uuid": "GPU-i", "mig_uuid": ""},  # idle, class idle
        {"uuid": "GPU-o", "mig_uuid": ""},  # transfer once, 6 minutes before t: out of the window
    ]
    sm = _raw([{**leaf, "value": 0.0} for leaf in leaves], ts)
    util = _raw([{**leaf, "value": 0.0} for leaf in leaves if not leaf["mig_uuid"]], ts)
    classes = from_rows(
        [
            {**leaf, "class": cls, "timestamp": t, "value": value}
            for leaf, cls, on in (
                (leaves[0], "transfer", lambda t: True),
                (leaves[1], "transfer", lambda t: t == 500.0),
                (leaves[2], "idle", lambda t: True),
                (leaves[3], "transfer", lambda t: t == 240.0),
            )
            for t in ts
            for value in [1.0 if on(t) else 0.0]
        ],
        time=True,
    )
    out = definitions.leaf_idle_frame(sm, pd.DataFrame(), util, classes, np.array([600.0]), fresh_s=15.0)
    verdict = {(str(u), str(m)): bool(i) for u, m, i in zip(out["uuid"], out["mig_uuid"], out["idle"], strict=True)}
    assert verdict == {
        ("GPU-x", ""): False,
        ("GPU-m", "MIG-1"): False,  # only the class says data moved
        ("GPU-i", ""): True,
        ("GPU-o", ""): True,  # the rule's max_over_time(...[5m]) no longer sees it
    }


def test_the_exporter_down_alert_names_no_job() -> None:
    assert not any("job=" in e for e in _alerts("GPUExporterDown")), "no job-name coupling"


def _squash(expr: str) -> str:
    return re.sub(r"\s+", "", expr)


def _recorded() -> dict[str, str]:
    doc = yaml_file(RULES_FILE)
    return {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def test_thresholds_in_the_rule_file_are_the_python_constants() -> None:
    """The builders in definitions.py write their constants, not a literal of their own: the
    generated file carries each threshold and window where the constants say."""
    recorded = _recorded()
    idle = recorded["gpulens:gpu_idle:bool"]
    assert re.findall(r"< bool ([0-9.]+)", idle) == [repr(definitions.IDLE_SM_ACTIVE_BELOW)] * 2
    kernels = recorded["gpulens:gpu_kernels_active:bool"]
    assert re.findall(r">= bool ([0-9.]+)", kernels) == [repr(definitions.KERNELS_UTIL_AT_LEAST)]
    # launch- and transfer-bound leaves are in use: one regex matcher over the in-use classes
    assert re.findall(r'class=~"([^"]+)"', kernels) == ["|".join(definitions.IN_USE_CLASSES)]
    assert set(definitions.IN_USE_CLASSES) == {"launch", "transfer"}
    assert f'class="{definitions.TRANSFER_CLASS}"' in recorded["gpulens:gpu_transfer:ratio_avg5m"]
    assert f"[{definitions.MEAN_WINDOW}]" in recorded["gpulens:gpu_sm_active:ratio_avg5m"]
    assert "[1h:1m]" in recorded["namespace:gpulens_gpu_wasted_hours:sum1h"]
    assert definitions.WASTE_RESOLUTION_SECONDS == 60.0
    # the idle alert uses the same threshold
    assert any(f"< {definitions.IDLE_SM_ACTIVE_BELOW!r}" in e for e in _alerts("GPUAllocatedButIdle"))


def test_the_application_xid_alert_counts_events_as_the_health_page_does() -> None:
    _critical, warning = _alerts("GPUXidError")
    xids = 'gpulens_gpu_xid_errors_total{xid!~"48|61|62|64|74|79|92|94|95|119|120|140"}'
    assert _squash(definitions.counter_events_promql(xids, "10m") + " > 0") in _squash(warning)


def test_the_exporter_down_alert_and_the_dashboard_banner_read_one_expression() -> None:
    assert _squash(definitions.EXPORTERS_DOWN_PROMQL) in [_squash(e) for e in _alerts("GPUExporterDown")]
