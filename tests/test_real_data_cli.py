"""What a new user meets first on a real table: an --out whose parent folder is missing is
one clear line (exit 2) that names the missing folder and how to create it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpsub_dist.cli import main


def test_missing_output_parent_names_it_and_how_to_create_it(tmp_path, capsys):
    data = tmp_path / "t.parquet"
    pd.DataFrame(np.ones((10, 2)), columns=["a", "b"]).to_parquet(data)
    out = tmp_path / "results" / "daily" / "run"
    code = main(
        ["estimate", str(data), "--out", str(out), "--rank", "1", "--method", "gauss"]
        + ["--epsilon", "1", "--delta", "1e-6", "--quiet"]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"folder {tmp_path / 'results' / 'daily'} does not exist" in err
    assert f"mkdir -p {tmp_path / 'results' / 'daily'}" in err
    assert not (tmp_path / "results").exists()
