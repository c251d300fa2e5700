"""The private bound's low-side margin (privacy/norm_bound.py: LOW_MARGIN, margined_quantile;
issue #14): with few rows or users the sparse vector's threshold sat within the noise of the
empty low bins, and a bound far below every norm was released.

The margin is a function of public values (row level: n and ε from n, D, ε, δ; user level: the
released ñ and ε); where it cannot be met the run fails instead of releasing: exit 2 before any
read at row level, ⊥ (exit 3, charged) after the count at user level. Every private bound takes
it: gauss/gap-perturb's, power's, the stream's first batch, SuLQ's ``--private-norm`` and the
centring's and explained variance's (both row level only, so exit 2).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsub_dist.cli import main
from dpsub_dist.engine.sources import array_dataset
from dpsub_dist.errors import InputError
from dpsub_dist.job import ClusterConfig, EstimateConfig, run_cluster, run_estimate
from dpsub_dist.methods import _centring as centring
from dpsub_dist.methods import _clustering as clustering
from dpsub_dist.methods import gauss as covariance
from dpsub_dist.methods import power
from dpsub_dist.privacy import norm_bound as nb
from dpsub_dist.privacy.accountant import Accountant, ApproxDP

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.user_norm_bound import ROWS_PER_USER, released_bounds  # noqa: E402


def test_margin_is_the_laplace_union_bound_over_the_public_grid() -> None:
    """LOW_MARGIN = 4·ln(2L/(3β)), L = 101 grid queries, β = 1%; the interval's ends are
    LOW/ε and n − SV/ε, so the smallest count is (LOW + SV)/ε, from public values only."""
    assert nb.LOW_MARGIN == pytest.approx(4 * math.log(2 * 101 / (3 * 0.01)))
    assert 35 < nb.LOW_MARGIN < 36
    assert nb.min_count(0.05) == pytest.approx((nb.LOW_MARGIN + nb.SV_MARGIN) / 0.05)
    need = nb.min_count(0.1)
    with pytest.raises(nb.TooFewForBound, match="--row-norm B, a larger ε or more rows"):
        nb.margined_quantile(0.9, math.floor(need), 0.1, "rows")
    with pytest.raises(nb.TooFewForBound, match="noisy user count 485 .* more users"):
        nb.margined_quantile(0.5, 485.0, 0.05, "users")
    assert nb.margined_quantile(0.5, math.ceil(need), 0.1, "rows") * math.ceil(need) == (
        pytest.approx(nb.LOW_MARGIN / 0.1)
    )  # q·n = n/2 lies below LOW/ε: raised to it
    assert nb.margined_quantile(0.92, 5000, 0.05, "users") == 0.92  # far from both ends


def test_a_quantile_is_kept_inside_both_margins() -> None:
    """margined_quantile keeps the threshold inside [LOW/ε, n − SV/ε]: capped at the top (a
    run's quantile for all n searched on a sample of n_S rows, or the mean's fixed 0.99 at
    small n, used to stay above it), raised at the bottom, unchanged between."""
    epsilon, count = 0.1, 50_000
    top = 1 - nb.SV_MARGIN / (epsilon * count)  # 0.996
    assert nb.margined_quantile(0.9999, count, epsilon, "rows") == pytest.approx(top)
    assert nb.margined_quantile(0.9, count, epsilon, "rows") == 0.9
    low = nb.LOW_MARGIN / (epsilon * count)
    assert nb.margined_quantile(1e-6, count, epsilon, "rows") == pytest.approx(low)
    with pytest.raises(nb.TooFewForBound):
        nb.margined_quantile(0.5, math.floor(nb.min_count(epsilon)) - 1, epsilon, "rows")


def test_empty_bins_pass_the_margined_threshold_rarely_and_the_old_one_often() -> None:
    """Every count in the overflow bin (all 101 bins empty): at the threshold LOW/ε the search
    fires on an empty bin w.p. ≤ 1% (the docstring's bound); at ε = 0.05 with 500 users the
    old threshold ñ/2 = 250 ≈ 12.5/ε fired about half the time (the bench's 11/20)."""
    epsilon, n, draws = 0.05, 5000, 400
    counts = np.zeros(len(nb.GRID) + 1, dtype=np.int64)
    counts[-1] = n
    rng = np.random.default_rng(7)

    def fired(threshold: float) -> float:
        mech, q = nb.norm_bound_mechanism(ApproxDP(epsilon)), threshold / n
        hits = [nb.private_norm_bound(counts, n, mech, rng, q).index for _ in range(draws)]
        return sum(h is not None for h in hits) / draws

    assert fired(nb.LOW_MARGIN / epsilon) < 0.025
    assert fired(250.0) > 0.3


def _users(users: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The bench's rows (D = 5, six rows per user), ids in the first column."""
    rng = np.random.default_rng(seed)
    rows = rng.standard_normal((users * ROWS_PER_USER, 5)) @ np.diag([5, 3, 1, 0.5, 0.2]) + 10
    return np.repeat(np.arange(users), ROWS_PER_USER), rows


def test_row_level_too_few_rows_is_bad_input_before_any_read(monkeypatch) -> None:
    """Centred (the default), ε = 1: ε_norm = 0.05 for the centred rows' bound needs n ≥ 1,106;
    1,000 rows are bad input before a partition is read or a step charged; 1,200 pass the check
    (and then run)."""
    _, rows = _users(200)
    monkeypatch.setattr(Accountant, "charge", lambda *a: pytest.fail("charged"))
    monkeypatch.setattr(covariance.centring, "centre", lambda *a: pytest.fail("read"))
    config = EstimateConfig(2, epsilon=1.0, delta=1e-6, method="gauss")
    with pytest.raises(InputError, match=r"1000 rows are too few .* \(needs ≥ 1106\): pass --row"):
        run_estimate(config, lambda client: array_dataset(rows[:1000]), None)
    monkeypatch.undo()
    result = run_estimate(config, lambda client: array_dataset(rows), None)
    assert result.basis is not None and result.manifest["parameters"]["row_norm"] in nb.GRID


@pytest.fixture(scope="module")
def users_parquet(tmp_path_factory) -> Path:
    """500 users of six rows each (the bench's case), user id in ``user``."""
    ids, rows = _users(500)
    frame = pd.DataFrame(rows, columns=[f"x{i}" for i in range(5)])
    frame.insert(0, "user", ids)
    path = tmp_path_factory.mktemp("users") / "users.parquet"
    frame.to_parquet(path)
    return path


def _estimate(path: Path, out: Path, method: str, epsilon: str, *args: str) -> int:
    return main(
        ["estimate", str(path), "--out", str(out), "--rank", "2", "--quiet", "--method", method]
        + ["--epsilon", epsilon, "--delta", "1e-6", "--columns", "x0,x1,x2,x3,x4", *args]
    )


METHODS = ["gauss", "power"]
"""The methods whose private bound takes the margins (power: since its noise-matched rule)."""


@pytest.mark.parametrize("method", METHODS)
def test_cli_row_level_too_few_rows_exits_2_and_writes_nothing(
    method, users_parquet, scheduler_address, tmp_path, capsys
) -> None:
    """3,000 rows at ε = 0.1: ε_norm = 0.01 needs 5,526 rows."""
    out = tmp_path / "out"
    code = _estimate(
        users_parquet, out, method, "0.1", "--no-center", "--scheduler", scheduler_address
    )
    err = capsys.readouterr().err
    assert code == 2 and not out.exists()
    assert "3000 rows are too few" in err and "--row-norm B" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("method", METHODS)
def test_cli_user_level_500_users_at_eps_1_fails_instead_of_a_bound_below_the_data(
    method, users_parquet, scheduler_address, tmp_path, capsys
) -> None:
    """The bench's failing case (11/20 bounds far below the median norm 57 before): ⊥, exit 3,
    the reason names the released ñ and the fix, the norm step charged, no bound published."""
    out = tmp_path / "out"
    code = _estimate(
        users_parquet, out, method, "1", "--unit-column", "user", "--scheduler", scheduler_address
    )
    assert code == 3
    manifest = json.loads((out / "manifest.json").read_text())
    release = manifest["release"]
    assert (
        release["failed_step"] == "norm_bound" and "noisy user count" in release["failure_reason"]
    )
    assert "--row-norm B" in capsys.readouterr().err
    assert manifest["parameters"]["row_norm"] is None and not (out / "basis.npy").exists()
    assert "partitions" not in manifest["parameters"]  # withheld at user level, as on success
    steps = {s["step"]: s for s in manifest["privacy"]["budget"]["steps"]}
    share = power.NORM_SHARE if method == "power" else covariance.NORM_SHARE  # of ε = 1
    assert steps["norm_bound"]["epsilon"] == pytest.approx(share)
    assert manifest["privacy"]["budget"]["spent"]["epsilon"] == pytest.approx(share)


@pytest.mark.parametrize(("users", "epsilon"), [(5000, 1.0), (500, 3.0)])
def test_enough_users_still_release_the_bound_near_the_data(users: int, epsilon: float) -> None:
    """5,000 users at ε = 1 and 500 at ε = 3 (ñ above min_count): every draw releases 64,
    just above the users' median norm 57 (bench/user_norm_bound.py)."""
    median, bounds = released_bounds(users, epsilon, 10, 0)
    assert 50 < median < 64 and bounds == [64.0] * 10


# ------------------------------------------- SuLQ's --private-norm and the explained variance


def test_sulq_private_norm_too_few_rows_is_bad_input_before_any_read(monkeypatch) -> None:
    """SuLQ (row level only) at ε = 1: ε_norm = 0.1 needs n ≥ 553; 500 rows are bad input
    before a partition is read or a step charged, naming SuLQ's own fixes; 600 rows run."""
    _, rows = _users(100)
    config = ClusterConfig(
        clusters=2, rank=1, epsilon=1.0, delta=1e-6, method="sulq", private_norm=True, seed=1
    )
    monkeypatch.setattr(Accountant, "charge", lambda *a: pytest.fail("charged"))
    monkeypatch.setattr(clustering, "compute_norm_counts", lambda *a: pytest.fail("read"))
    with pytest.raises(
        InputError,
        match=r"^500 rows are too few for a private norm bound at ε_norm = 0.1 \(needs ≥ 553\): "
        r"drop --private-norm, pass --row-norm B, a larger ε or more rows$",
    ):
        run_cluster(config, lambda client: array_dataset(rows[:500]), None)
    monkeypatch.undo()
    result = run_cluster(config, lambda client: array_dataset(rows[:600]), None)
    parameters = result.manifest["parameters"]
    assert parameters["row_norm"] in nb.GRID and parameters["row_norm_source"].startswith("priv")


def test_explained_variance_on_too_few_rows_is_skipped_uncharged() -> None:
    """ε = 1: the explained variance's bound (ε = 0.03) needs n ≥ 1,842. On 1,800 rows the basis
    is released without it, its two steps neither drawn nor charged (a function of the public n
    and ε; was: its sparse vector could fire on an empty low bin and clip every row to far below
    its norm); on 1,900 rows both steps run and release it."""
    _, rows = _users(400)
    config = EstimateConfig(1, epsilon=1.0, delta=1e-6, method="gap-perturb", row_norm=10.0)
    released = {}
    for n in (1800, 1900):
        result = run_estimate(config, lambda client, n=n: array_dataset(rows[:n]), None, 1)
        assert result.basis is not None
        steps = [s["step"] for s in result.manifest["privacy"]["budget"]["steps"]]
        released[n] = (steps, result.manifest["release"])
    steps, release = released[1800]
    assert "variance_norm_bound" not in steps and "explained_variance" not in steps
    assert release["explained_variance"] is None
    assert release["explained_variance_note"] == (
        "not released, nothing charged for it: 1800 rows are too few for the explained "
        "variance's private norm bound at ε_norm = 0.03 (needs ≥ 1842): pass a larger ε or more "
        "rows"
    )
    steps, release = released[1900]
    assert steps[-2:] == ["variance_norm_bound", "explained_variance"]
    assert release["variance_row_norm"] in nb.GRID and len(release["explained_variance"]) == 1


def test_the_mean_bound_takes_the_margin_too() -> None:
    """The centring's own bound (step ``norm_bound``, the mean's) goes through the same rule:
    NORM_QUANTILE where 1% of n is at least SV_MARGIN/ε rows, capped below that, refused
    where the interval is empty."""
    grants = {"norm_bound": ApproxDP(0.05)}
    assert centring.row_quantile("norm_bound", grants, 40_000) == nb.NORM_QUANTILE
    capped = centring.row_quantile("norm_bound", grants, 20_000)
    assert capped == pytest.approx(1 - 400 / 20_000)  # 400 rows above the threshold
    assert centring.row_quantile("norm_bound", grants, 1106) == pytest.approx(1 - 400 / 1106)
    with pytest.raises(InputError, match=r"1105 rows .* pass --row-norm B, a larger ε or more"):
        centring.row_quantile("norm_bound", grants, 1105)


def test_cli_sulq_private_norm_too_few_rows_exits_2_and_writes_nothing(
    users_parquet, scheduler_address, tmp_path, capsys
) -> None:
    """3,000 rows at ε = 0.1: ε_norm = 0.01 needs 5,533 rows."""
    out = tmp_path / "out"
    code = main(
        ["cluster", str(users_parquet), "--out", str(out), "--clusters", "2", "--rank", "1"]
        + ["--quiet", "--method", "sulq", "--private-norm", "--epsilon", "0.1"]
        + ["--delta", "1e-6", "--columns", "x0,x1,x2,x3,x4", "--scheduler", scheduler_address]
    )
    err = capsys.readouterr().err
    assert code == 2 and not out.exists() and len(err.splitlines()) == 1
    assert "3000 rows are too few" in err and "drop --private-norm" in err


def test_cli_explained_variance_too_few_rows_publishes_the_basis_without_it(
    users_parquet, scheduler_address, tmp_path, capsys
) -> None:
    """3,000 rows at ε = 0.6: the explained variance's ε = 0.018 needs 3,070 rows; gap-perturb
    still publishes its rank-1 basis (exit 0), the manifest saying why there is no explained
    variance, and charges nothing for those two steps."""
    out = tmp_path / "out"
    code = _estimate(users_parquet, out, "gap-perturb", "0.6", "--row-norm", "10", "--rank", "1",
                     "--scheduler", scheduler_address)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["release"]["explained_variance"] is None
    assert "3000 rows are too few" in manifest["release"]["explained_variance_note"]
    assert "(needs ≥ 3070)" in manifest["release"]["explained_variance_note"]
    steps = [s["step"] for s in manifest["privacy"]["budget"]["steps"]]
    assert "variance_norm_bound" not in steps and "explained_variance" not in steps
