"""Smoke run of bench/corpus.py (issue #37's scorecard) on two small corpus tables cut to a few
hundred rows, and its targets' arithmetic on hand-made cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import corpus  # noqa: E402

TABLES = "doctorvisits,crime1"


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--results-dir",
        str(tmp_path),
        "--data-dir",
        str(tmp_path / "data"),
        "--no-plot",
        "--tables",
        TABLES,
        "--max-rows",
        "800",
        "--epsilons",
        "3",
        "--seeds",
        "1",
        *extra,
    ]


def test_scorecard_on_two_tables(tmp_path, capsys):
    corpus.main(_argv(tmp_path))
    document = json.loads((tmp_path / "corpus.json").read_text())
    records = document["records"]
    per_table = 2 + 2 * 2 * len(corpus.TUNED_QUANTILES) + 1  # default ×2, (a) and (b) ×2, std
    assert len(records) == 2 * per_table
    assert {r["variant"] for r in records} == {"default", "a", "b", "standardize"}
    assert all(r["scaling"] == "raw" for r in records if r["variant"] == "standardize")
    standardised = [r for r in records if r["variant"] == "standardize" and r["status"] == "ok"]
    assert standardised and all(len(r["scale_ratio"]) == 2 for r in standardised)
    tables = document["parameters"]["tables"]
    assert tables["doctorvisits"]["rows"] == 800 and tables["doctorvisits"]["dim"] == 6
    cells = document["summary"]["cells"]
    assert len(cells) == 4 and all({"default", "a", "b"} <= set(c) for c in cells)
    printed = capsys.readouterr().out
    assert "doctorvisits   raw" in printed
    assert sum(line[:4] in ("PASS", "FAIL", "n/a ") for line in printed.splitlines()) == len(
        document["summary"]["targets"]
    )
    # --against reprints the same scorecard without running anything
    corpus.main(["--against", str(tmp_path / "corpus.json")])
    assert capsys.readouterr().out.strip() == printed.strip()


def test_only_standardize_runs_its_cells_and_reference(tmp_path):
    corpus.main(_argv(tmp_path, "--only", "standardize", "--tables", "doctorvisits"))
    records = json.loads((tmp_path / "corpus.json").read_text())["records"]
    assert sorted((r["variant"], r["scaling"]) for r in records) == [
        ("default", "z"),
        ("standardize", "raw"),
    ]


def _cell(table, scaling, epsilon, default, a, b, **extra):
    def summary(error, captured, bottom=0, refused=0):
        return {"error": error, "captured": captured, "bottom": bottom, "refused": refused}

    return {
        "table": table,
        "scaling": scaling,
        "epsilon": epsilon,
        "default": summary(*default),
        "a": summary(*a),
        "b": summary(*b),
        **extra,
    }


def test_targets_judge_error_or_captured():
    cells = [
        _cell("t1", "raw", 1.0, (0.19, 0.90), (0.2, 0.95), (0.1, 0.95)),  # within 2× of (b)
        _cell("t2", "raw", 1.0, (0.21, 0.90), (0.2, 0.95), (0.1, 0.95)),  # 2.1×, 0.05 captured
        _cell("t3", "raw", 1.0, (0.99, 0.95), (0.9, 0.95), (0.6, 0.955)),  # captured within 0.01
        _cell("t4", "raw", 1.0, (0.99, 0.90), (0.9, 0.95), (0.6, 0.95)),  # 2×0.6 ≥ 1: captured only
    ]
    high, worst, low = corpus.targets(cells)[:3]
    assert (high["cells"], high["passed"]) == (4, 2) and high["pass"] is False
    assert high["failing"] == [["t2", "raw", 1.0], ["t4", "raw", 1.0]]
    assert worst["failing"] == [["t4", "raw", 1.0]]  # t2: 0.21 ≤ 1.5 × 0.2
    assert low["pass"] is None  # no cell at ε < 1


def test_bottom_counts_only_where_a_publishes():
    cells = [
        _cell("t1", "raw", 1.0, (1.0, 0.0, 2), (0.2, 0.95), (0.1, 0.95)),
        _cell("t2", "raw", 1.0, (1.0, 0.0, 1), (1.0, 0.0, 3), (1.0, 0.0, 3)),
    ]
    cells.append(_cell("t3", "raw", 0.3, (1.0, 0.0, 0, 3), (0.9, 0.5), (0.9, 0.5)))  # exit 2
    bottom = next(t for t in corpus.targets(cells) if t["target"].startswith("no ⊥"))
    assert bottom["failing"] == [["t1", "raw", 1.0], ["t3", "raw", 0.3]]


def test_references_reuse_every_run_but_the_default(tmp_path):
    before = tmp_path / "before"
    corpus.main(_argv(before, "--tables", "doctorvisits"))
    old = json.loads((before / "corpus.json").read_text())["records"]
    corpus.main(
        _argv(tmp_path, "--tables", "doctorvisits", "--references", str(before / "corpus.json"))
    )
    new = json.loads((tmp_path / "corpus.json").read_text())["records"]
    assert len(new) == len(old)
    assert [r for r in new if r["variant"] != "default"] == [
        r for r in old if r["variant"] != "default"
    ]
    fresh = [r for r in new if r["variant"] == "default"]
    assert sorted(r["scaling"] for r in fresh) == ["raw", "z"]  # run again, both scalings
