"""Values that depend on the data but carry no noise are not published: timings stay with
the operator (EstimateResult.timings), and ledger history shows no run durations."""

from __future__ import annotations

import numpy as np
import pytest

from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.job import EstimateConfig, run_estimate
from dpsub_dist.ledger import RunRequest, open_ledger
from dpsub_dist.privacy.accountant import ApproxDP


def low_rank(n: int = 3000, d: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((d, 2)))[0]
    return rng.standard_normal((n, 2)) @ basis.T + 0.01 * rng.standard_normal((n, d))


@pytest.mark.parametrize(
    "config",
    [
        EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, seed=1, subsets=700),
        EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, method="gauss", row_norm=3.0),
        EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, method="gauss", row_norm=3.0, boost=2),
    ],
    ids=["friendly", "gauss", "boost"],
)
def test_timings_are_operator_only(config):
    data = low_rank()
    result = run_estimate(config, lambda client: array_dataset(data))
    assert "timings" not in result.manifest
    assert not any("_s" == key[-2:] for key in result.manifest.get("parameters", {}))
    assert result.timings, "the operator still gets the step timings"


def test_history_shows_no_run_duration(tmp_path):
    with open_ledger(str(tmp_path / "ledger.db"), create=True) as book:
        book.grant("/data/x", "row", ApproxDP(2.0, 1e-6))
        request = RunRequest("/data/x", "row", "r1", ApproxDP(1.0, 1e-6), "job", None, "/out")
        lease = book.reserve(request).lease
        book.begin_publishing("/data/x", "r1", lease)
        book.publish("/data/x", "r1", lease, "ok", "{}", None)
        (record,) = book.history("/data/x")
    view = record.public_view()
    assert record.state == "published" and record.published_at is not None
    assert "published_at" not in view and "updated_at" not in view
    assert "reserved_at" in view and "noise_seed" not in view
