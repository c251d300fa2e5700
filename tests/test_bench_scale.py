"""Smoke run of bench.scale with tiny parameters: the ratios it promises are in its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import scale  # noqa: E402


def test_scale_reports_rss_ratio_and_throughput_vs_floor(tmp_path, scheduler_address):
    argv = ["--rows", "4000,8000", "--dims", "6", "--rank", "2", "--repeats", "1"]
    argv += ["--tools", "dpsub,floor", "--scheduler", scheduler_address, "--no-plot"]
    argv += ["--results-dir", str(tmp_path / "r"), "--data-dir", str(tmp_path / "d")]
    assert scale.main(argv) == 0
    document = json.loads((tmp_path / "r" / "scale.json").read_text())
    assert document["command"].startswith("python -m bench.scale --rows 4000,8000")
    (row,) = document["summary"]
    assert row["dim"] == 6 and row["route"] == "per-subset Gram matrices"
    assert row["rss_ratio"] > 0 and row["throughput_vs_floor"] > 0
    assert len(document["records"]) == 4  # ⊥ (status "bottom") is a run that finished too
    assert all(r["status"] in ("ok", "bottom") for r in document["records"])
