"""Smoke run of bench/real_data.py on a slice of each real table (the full run is slow):
the tables are written as pandas and Dask write them, their stored index is never a
feature, every variant leaves a record, and the JSON and the docs table are produced."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import real_data  # noqa: E402


def test_real_data_bench_on_a_slice(tmp_path, capsys):
    argv = ["--results-dir", str(tmp_path / "results"), "--data-dir", str(tmp_path / "data")]
    argv += ["--img-dir", str(tmp_path / "img"), "--no-plot", "--max-rows", "3000"]
    argv += ["--epsilons", "10", "--seeds", "1", "--seeds-big", "1"]
    argv += ["--variants", "default,gauss+center,gauss+hand,friendly+center"]
    assert real_data.main(argv) == 0
    document = json.loads((tmp_path / "results" / "real_data.json").read_text())
    hygiene = document["parameters"]["hygiene"]
    assert {(h["table"], h["layout"]) for h in hygiene} == {
        (t, layout) for t in ("flights", "digits") for layout in ("pandas", "dask")
    }
    assert all(h["as_expected"] and not h["index_columns_used"] for h in hygiene)
    assert document["parameters"]["tables"]["flights"]["columns"][0] == "month"
    assert len(document["parameters"]["tables"]["digits"]["columns"]) == 64  # target excluded
    records = document["records"]
    hand = len(real_data.HAND_NORMS["flights"])
    assert len([r for r in records if r["table"] == "flights"]) == 3 + hand
    gauss = next(r for r in records if (r["table"], r["variant"]) == ("flights", "gauss+center"))
    # one seed on a 3,000-row slice: the subspace error moves a lot there (flights' k = 3 gap
    # is λ₄/λ₃ = 0.56), the captured variance much less
    assert gauss["status"] == "ok" and gauss["captured"] > 0.8
    rows = {(row["table"], row["variant"]) for row in document["summary"]["table"]}
    assert ("flights", "gauss, hand-picked") in rows
    scree = document["summary"]["scree"]
    assert {s["table"] for s in scree} == {"flights", "digits"}
    released = scree[0]["released_ratio"]
    assert len(released) == 10 and released == sorted(released, reverse=True)
    printed = capsys.readouterr().out
    assert printed.startswith("| table | ε | variant |") and "gauss, hand-picked (B=" in printed
