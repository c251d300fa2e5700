"""Smoke run of bench.scale with tiny parameters: the ratios it promises are in its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import common, scale  # noqa: E402


def test_scale_reports_rss_ratio_and_throughput_vs_floor(tmp_path, scheduler_address):
    """Without --method it measures the library's default (auto, which picks gauss at D = 6)."""
    argv = ["--rows", "4000,8000", "--dims", "6", "--rank", "2", "--repeats", "1"]
    argv += ["--tools", "dpsub,floor", "--scheduler", scheduler_address, "--no-plot"]
    argv += ["--results-dir", str(tmp_path / "r"), "--data-dir", str(tmp_path / "d")]
    assert scale.main(argv) == 0
    document = json.loads((tmp_path / "r" / "scale.json").read_text())
    assert document["command"].startswith("python -m bench.scale --rows 4000,8000")
    assert document["parameters"]["method"] == "auto"
    (row,) = document["summary"]
    assert row["dim"] == 6 and row["method"] == "gauss"
    assert row["rss_ratio"] > 0 and row["throughput_vs_floor"] > 0
    assert len(document["records"]) == 4  # ⊥ (status "bottom") is a run that finished too
    assert all(r["status"] in ("ok", "bottom") for r in document["records"])


def test_scale_records_a_failed_peer_and_goes_on(tmp_path, scheduler_address, monkeypatch):
    """A peer whose workers die (dask-ml out of memory at 10⁷ × 128 did) is a failed record
    with no ratio, not an abort that loses every run before it; dpsub's own failure aborts."""
    from distributed.scheduler import KilledWorker

    from bench import speed
    from dpsub_dist.errors import RunAborted

    def killed(*_args, **_kwargs):
        raise KilledWorker("pca-chunk", "tcp://127.0.0.1:1", [])

    monkeypatch.setattr(speed, "run_dask_ml", killed)
    argv = ["--rows", "4000", "--dims", "6", "--rank", "2", "--repeats", "1"]
    argv += ["--tools", "dpsub,dask_ml_randomized", "--scheduler", scheduler_address]
    argv += ["--no-plot", "--results-dir", str(tmp_path / "r"), "--data-dir", str(tmp_path / "d")]
    assert scale.main(argv) == 0
    document = json.loads((tmp_path / "r" / "scale.json").read_text())
    status = {r["tool"]: r["status"] for r in document["records"]}
    assert status["dpsub"] == "ok"
    assert status["dask_ml_randomized"].startswith("failed: RunAborted: Dask workers died"), status
    (row,) = document["summary"]
    assert row["dask_ml_wall_s"] is None and row["time_vs_dask_ml"] is None
    assert row["dpsub_wall_s"] > 0

    monkeypatch.setattr(common, "run_dpsub", killed)
    with pytest.raises(RunAborted):  # the cluster's translation of KilledWorker
        scale.main(argv[:6] + ["--tools", "dpsub"] + argv[8:])


def test_beyond_memory_reports_each_process_and_the_error(tmp_path):
    from bench import beyond_memory
    from dpsub_dist.synth import generate

    data = generate(tmp_path / "data", rows=6000, dim=6, rank=2, partitions=3, seed=2)
    argv = [str(data.path), "--rank", "2", "--memory-limit", "400MiB", "--workers", "1"]
    argv += ["--work-dir", str(tmp_path / "w"), "--results-dir", str(tmp_path / "r")]
    assert beyond_memory.main(argv) == 0
    document = json.loads((tmp_path / "r" / "beyond_memory.json").read_text())
    (record,) = document["records"]
    assert record["exit_code"] == 0 and record["output"] == "complete"
    assert record["error"] < 0.2 and record["bytes_gathered"] > 0
    assert record["peak_rss_mib"]["driver"] > 0 and len(record["peak_rss_mib"]) >= 2
    assert document["parameters"]["memory_limit"] == "400MiB"


def test_beyond_memory_oom_limit_needs_a_command_line_cluster(tmp_path, capsys):
    """The kernel-OOM option moves a nanny-less worker into a cgroup: without one, refused."""
    from bench import beyond_memory

    with pytest.raises(SystemExit) as exit_info:
        beyond_memory.main([str(tmp_path), "--oom-limit-mib", "300"])
    assert exit_info.value.code == 2
    assert "--command-line-cluster" in capsys.readouterr().err


def test_generated_rows_draw_the_same_rows_per_chunk_and_fit():
    from bench import generated_rows

    first = generated_rows.generated_rows(2500, 5, 2, 0.01, 1000, seed=3)
    assert first.chunks == ((1000, 1000, 500), (5,))
    rows = first.compute(scheduler="synchronous")
    again = generated_rows.generated_rows(2500, 5, 2, 0.01, 1000, seed=3)
    np.testing.assert_array_equal(rows, again.compute(scheduler="synchronous"))
    assert not np.array_equal(rows[:500], rows[1000:1500])  # each chunk its own seed
    truth = generated_rows.truth(5, 2, 3)
    residual = rows - (rows @ truth) @ truth.T
    assert np.abs(residual).max() < 0.1 and np.abs(rows).max() > 1


def test_generated_rows_fit_on_their_own_cluster(tmp_path):
    from bench import generated_rows

    argv = ["--rows", "20000", "--dim", "4", "--rank", "2", "--chunk-rows", "5000"]
    argv += ["--workers", "1", "--results-dir", str(tmp_path / "r"), "--no-plot"]
    assert generated_rows.main(argv) == 0
    document = json.loads((tmp_path / "r" / "generated_rows.json").read_text())
    (record,) = document["records"]
    assert record["method"] == "gauss" and record["error"] < 0.2  # the default, auto's pick
    assert record["peak_worker_rss_mib"] > 0 and record["bytes_gathered"] > 0
