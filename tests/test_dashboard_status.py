"""The Fleet page's status summary (dashboard/frames/status.py): each check's line, its page, and
nothing where nothing is wrong; pure frames, no server."""

from __future__ import annotations

import pandas as pd

from dashboard.frames.columns import from_rows
from dashboard.frames.jobs import jobs_overview
from dashboard.frames.status import (
    alert_lines,
    gdr_lines,
    gdr_off_nodes,
    gdr_words,
    job_lines,
    job_nodes,
    lost_lines,
    status_lines,
)


def test_firing_gpulens_alerts_one_line_per_rule_most_severe_first() -> None:
    alerts = from_rows(
        [
            {"alertname": "GPUJobStraggler", "alertstate": "firing", "severity": "warning", "value": 1},
            {"alertname": "GPULost", "alertstate": "firing", "severity": "critical", "value": 1},
            {"alertname": "GPULost", "alertstate": "firing", "severity": "critical", "value": 1},
            {"alertname": "GPUAllocatedButIdle", "alertstate": "pending", "severity": "warning", "value": 1},
            {"alertname": "KubePodCrashLooping", "alertstate": "firing", "severity": "critical", "value": 1},
        ]
    )
    lines = alert_lines(alerts)
    assert [(x.level, x.text, x.page) for x in lines] == [
        ("error", "Alert GPULost firing (2 series, critical)", "health"),
        ("warning", "Alert GPUJobStraggler firing (1 series, warning)", "jobs"),
    ], "pending and other teams' alerts are left out"
    assert alert_lines(pd.DataFrame()) == []


def _gdr(ready: dict[str, list[bool]]) -> pd.DataFrame:
    rows = [
        {"node": node, "instance": "", "gpu": str(i), "uuid": f"{node}-{i}", "nearest": "4 NICs (PIX)", "ready": ok,
         "reason": "ready: peer-memory module loaded" if ok else "no peer-memory module or DMA-BUF"}
        for node, oks in ready.items() for i, ok in enumerate(oks)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_gpudirect_rdma_not_ready_is_named_per_node_with_why() -> None:
    per_gpu = _gdr({"p5en-a": [False] * 8, "p5en-b": [True] * 8})
    lines = gdr_lines(per_gpu)
    assert len(lines) == 1
    assert lines[0].page == "network" and lines[0].level == "error"
    assert lines[0].text.startswith(
        "p5en-a: GPUDirect RDMA not ready on 8 of 8 GPUs (no peer-memory module or DMA-BUF)"
    )
    assert gdr_off_nodes(per_gpu) == {"p5en-a"}
    assert gdr_lines(_gdr({"p5en-b": [True] * 8})) == []


def test_lost_gpus_and_blind_exporters_are_named() -> None:
    gpu_up = from_rows([{"node": "jobs-0", "gpu": "3", "value": 0.0}, {"node": "jobs-0", "gpu": "2", "value": 1.0}])
    up = from_rows([{"node": "", "instance": "10.0.0.9:9400", "value": 0.0}])
    lines = lost_lines(gpu_up, up)
    assert [x.text for x in lines] == [
        "1 GPU(s) lost or unreadable: jobs-0 GPU 3",
        "1 exporter(s) cannot read their GPUs: 10.0.0.9:9400",
    ]
    assert {x.page for x in lines} == {"health"}
    assert lost_lines(gpu_up.iloc[1:], up.iloc[0:0]) == []


def _summary(workload: str, communication: float, stragglers: int = 0) -> dict[str, object]:
    return {"cluster": "", "namespace": "ml", "workload_kind": "PyTorchJob", "workload": workload, "gpus": 16,
            "nodes": 2, "activity": 0.2, "activity_min": 0.1, "activity_max": 0.3, "activity_spread": 0.2,
            "busy": 0.9, "communication": communication, "memory_used_ratio": 0.5, "stragglers": stragglers,
            "gpu_hours": 1.0, "pods": 2, "classified_leaves": 16, "memory_used_bytes": 1.0,
            "memory_total_bytes": 2.0}  # fmt: skip


def test_a_communication_bound_job_on_nodes_without_gpudirect_says_so() -> None:
    summary = pd.DataFrame([_summary("llm", 0.83), _summary("ok", 0.1)])
    overview = jobs_overview(summary, pd.DataFrame(columns=["cluster", "namespace", "workload_kind", "workload"]),
                             pd.DataFrame())  # fmt: skip
    alloc = from_rows(
        [{"namespace": "ml", "pod": f"llm-{n}", "workload_kind": "PyTorchJob", "workload": "llm", "node": f"p5en-{n}",
          "uuid": f"G{n}", "value": 1} for n in "ab"]
    )  # fmt: skip
    nodes = job_nodes(alloc)
    assert nodes == {("", "ml", "PyTorchJob", "llm"): {"p5en-a", "p5en-b"}}
    assert gdr_words(("", "ml", "PyTorchJob", "llm"), nodes, {"p5en-a"}) == "GPUDirect RDMA off on p5en-a"
    lines = job_lines(overview, nodes, {"p5en-a"})
    assert [x.text for x in lines] == [
        "1 communication-bound job(s): ml/PyTorchJob/llm (83 % in collectives; GPUDirect RDMA off on p5en-a)"
    ]
    assert lines[0].page == "jobs"
    assert [x.text for x in job_lines(overview, nodes, set())] == [
        "1 communication-bound job(s): ml/PyTorchJob/llm (83 % in collectives)"
    ]


def test_nothing_wrong_is_no_line_and_errors_come_first() -> None:
    assert status_lines(alerts=[], gdr=[], lost=[], jobs_=[]) == []
    per_gpu = _gdr({"n": [False]})
    summary = pd.DataFrame([_summary("llm", 0.9)])
    jobs_ = job_lines(jobs_overview(summary, pd.DataFrame(columns=["workload"]), pd.DataFrame()), {}, set())
    lines = status_lines(alerts=[], gdr=gdr_lines(per_gpu), lost=[], jobs_=jobs_)
    assert [x.level for x in lines] == ["error", "warning"]
