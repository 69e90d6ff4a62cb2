"""Flags and their GPULENS_* environment twins: defaults, parsing, and failing fast on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from exporter.config import env_name, parse_bool, parse_bytes, parse_config
from exporter.quantities import parse_duration


def test_defaults_follow_the_design() -> None:
    cfg = parse_config([], env={})
    assert cfg.listen_address == ":9445"
    assert cfg.backend == "nvml"
    assert cfg.collect_interval == 1.0
    assert cfg.podresources_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert cfg.probes is True


def test_attribution_ceilings_default_well_above_real_nodes_and_have_env_twins() -> None:
    cfg = parse_config([], env={})
    assert (cfg.kube_max_pods, cfg.kube_max_allocations) == (1024, 4096)
    env = {"GPULENS_KUBERNETES_MAX_PODS": "300", "GPULENS_KUBERNETES_MAX_ALLOCATIONS": "600"}
    assert (parse_config([], env=env).kube_max_pods, parse_config([], env=env).kube_max_allocations) == (300, 600)
    assert parse_config(["--kubernetes.max-pods=5"], env=env).kube_max_pods == 5


def test_env_twin_sets_a_flag_and_the_command_line_wins() -> None:
    env = {"GPULENS_COLLECT_INTERVAL": "250ms", "GPULENS_BACKEND": "sim"}
    assert parse_config([], env=env).collect_interval == 0.25
    assert parse_config(["--collect.interval", "2s"], env=env).collect_interval == 2.0
    assert parse_config([], env=env).backend == "sim"


def test_node_name_falls_back_to_downward_api_variable() -> None:
    assert parse_config([], env={"NODE_NAME": "gpu-node-7"}).node_name == "gpu-node-7"


def test_boolean_flags_have_no_forms_and_env_twins() -> None:
    assert parse_config(["--no-probes"], env={}).probes is False
    assert parse_config([], env={"GPULENS_PROBES": "false"}).probes is False


def test_gpm_is_collected_unless_switched_off_by_flag_or_env_twin() -> None:
    assert parse_config([], env={}).collect_gpm is True
    assert parse_config(["--no-collect.gpm"], env={}).collect_gpm is False
    assert parse_config([], env={"GPULENS_COLLECT_GPM": "false"}).collect_gpm is False
    assert parse_config(["--collect.gpm"], env={"GPULENS_COLLECT_GPM": "off"}).collect_gpm is True


def test_a_bad_gpm_switch_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config([], env={"GPULENS_COLLECT_GPM": "sometimes"})
    assert exc.value.code == 2 and "GPULENS_COLLECT_GPM" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        parse_config(["--collect.gpm=false"], env={})  # booleans take no value: --no-collect.gpm
    assert exc.value.code == 2 and "--collect.gpm" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--collect.interval", "fast"], {}, "--collect.interval"),
        (["--backend", "cuda"], {}, "--backend"),
        (["--web.listen-address", "localhost"], {}, "--web.listen-address"),
        (["--web.listen-address", ":99999"], {}, "out of range"),
        (["--no-such-flag"], {}, "--no-such-flag"),
        ([], {"GPULENS_COLLECT_INTERVAL": "-1s"}, "GPULENS_COLLECT_INTERVAL"),
        ([], {"GPULENS_PROBES": "maybe"}, "GPULENS_PROBES"),
        ([], {"GPULENS_BACKEND": "cuda"}, "GPULENS_BACKEND"),
        # numbers out of range: the old parser raised OverflowError (exit 1) or accepted them
        (["--probes.min-free-memory", "1e999"], {}, "--probes.min-free-memory"),
        ([], {"GPULENS_PROBES_MIN_FREE_MEMORY": "1e999"}, "GPULENS_PROBES_MIN_FREE_MEMORY"),
        (["--collect.interval", "200000d", "--collect.deadline", "200000d"], {}, "--collect.interval"),
        (["--collect.interval", "1ms"], {}, "--collect.interval"),
        (["--probes.interval", "9" * 400 + "s"], {}, "--probes.interval"),
        (["--analysis.window", "2d"], {}, "--analysis.window"),
        (["--probes.max-utilization", "nan"], {}, "--probes.max-utilization"),
        (["--sim.seed", "-1"], {}, "--sim.seed"),
    ],
)
def test_bad_flag_or_value_exits_2_naming_it(
    argv: list[str], env: dict[str, str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, env=env)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.integration  # runs another program
def test_bad_flag_exits_2_from_the_real_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--collect.interval", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--collect.interval" in proc.stderr


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize(
    "argv", [["--probes.min-free-memory", "1e999"], ["--collect.interval", "200000d", "--collect.deadline", "200000d"]]
)
def test_out_of_range_numbers_exit_2_from_the_real_command(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "exporter", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert argv[0] in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.integration  # runs another program
def test_unknown_sim_scenario_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--backend", "sim", "--sim.scenario", "a100x4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "a100x4" in proc.stderr


def test_units_parse_to_base_units() -> None:
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2m") == 120
    assert parse_bytes("4GiB") == 4 * 2**30
    assert env_name("--kubernetes.podresources-socket") == "GPULENS_KUBERNETES_PODRESOURCES_SOCKET"


def test_docs_flags_md_is_generated_from_the_parser() -> None:
    from pathlib import Path

    from exporter.config import flags_markdown

    path = Path(__file__).resolve().parents[1] / "docs" / "flags.md"
    assert path.read_text() == flags_markdown(), "run `.venv/bin/python -m exporter.config > docs/flags.md`"


# --- numbers in ASCII only: int(), float() and \d take any script's digits, signs, '_' and spaces ---


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("\u0665s", "outside ASCII"),  # ARABIC-INDIC DIGIT FIVE
        ("\uff11s", "outside ASCII"),  # FULLWIDTH DIGIT ONE
        ("\u09e7m", "outside ASCII"),  # BENGALI DIGIT ONE
        (" 1s", "whitespace"),
        ("1 s", "whitespace"),
        ("1s\n", "whitespace"),
    ],
)
def test_duration_takes_ascii_digits_and_nothing_around_them(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("\u0664GiB", "outside ASCII"),
        (" 4GiB", "whitespace"),
        ("4 GiB", "whitespace"),
        ("0.5B", "whole number of bytes"),
        ("1.5", "whole number of bytes"),
    ],
)
def test_size_takes_ascii_digits_and_whole_bytes(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_bytes(text)


@pytest.mark.parametrize("text", [" true", "true ", "on\n", "\tno"])
def test_boolean_is_the_word_alone(text: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        parse_bool(text)


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--probes.max-utilization", "-0", "sign"),
        ("--probes.max-utilization", "+0.5", "sign"),
        ("--probes.max-utilization", "1e-1", "exponent"),
        ("--probes.max-utilization", "0.0_5", "'_'"),
        ("--probes.max-utilization", "\u0660.\u0665", "outside ASCII"),
        ("--probes.max-utilization", " 0.5", "whitespace"),
        ("--sim.seed", "+5", "sign"),
        ("--sim.seed", "1_000", "'_'"),
        ("--sim.seed", "\u0663", "outside ASCII"),
        ("--sim.seed", " 5", "whitespace"),
        ("--web.listen-address", ":\u0669\u0664\u0664\u0665", "outside ASCII"),
        ("--web.listen-address", ":+9445", "sign"),
        ("--web.listen-address", ": 9445", "whitespace"),
        ("--web.listen-address", ":9_445", "'_'"),
        ("--web.listen-address", "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54:9445", "host"),
        ("--web.listen-address", "local host:9445", "host"),
        ("--collect.interval", "\uff12s", "outside ASCII"),
        ("--probes.min-free-memory", "\u0664GiB", "outside ASCII"),
        ("--probes.interval", "1ms", "outside 1s..365d"),
        ("--kubernetes.node-name", "Node_1", "not a Kubernetes node name"),
        ("--kubernetes.node-name", "node 1", "not a Kubernetes node name"),
        ("--kubernetes.max-pods", "0", "outside 1..1000000"),
        ("--kubernetes.max-pods", "1e3", "exponent"),
        ("--kubernetes.max-allocations", "-5", "sign"),
        ("--kubernetes.max-allocations", "1000001", "outside 1..1000000"),
    ],
)
def test_number_flags_refuse_what_int_and_float_would_take(
    flag: str, value: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config([f"{flag}={value}"], env={})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err
    assert why in err


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GPULENS_SIM_SEED", "\u0663"),
        ("GPULENS_PROBES_MAX_UTILIZATION", "-0"),
        ("GPULENS_COLLECT_INTERVAL", " 1s"),
        ("GPULENS_PROBES", "true "),
        ("NODE_NAME", "gpu node 7"),
    ],
)
def test_environment_twins_are_read_as_strictly_as_flags(
    name: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config([], env={name: value})
    assert exc.value.code == 2
    assert f"environment {name}:" in capsys.readouterr().err


@pytest.mark.integration  # runs another program
@pytest.mark.parametrize(
    "argv",
    [
        ["--collect.interval", "\u0665s"],
        ["--web.listen-address", "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54:9445"],
        ["--probes.max-utilization=-0"],
        ["--sim.seed", "1_0"],
    ],
)
def test_non_ascii_or_signed_numbers_exit_2_from_the_real_command(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "exporter", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert argv[0].partition("=")[0] in proc.stderr
    assert "Traceback" not in proc.stderr
