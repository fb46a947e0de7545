"""The CLI's kubectl manners (issue 46): ``-o yaml``, ``-`` for standard input, exit codes 0/1/2, one line per
problem, validation of one file alone, non-manifests skipped, empty input refused, progress only on a terminal,
plain help texts. In-process (``main``), with the real files of the examples."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from prfaas_cli.main import build_parser, main
from prfaas_cli.simulate_cmd import ProgressBar

REPO = Path(__file__).resolve().parents[2]
EX = REPO / "examples" / "01-two-region"
LINK = EX / "region-b" / "inter-dc-link.yaml"


def run(capsys: pytest.CaptureFixture[str], *argv: str, stdin: str | None = None, monkeypatch=None):  # type: ignore[no-untyped-def]
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_reads_stdin_and_prints_yaml(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    manifest = (EX / "common" / "model-profile.yaml").read_text()
    code, out, err = run(capsys, "validate", "-o", "yaml", "-", stdin=manifest, monkeypatch=monkeypatch)
    assert code == 0, err
    report = yaml.safe_load(out)
    assert report["valid"] is True
    (obj,) = report["objects"]
    assert obj["file"] == "<stdin>" and obj["kind"] == "ModelProfile" and obj["valid"] is True


def test_a_link_checked_alone_passes_with_its_clusters_unresolved(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(LINK))
    assert code == 0, out
    assert "ok    " in out and "unresolved: spec.prefillClusterRef.name: PrefillCluster 'prfaas-h200'" in out
    assert "2 reference(s) unresolved" in out
    code, out, _ = run(capsys, "validate", "-o", "json", str(LINK))
    obj = yaml.safe_load(out)["objects"][0]
    assert (
        code == 0
        and obj["issues"] == []
        and {u["path"] for u in obj["unresolved"]}
        == {
            "spec.prefillClusterRef.name",
            "spec.pdClusterRef.name",
        }
    )
    # a whole-tree check: what is not among the files is an error
    code, out, _ = run(capsys, "validate", "--strict-references", str(LINK))
    assert code == 1 and "FAIL" in out and "is not defined in the given files [reference]" in out
    # ... and the whole tree passes it
    code, out, _ = run(capsys, "validate", "--strict-references", str(EX))
    assert code == 0 and "unresolved" not in out


def test_helm_values_files_are_skipped_saying_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "validate", str(REPO / "examples" / "03-helm"))
    assert code == 0, out
    skipped = [line for line in out.splitlines() if line.startswith("skip")]
    assert skipped and all("not a Kubernetes manifest (no kind)" in line for line in skipped)
    assert any("region-a/values.yaml" in line for line in skipped)
    assert "FAIL" not in out


def test_empty_input_is_an_error(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run(capsys, "validate", "-", stdin="", monkeypatch=monkeypatch)
    assert code == 1 and err.startswith("error: <stdin>: no YAML documents"), err
    (tmp_path / "empty.yaml").write_text("# nothing here\n---\n")
    code, _, err = run(capsys, "validate", str(tmp_path / "empty.yaml"))
    assert code == 1 and "empty.yaml: no YAML documents" in err, err
    # a values file alone is not empty: skipped, saying so (a pipeline may pass every YAML file it has)
    (tmp_path / "values.yaml").write_text("router:\n  replicas: 2\n")
    code, out, _ = run(capsys, "validate", str(tmp_path / "values.yaml"))
    assert code == 0 and "skip  " in out and "not a Kubernetes manifest" in out


def test_a_schema_error_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text((EX / "common" / "model-profile.yaml").read_text().replace("kvMiB: ", "kvMiB: -", 1))
    code, out, _ = run(capsys, "validate", str(bad))
    lines = [line for line in out.splitlines() if "kvMiB" in line]
    assert code == 1 and len(lines) == 1, out


def test_exit_codes_0_1_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run(capsys, "plan", "-o", "yaml")[0] == 0
    code, _, err = run(capsys, "plan", "--workload", str(tmp_path / "nope.yaml"))
    assert code == 1 and err == f"error: {tmp_path / 'nope.yaml'}: no such workload file\n"
    code, _, err = run(capsys, "plan", "--link-gbps", "-3")
    assert code == 2 and err.startswith("error: --link-gbps")
    with pytest.raises(SystemExit) as usage:  # argparse's own usage errors
        main(["plan", "-o", "xml"])
    assert usage.value.code == 2
    code, _, err = run(capsys, "simulate", str(tmp_path / "nope.yaml"))
    assert code == 1 and "[Errno" not in err and "no such scenario file" in err
    (tmp_path / "bad.yaml").write_text("seed: [1,\n")
    code, _, err = run(capsys, "simulate", str(tmp_path / "bad.yaml"))
    assert code == 1 and len(err.splitlines()) == 1 and ":2:1: invalid YAML" in err, err


def test_a_folder_that_cannot_be_written_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    code, _, err = run(capsys, "crds", "--out", str(tmp_path / "file" / "crds"))
    assert code == 1 and err.startswith(f"error: --out {tmp_path / 'file' / 'crds'}: ") and len(err.splitlines()) == 1
    assert "Traceback" not in err and "[Errno" not in err


def test_router_config_errors_are_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "router", "--config", str(tmp_path / "nope.yaml"))
    assert code == 1 and err == f"error: {tmp_path / 'nope.yaml'}: cannot read: No such file or directory\n"
    (tmp_path / "r.yaml").write_text("mode: [\n")
    code, _, err = run(capsys, "router", "--config", str(tmp_path / "r.yaml"))
    assert code == 1 and len(err.splitlines()) == 1 and "r.yaml:2:1: invalid YAML" in err, err


def test_operator_log_level_is_a_choice() -> None:
    parser = build_parser()
    assert parser.parse_args(["operator", "--log-level", "INFO"]).log_level == "info"
    with pytest.raises(SystemExit) as usage:
        parser.parse_args(["operator", "--log-level", "chatty"])
    assert usage.value.code == 2


def test_help_texts_have_no_rst_markup() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():  # type: ignore[attr-defined]
        text = command.format_help()
        assert "``" not in text and ":func:" not in text, name


def test_the_progress_bar_draws_frames_when_asked() -> None:
    """Drawn only when stderr is a terminal (test_simulate_cli asserts a captured run has no frames)."""
    frames = io.StringIO()
    bar = ProgressBar("x", frames)
    bar.update("a", 1.0)
    bar.close()
    assert "\r" in frames.getvalue() and "100.0%" in frames.getvalue()
