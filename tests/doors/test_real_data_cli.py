"""What a new user meets first on a real table: ``--out results/daily/run`` with no
``results/`` yet is created, as ``mkdir -p`` would, when the run is written."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpsub_dist.cli import main


def test_missing_output_parents_are_created(tmp_path, capsys, scheduler_address):
    data = tmp_path / "t.parquet"
    rng = np.random.default_rng(0)
    pd.DataFrame(rng.normal(size=(2_000, 3)), columns=["a", "b", "c"]).to_parquet(data)
    out = tmp_path / "results" / "daily" / "run"
    code = main(
        ["estimate", str(data), "--out", str(out), "--rank", "1", "--method", "gauss"]
        + ["--epsilon", "1", "--delta", "1e-6", "--row-norm", "5"]
        + ["--scheduler", scheduler_address, "--quiet"]
    )
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["basis.npy", "manifest.json"]
    assert [p.name for p in out.parent.iterdir()] == ["run"]  # no temporary folder left
