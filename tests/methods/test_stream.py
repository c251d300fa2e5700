"""Online private PCA (ALGORITHMS.md §8): tree aggregation's structure, calibration and audit;
the stream state file; ``dpsub stream`` end to end on data with a known subspace; the first
batch's private bound and mean (plan shares, calibration, audit, known answer, old files)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from privacy_audit import epsilon_lower_bound

from dpsub_dist.cli import main
from dpsub_dist.engine.gram import clip_rows
from dpsub_dist.errors import BudgetRefused, DataError, InputError
from dpsub_dist.io.output import read_run
from dpsub_dist.job import StreamConfig
from dpsub_dist.linalg import subspace_error, top_eigenvectors
from dpsub_dist.methods.stream import open_stream
from dpsub_dist.privacy.accountant import zcdp_epsilon
from dpsub_dist.privacy.mechanism import Gaussian
from dpsub_dist.privacy.tree_aggregation import (
    REPLACE_ONE_SENSITIVITY,
    TreeAggregator,
    last_use,
    node_sigma,
    node_span,
    nodes_containing,
    prefix_nodes,
    release_node,
    rho_for_approx_dp,
    spent_rho,
    tree_levels,
)


def init_stream(path: str, **options):
    """A stream made through the API (the config checked against the method's table); the
    tree's tests read the uncentred second moment unless they ask for centring."""
    from dpsub_dist import job

    options.setdefault("center", False)
    return job.init_stream(path, StreamConfig(**options))


def noised(sigma: float, rng: np.random.Generator):
    """Each node a tree closes noised by the node mechanism at ``sigma`` (Δ = √2)."""
    mech = Gaussian(REPLACE_ONE_SENSITIVITY, sigma)
    return lambda _node, exact: release_node(exact, mech, rng)


# ----------------------------------------------------------------------- tree structure


@pytest.mark.parametrize("horizon", [1, 2, 3, 4, 5, 7, 8, 13, 16, 100])
def test_each_batch_enters_at_most_L_nodes_and_prefixes_cover_exactly(horizon):
    levels = tree_levels(horizon)
    assert levels == math.floor(math.log2(horizon)) + 1
    counts = [len(nodes_containing(b, horizon)) for b in range(1, horizon + 1)]
    assert max(counts) == counts[0] == levels  # batch 1 is in one node per level
    kept = {n for b in range(1, horizon + 1) for n in nodes_containing(b, horizon)}
    for t in range(1, horizon + 1):
        covered = [b for n in prefix_nodes(t) for b in range(node_span(n)[0], node_span(n)[1] + 1)]
        assert sorted(covered) == list(range(1, t + 1))  # a partition of 1..t
        assert set(prefix_nodes(t)) <= kept
        assert all(node_span(n)[1] <= t <= last_use(n) for n in prefix_nodes(t))
    # a batch is in a node iff the node covers it
    for b in range(1, horizon + 1):
        assert all(node_span(n)[0] <= b <= node_span(n)[1] for n in nodes_containing(b, horizon))


def test_prefix_sums_are_exact_up_to_the_noise():
    rng = np.random.default_rng(0)
    values = [np.diag(rng.uniform(size=3)) for _ in range(11)]
    tree = TreeAggregator(horizon=11, dim=3)
    for t, v in enumerate(values, start=1):
        tree.add(v, noised(1e-9, rng))
        assert np.allclose(tree.prefix(), sum(values[:t]), atol=1e-6)
    assert np.allclose(tree.prefix(5), sum(values[:5]), atol=1e-6)


def test_each_node_is_noised_once_when_it_closes_on_the_safe_grid():
    """Horizon 4 keeps nodes [1], [1,2], [3], [1..4]: four draws, each at a node's close,
    by the floating-point-safe sampler with the node's σ and Δ = √2; the stored sums lie
    on that sampler's power-of-two grid."""
    from dpsub_dist.privacy import noise

    sigma, dim, rng = 0.5, 3, np.random.default_rng(2)
    tree = TreeAggregator(horizon=4, dim=dim)
    closed = []
    with noise.draw_log() as draws:
        for _ in range(4):
            closed.append(tree.add(np.eye(dim) / 3, noised(sigma, rng)))
    assert closed == [[(0, 0)], [(1, 0)], [(0, 2)], [(2, 0)]]
    assert [(d.kind, d.scale, d.sensitivity, d.size) for d in draws] == [
        ("symmetric_gaussian", sigma, math.sqrt(2), dim * (dim + 1) // 2)
    ] * 4
    step = noise.grid_step(sigma)
    for value in tree.closed.values():
        assert np.array_equal(value / step, np.rint(value / step))
    assert tree.partial == {}


def test_a_level_draws_again_only_with_the_mechanism_it_was_charged(tmp_path):
    """Append 3 of a horizon-4 stream declares no step (batch 1's rows enter no new node);
    the node it closes, level 0's second, draws again as step ``batch 1`` with the mechanism
    append 1 charged. Another σ, or a level not charged yet, is refused before any draw."""
    from dataclasses import replace
    from functools import partial

    from dpsub_dist.context import PlanMismatch
    from dpsub_dist.engine.compute import IN_PROCESS
    from dpsub_dist.methods import stream as online

    settings = init_stream(str(tmp_path / "s.db"), horizon=4, rank=1, rho=1.0, delta=1e-6)
    ctx = online.append_context(settings, 3, None, IN_PROCESS, False, noise_seed=1)
    assert ctx.shares == {}
    level = online.step_mechanism(settings, "batch 1", ctx.grant("batch 1"))
    draw = partial(release_node, np.zeros((2, 2)))
    assert ctx.redraw("batch 1", level, draw).shape == (2, 2)
    with pytest.raises(PlanMismatch):
        ctx.redraw("batch 1", replace(level, sigma=level.sigma / 2), draw)
    with pytest.raises(PlanMismatch):
        ctx.redraw("batch 4", level, draw)
    ctx.check_charged()


# --------------------------------------------------------------------------- calibration


@pytest.mark.parametrize(("rho", "horizon"), [(0.5, 4), (0.1, 365), (2.0, 1)])
def test_node_sigma_matches_rho_over_L(rho, horizon):
    levels = tree_levels(horizon)
    assert node_sigma(rho, horizon) == pytest.approx(math.sqrt(2) / math.sqrt(2 * rho / levels))
    # after T releases the worst-placed row has spent exactly rho
    assert spent_rho(horizon, rho, horizon) == pytest.approx(rho)
    increments = [spent_rho(t, rho, horizon) - spent_rho(t - 1, rho, horizon) for t in range(1, 9)]
    assert all(i >= 0 for i in increments)


def test_rho_for_approx_dp_inverts_the_cks_conversion():
    for epsilon, delta in [(1.0, 1e-6), (0.1, 1e-9), (8.0, 1e-5)]:
        rho = rho_for_approx_dp(epsilon, delta)
        assert zcdp_epsilon(rho, delta) <= epsilon
        assert zcdp_epsilon(rho * (1 + 1e-6), delta) > epsilon


def test_prefix_noise_has_the_calibrated_variance():
    """Each release sums |prefix_nodes(t)| independent node noises of std σ (3000 streams
    run side by side as one stack)."""
    sigma, draws, horizon = 2.0, 3000, 7
    rng = np.random.default_rng(1)
    tree = TreeAggregator(horizon=horizon, dim=2)
    for t in range(1, horizon + 1):
        tree.add(np.zeros((draws, 2, 2)), noised(sigma, rng))
        samples = tree.prefix()[:, 0, [0, 1]]
        expected = len(prefix_nodes(t)) * sigma**2
        assert samples.var(axis=0) == pytest.approx([expected, expected], rel=0.12)


# ------------------------------------------------------------------------ privacy audit

AUDIT_RHO, AUDIT_DELTA, AUDIT_RUNS, AUDIT_HORIZON = 0.125, 1e-3, 15_000, 4


def stream_statistics(sigma: float, row: np.ndarray, runs: int, seed: int) -> np.ndarray:
    """The likelihood-ratio statistic of ``runs`` independent streams (one stack) whose
    batch 1 holds one unit row and batches 2..T are empty: the sum over the releases whose
    nodes hold batch 1 ([1], [1,2], [1..4]) of their (0,0) − (1,1) entries."""
    rng = np.random.default_rng(seed)  # the audit's own, reproducible generator
    tree = TreeAggregator(horizon=AUDIT_HORIZON, dim=2)
    statistic = np.zeros(runs)
    for t in range(1, AUDIT_HORIZON + 1):
        batch = np.outer(row, row) if t == 1 else np.zeros((2, 2))
        tree.add(np.broadcast_to(batch, (runs, 2, 2)), noised(sigma, rng))
        if t in (1, 2, 4):
            release = tree.prefix()
            statistic += release[:, 0, 0] - release[:, 1, 1]
    return statistic


def test_audit_tree_noise_and_catch_an_under_noised_twin():
    """Neighbours replace batch 1's row e₁ by e₂ (sensitivity √2, tight); the likelihood-ratio
    statistic sums the three released nodes that hold batch 1. A twin with half the noise is
    caught; the calibrated tree is not."""
    sigma = node_sigma(AUDIT_RHO, AUDIT_HORIZON)
    claimed = zcdp_epsilon(AUDIT_RHO, AUDIT_DELTA)
    levels = tree_levels(AUDIT_HORIZON)
    # The statistic is ±L (e₁ / e₂) plus noise of std σ√(2L); the twin's std is half that.
    # Its threshold sits 2.5 twin stds above 0: P(twin, e₂) = Φ̄(3), P(twin, e₁) = Φ̄(2).
    threshold = 1.25 * sigma * math.sqrt(2 * levels)
    e1, e2 = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    bounds = {}
    for name, scale in (("real", sigma), ("twin", sigma / 2)):
        hits = [(stream_statistics(scale, row, AUDIT_RUNS, seed) > threshold).sum()
                for row, seed in ((e1, 1), (e2, 2))]  # fmt: skip
        bounds[name] = epsilon_lower_bound(*hits, AUDIT_RUNS, AUDIT_DELTA, 0.95)
    assert bounds["real"] <= claimed, bounds
    assert bounds["twin"] > claimed, (bounds, claimed)


# -------------------------------------------------------------------------- the stream


@pytest.fixture(scope="module")
def batches(tmp_path_factory) -> tuple[list[str], np.ndarray]:
    """Four batches (files) of 5,000 rows near one rank-2 subspace of R^10, and its basis."""
    from dpsub_dist.synth import generate

    out = tmp_path_factory.mktemp("stream") / "data"
    generate(out, rows=20_000, dim=10, rank=2, gamma=0.01, partitions=4, seed=11)
    files = sorted(str(p) for p in out.glob("*.parquet"))
    return files, np.load(out / "_truth" / "basis.npy")


def exact_gram(path: str, bound: float) -> np.ndarray:
    table = pq.read_table(path)
    rows = np.column_stack([table.column(n).to_numpy() for n in table.column_names])
    rows = clip_rows(rows.astype(np.float64), bound)
    return rows.T @ rows


def test_stream_spends_the_horizon_budget_and_converges(tmp_path, batches, dask_client):
    files, truth = batches
    state = str(tmp_path / "stream.db")
    settings = init_stream(state, horizon=4, rank=2, clip_norm=3.0, epsilon=1.0, delta=1e-6)
    errors = []
    with open_stream(state) as stream:
        for path in files:
            release = stream.append(path, client=dask_client)
            errors.append(subspace_error(release.basis, truth))
        report = stream.accountant().report()
        assert report["spent"]["rho"] == pytest.approx(settings.rho, rel=1e-12)
        assert report["spent_as_approx_dp"]["epsilon"] == pytest.approx(1.0, rel=1e-9)
        assert report["spent_as_approx_dp"]["delta"] == pytest.approx(1e-6)
        assert release.manifest["privacy"]["budget"] == report
        assert release.manifest["stream"]["step"] == 4
        with pytest.raises(BudgetRefused, match="all 4 batches") as err:
            stream.append(files[0], batch_id="day-5", client=dask_client)
        assert err.value.exit_code == 4
    # signal grows 4x while the noise of the released prefix stays one node's
    assert errors[-1] < 0.04 and errors[-1] < errors[0] and max(errors) < 0.2, errors


def published_nodes(state: str) -> dict[tuple[int, int], np.ndarray]:
    """The node sums the (published) stream file holds."""
    return _nodes(state, "SELECT level, idx, noisy_sum FROM dpsub_stream_nodes")


def private_nodes(state: str) -> dict[tuple[int, int], np.ndarray]:
    """The open nodes' exact sums in the operator-only file beside it."""
    return _nodes(state + ".private", "SELECT level, idx, exact_sum FROM dpsub_stream_open_nodes")


def _nodes(path: str, query: str) -> dict[tuple[int, int], np.ndarray]:
    from dpsub_dist.ledger.core import decode_array

    with sqlite3.connect(path) as conn:
        rows = conn.execute(query).fetchall()
    return {(level, idx): decode_array(blob) for level, idx, blob in rows}


def test_state_holds_only_closed_noisy_sums_and_reappend_is_idempotent(
    tmp_path, batches, dask_client
):
    files, _ = batches
    state = str(tmp_path / "stream.db")
    settings = init_stream(state, horizon=8, rank=2, clip_norm=3.0, rho=0.05, delta=1e-6)
    grams = [exact_gram(path, 3.0) for path in files]
    noises = []
    with open_stream(state) as stream:
        first = stream.append(files[0], batch_id="day-1", client=dask_client)
        again = stream.append(files[0], batch_id="day-1", client=dask_client)
        assert again.already_appended and np.array_equal(again.basis, first.basis)
        assert stream.status()["step"] == 1
        assert stream.accountant().spent.rho == pytest.approx(settings.rho / settings.levels)
        # node [1] closed, was released, and no later release needs it; the open nodes'
        # exact sums are only in the private file
        assert published_nodes(state) == {}
        opened = private_nodes(state)
        assert set(opened) == set(nodes_containing(1, 8)) - {(0, 0)} == {(1, 0), (2, 0), (3, 0)}
        assert all(np.allclose(v, grams[0]) for v in opened.values())
        stream.append(files[1], batch_id="day-2", client=dask_client)
        assert set(published_nodes(state)) == {(1, 0)}  # [1,2] closed: noised once, now
        noises.append(published_nodes(state)[(1, 0)] - grams[0] - grams[1])
        for day, path in enumerate(files[2:], start=3):
            stream.append(path, batch_id=f"day-{day}", client=dask_client)
        assert set(published_nodes(state)) == {(2, 0)}
        noises.append(published_nodes(state)[(2, 0)] - sum(grams))
        assert set(private_nodes(state)) == {(3, 0)}
        assert np.allclose(private_nodes(state)[(3, 0)], sum(grams))
    with sqlite3.connect(state) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert not any("row" in t or "open" in t or "files" in t for t in tables), tables
    assert all(np.allclose(n, n.T) for n in noises)
    upper = np.concatenate([n[np.triu_indices(10)] for n in noises])  # 2 × 55 noise draws
    assert 0.75 * settings.node_sigma < upper.std() < 1.25 * settings.node_sigma
    assert abs(upper.mean()) < 4 * settings.node_sigma / math.sqrt(upper.size)


def test_stream_without_noise_releases_the_exact_clipped_basis(tmp_path, batches, dask_client):
    files, _ = batches
    state = str(tmp_path / "stream.db")
    init_stream(state, horizon=2, rank=2, clip_norm=1.5, rho=1e9, delta=1e-6)
    with open_stream(state) as stream:
        stream.append(files[0], client=dask_client)
        release = stream.append(files[1], client=dask_client)
    gram = exact_gram(files[0], 1.5) + exact_gram(files[1], 1.5)
    _, exact = top_eigenvectors(gram, 2)
    assert subspace_error(release.basis, exact) < 1e-4


def test_bad_inputs_and_corrupt_state(tmp_path, batches, dask_client):
    files, _ = batches
    with pytest.raises(InputError, match="horizon must be an integer"):
        init_stream(str(tmp_path / "a.db"), horizon=0, rank=2, clip_norm=1.0, rho=1, delta=1e-6)
    with pytest.raises(InputError, match="--clip-norm must be a positive finite number"):
        init_stream(str(tmp_path / "a.db"), horizon=3, rank=2, clip_norm=-1.0, rho=1, delta=1e-6)
    with pytest.raises(InputError, match="epsilon must be > 0"):
        init_stream(str(tmp_path / "a.db"), horizon=3, rank=2, clip_norm=1.0, epsilon=0, delta=1e-6)
    assert not (tmp_path / "a.db").exists()
    junk = tmp_path / "junk.db"
    junk.write_text("not a stream")
    with pytest.raises(InputError, match="not a SQLite database"):
        open_stream(str(junk))
    ledger = tmp_path / "ledger.db"
    assert main(["budget", "init", "--ledger", str(ledger), "--dataset", "/d", "--rho", "1"]
                + ["--delta", "1e-6"]) == 0  # fmt: skip
    with pytest.raises(InputError, match="not a dpsub stream"):
        open_stream(str(ledger))
    narrow = str(tmp_path / "narrow.db")  # rank ≥ D is found at append (footers), not init
    init_stream(narrow, horizon=3, rank=2, clip_norm=1.0, rho=1, delta=1e-6, columns=["x0", "x1"])
    with (
        open_stream(narrow) as stream,
        pytest.raises(InputError, match=r"rank 2 must be smaller than the number of features \(2"),
    ):
        stream.append(files[0], client=dask_client)
    with open_stream(narrow) as stream:
        assert stream.status()["step"] == 0
    state = str(tmp_path / "s.db")
    init_stream(
        state, horizon=3, rank=2, clip_norm=1.0, rho=1, delta=1e-6, columns=["x0", "x1", "z"]
    )
    with (
        open_stream(state) as stream,
        pytest.raises(InputError, match=r"columns not found: \['z'\]"),
    ):
        stream.append(files[0], client=dask_client)
    with open_stream(state) as stream:
        assert stream.status()["step"] == 0  # nothing appended, nothing spent
        assert stream.accountant().spent.rho == 0


def test_stream_cli(tmp_path, batches, scheduler_address, capsys):
    files, truth = batches
    state = str(tmp_path / "s.db")
    init = ["stream", "init", state, "--horizon", "2", "--rank", "2", "--clip-norm", "3"]
    assert main([*init, "--epsilon", "2", "--delta", "1e-6"]) == 0
    assert main([*init, "--epsilon", "2", "--delta", "1e-6"]) == 2  # exists
    common = ["--scheduler", scheduler_address, "--quiet"]
    for day, path in enumerate(files[:2], start=1):
        out = str(tmp_path / f"day-{day}")
        assert (
            main(["stream", "append", state, path, "--out", out, "--batch-id", f"d{day}", *common])
            == 0
        )
        basis, manifest = read_run(out)
        assert manifest["stream"]["step"] == day and subspace_error(basis, truth) < 0.2
    assert main(["stream", "append", state, files[2], "--batch-id", "d3", *common]) == 4
    assert "start a new stream" in capsys.readouterr().err
    assert main(["stream", "show", state, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["step"] == 2
    assert status["budget"]["spent_as_approx_dp"]["epsilon"] == pytest.approx(2.0, rel=1e-9)
    latest = str(tmp_path / "latest")
    assert main(["stream", "show", state, "--out", latest]) == 0
    assert np.array_equal(read_run(latest)[0], read_run(str(tmp_path / "day-2"))[0])
    assert Path(latest, "manifest.json").is_file()


def test_an_append_racing_another_adds_nothing(tmp_path, batches, dask_client, monkeypatch):
    """Two appends read their batches at once: the second to commit is refused (exit 1)."""
    from dpsub_dist.ledger import LedgerUnavailable
    from dpsub_dist.methods import stream as online

    files, _ = batches
    state = str(tmp_path / "s.db")
    init_stream(state, horizon=4, rank=2, clip_norm=3.0, rho=1.0, delta=1e-6)
    real, raced = online.compute_gram, []

    def racing(*args, **kwargs):
        if not raced:  # while this batch is being read, another append commits
            raced.append(True)
            with open_stream(state) as other:
                other.append(files[1], batch_id="other", client=dask_client)
        return real(*args, **kwargs)

    monkeypatch.setattr(online, "compute_gram", racing)
    with open_stream(state) as stream, pytest.raises(LedgerUnavailable, match="again") as err:
        stream.append(files[0], batch_id="mine", client=dask_client)
    assert err.value.exit_code == 1
    with open_stream(state) as stream:
        assert [b.batch_id for b in stream.batches()] == ["other"]
        assert stream.append(files[0], batch_id="mine", client=dask_client).step == 2


# ------------------------------------------------- published state, batch identity, ledger


def test_two_snapshots_around_an_append_do_not_reveal_the_batch(tmp_path, batches, dask_client):
    """An observer of the stream file before and after an append subtracts every pair of node
    sums: none may equal the appended batch's exact Gram matrix (today an open node's noise was
    drawn at its first batch and reused, so the difference of its two snapshots was exact)."""
    files, _ = batches
    state = str(tmp_path / "stream.db")
    settings = init_stream(state, horizon=4, rank=2, clip_norm=3.0, rho=0.5, delta=1e-6)
    snapshots = [published_nodes(state)]
    with open_stream(state) as stream:
        for step, path in enumerate(files, start=1):
            stream.append(path, batch_id=f"day-{step}", client=dask_client)
            snapshots.append(published_nodes(state))
    margin = settings.node_sigma  # the noise per entry; a leak would match to rounding
    for step, path in enumerate(files, start=1):
        gram = exact_gram(path, 3.0)
        for before in snapshots[step - 1].values():
            for after in snapshots[step].values():
                assert np.abs(after - before - gram).max() > margin
    # only closed nodes are in the published file
    for step, nodes in enumerate(snapshots):
        assert all(node_span(n)[1] <= step for n in nodes), (step, nodes.keys())
    # and the stored node holding batches 1..2 is noisy, not an exact sum
    two = snapshots[2][(1, 0)] - exact_gram(files[0], 3.0) - exact_gram(files[1], 3.0)
    assert np.abs(two).max() > margin


def test_stream_files_are_created_private(tmp_path, batches, dask_client):
    files, _ = batches
    state = tmp_path / "stream.db"
    init_stream(str(state), horizon=2, rank=2, clip_norm=3.0, rho=0.5, delta=1e-6)
    with open_stream(str(state)) as stream:
        stream.append(files[0], client=dask_client)
    made = [p for p in tmp_path.iterdir() if p.name.startswith("stream.db")]
    assert state in made
    for path in made:
        assert path.stat().st_mode & 0o777 == 0o600, (path, oct(path.stat().st_mode))


def test_one_file_under_other_names_is_refused_and_charges_nothing(
    tmp_path, batches, scheduler_address, capsys, monkeypatch
):
    """The same file appended as ./x.parquet, by a symlink, by a copy's batch id or inside a
    folder is refused with exit 2 before anything is read; re-appending the same batch id
    re-releases it for free."""
    import shutil

    files, _ = batches
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(files[0], data / "x.parquet")
    (data / "link.parquet").symlink_to(data / "x.parquet")
    monkeypatch.chdir(data)
    state = str(tmp_path / "s.db")
    common = ["--scheduler", scheduler_address, "--quiet"]
    init = ["stream", "init", state, "--horizon", "4", "--rank", "2", "--clip-norm", "3"]
    assert main([*init, "--rho", "1", "--delta", "1e-6"]) == 0
    assert main(["stream", "append", state, str(data / "x.parquet"), *common]) == 0
    capsys.readouterr()
    assert main(["stream", "append", state, "./x.parquet", *common]) == 0  # same id: free
    assert "already appended" in capsys.readouterr().out
    for spelling, batch_id in [
        ("./x.parquet", "other-id"),
        (str(data / "x.parquet"), "renamed"),
        (str(data / "link.parquet"), None),
        (str(data / "link.parquet"), "day-2"),
        (str(data / "*.parquet"), "glob"),
    ]:
        extra = ["--batch-id", batch_id] if batch_id else []
        assert main(["stream", "append", state, spelling, *extra, *common]) == 2, spelling
        err = capsys.readouterr().err
        assert "already in this stream" in err, err
    with open_stream(state) as stream:
        assert stream.status()["step"] == 1
        # centred with a public bound: the first batch's mean (20%) and one of the 3 levels
        assert stream.accountant().spent.rho == pytest.approx(0.2 + 0.8 / 3)


def test_a_file_twice_in_one_batch_is_refused(tmp_path, batches, dask_client):
    import shutil

    files, _ = batches
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(files[0], data / "a.parquet")
    (data / "b.parquet").symlink_to(data / "a.parquet")
    state = str(tmp_path / "s.db")
    init_stream(state, horizon=2, rank=2, clip_norm=3.0, rho=0.5, delta=1e-6)
    with open_stream(state) as stream, pytest.raises(InputError, match="twice in this batch"):
        stream.append(str(data), client=dask_client)


def test_an_object_copied_to_another_key_is_refused_by_its_etag(tmp_path, batches, dask_client):
    """On object storage a batch's files are identified by key, size and ETag (no read)."""
    import shutil

    from s3server import s3_server, upload

    files, _ = batches
    local = tmp_path / "days"
    local.mkdir()
    for name, source in [("a", files[0]), ("b", files[0]), ("c", files[1])]:
        shutil.copy(source, local / f"{name}.parquet")
    state = str(tmp_path / "s.db")
    init_stream(state, horizon=4, rank=2, clip_norm=3.0, rho=1.0, delta=1e-6)
    (tmp_path / "moto").mkdir()
    with s3_server(tmp_path / "moto") as s3:
        upload(s3, local, "s3://data/days")
        options = s3.storage_options()
        with open_stream(state) as stream:
            stream.append("s3://data/days/a.parquet", storage_options=options, client=dask_client)
            # whether two files' bytes match depends on their rows: a failure, charged
            with pytest.raises(DataError, match="same bytes as a file of batch id"):
                stream.append("s3://data/days/b.parquet", "b", options, dask_client)
            assert stream.status()["batches"][1]["n_rows"] == 0
            assert stream.append("s3://data/days/c.parquet", "c", options, dask_client).step == 3
    with sqlite3.connect(state + ".private") as conn:
        stored = conn.execute(
            "SELECT path, content FROM dpsub_stream_files ORDER BY step"
        ).fetchall()
    assert [p for p, _ in stored] == [f"s3://data/days/{k}.parquet" for k in "abc"]
    assert all(c.startswith("etag:") for _, c in stored), stored
    with sqlite3.connect(state) as conn:  # the published file holds no file identity
        assert "etag" not in " ".join(str(r) for r in conn.iterdump()).lower()


def test_stream_init_reserves_the_horizon_budget_in_the_ledger(tmp_path, batches, capsys):
    """A dataset granted ε can be streamed once at ε, not twice with independent budgets."""
    files, _ = batches
    dataset = str(Path(files[0]).parent)
    ledger = str(tmp_path / "ledger.db")
    grant = ["budget", "init", "--ledger", ledger, "--dataset", dataset]
    assert main([*grant, "--epsilon", "1", "--delta", "1e-6"]) == 0
    init = ["--horizon", "4", "--rank", "2", "--clip-norm", "3", "--ledger", ledger]
    first = str(tmp_path / "first.db")
    assert main(["stream", "init", first, *init, "--dataset", dataset, "--epsilon", "0.75",
                 "--delta", "1e-6"]) == 0  # fmt: skip
    assert "reserved epsilon=0.75" in capsys.readouterr().out
    second = str(tmp_path / "second.db")
    code = main(["stream", "init", second, *init, "--dataset", dataset, "--epsilon", "0.75",
                 "--delta", "1e-6"])  # fmt: skip
    assert code == 4
    assert "budget refused" in capsys.readouterr().err
    assert not Path(second).exists() and not list(tmp_path.glob("second.db*"))
    assert main(["budget", "show", "--ledger", ledger, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)[0]
    assert shown["remaining"]["epsilon"] == pytest.approx(0.25)
    # a dataset without a grant, or a batch outside the granted dataset: exit 2, nothing made
    other = str(tmp_path / "other.db")
    code = main(["stream", "init", other, *init, "--dataset", str(tmp_path), "--epsilon", "0.1",
                 "--delta", "1e-6"])  # fmt: skip
    assert code == 2 and not Path(other).exists()
    assert "no budget" in capsys.readouterr().err
    assert main(["stream", "show", first]) == 0
    assert f"charged to {dataset} in ledger {ledger}" in capsys.readouterr().out
    with open_stream(first) as stream:
        assert stream.status()["settings"]["ledger"]["dataset"] == dataset
        with pytest.raises(InputError, match="outside the dataset"):
            stream.append(str(tmp_path / "ledger.db"))


def test_stream_without_a_ledger_says_it_is_not_tracked(tmp_path, capsys):
    state = str(tmp_path / "s.db")
    init = ["stream", "init", state, "--horizon", "2", "--rank", "2", "--clip-norm", "3"]
    assert main([*init, "--epsilon", "1", "--delta", "1e-6"]) == 0
    assert "not tracked by a ledger" in capsys.readouterr().err
    assert main(["stream", "show", state]) == 0
    assert "not tracked by a ledger" in capsys.readouterr().out
    assert main(["stream", "init", str(tmp_path / "t.db"), "--horizon", "2", "--rank", "2",
                 "--clip-norm", "3", "--epsilon", "1", "--delta", "1e-6",
                 "--dataset", "/d"]) == 2  # fmt: skip
    assert "--dataset needs --ledger" in capsys.readouterr().err


def test_stream_messages_describe_the_horizon_and_each_charge(
    tmp_path, batches, scheduler_address, capsys
):
    files, _ = batches
    with pytest.raises(SystemExit):
        main(["stream", "init", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "whole horizon" in help_text and "for the whole run" not in help_text
    state = str(tmp_path / "s.db")
    init = ["stream", "init", state, "--horizon", "4", "--rank", "2", "--clip-norm", "3"]
    assert main([*init, "--rho", "1", "--delta", "1e-6"]) == 0
    common = ["--scheduler", scheduler_address, "--quiet"]
    capsys.readouterr()
    assert main(["stream", "append", state, files[0], *common]) == 0
    out = capsys.readouterr().out
    charged = 0.2 + 0.8 / 3  # the first batch's mean (20% of ρ) and the tree's level 0 of 3
    assert f"charged rho={charged:.6g}" in out and f"rho={1 - charged:.6g} of 1 remains" in out


def test_a_stream_without_its_private_file_takes_no_batch(tmp_path, batches, dask_client):
    """The open nodes' exact sums live only in STATE.private: without it (or with another
    stream's) an append stops before reading (exit 2); show still works."""
    files, _ = batches
    state, other = str(tmp_path / "s.db"), str(tmp_path / "o.db")
    for path in (state, other):
        init_stream(path, horizon=4, rank=2, clip_norm=3.0, rho=1.0, delta=1e-6)
    with open_stream(state) as stream:
        stream.append(files[0], client=dask_client)
    Path(state + ".private").unlink()
    with open_stream(state) as stream:
        with pytest.raises(InputError, match="private file of stream .* is missing"):
            stream.append(files[1], client=dask_client)
        assert stream.status()["step"] == 1
    Path(other + ".private").rename(state + ".private")
    with open_stream(state) as stream, pytest.raises(InputError, match="not the private file"):
        stream.append(files[1], client=dask_client)


# ---------------------------------- the first batch: private bound and centring (#14, #15)


def _write(path: Path, rows: np.ndarray) -> str:
    import pyarrow as pa

    pq.write_table(pa.table({f"x{j}": rows[:, j] for j in range(rows.shape[1])}), path)
    return str(path)


@pytest.fixture(scope="module")
def offset_batches(tmp_path_factory) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Four batches of 4,000 rows: a rank-2 signal (std 3 and 2) in R^8 plus small noise,
    around a mean of norm 20 orthogonal to it; the signal's basis and the mean."""
    rng = np.random.default_rng(5)
    basis, _ = np.linalg.qr(rng.normal(size=(8, 3)))
    signal, mean = basis[:, :2], 20.0 * basis[:, 2]
    root = tmp_path_factory.mktemp("offset")
    files = []
    for i in range(4):
        z = rng.normal(size=(4_000, 2)) * [3.0, 2.0]
        rows = mean + z @ signal.T + 0.05 * rng.normal(size=(4_000, 8))
        files.append(_write(root / f"b{i}.parquet", rows))
    return files, signal, mean


def test_a_centred_stream_finds_the_principal_subspace_around_its_mean(
    tmp_path, offset_batches, dask_client
):
    """Known answer: with a mean far from 0 the centred stream (the default, private bound
    and mean from batch 1) releases the principal subspace; --no-center releases the raw
    second moment's, which holds the mean's direction."""
    files, signal, mean = offset_batches
    centred = str(tmp_path / "centred.db")
    raw = str(tmp_path / "raw.db")
    init_stream(centred, horizon=4, rank=2, rho=2.0, delta=1e-6, center=None)
    init_stream(raw, horizon=4, rank=2, rho=2.0, delta=1e-6, center=False)
    with open_stream(centred) as stream:
        releases = [stream.append(path, client=dask_client) for path in files]
    first, last = releases[0].manifest, releases[-1].manifest
    assert subspace_error(releases[-1].basis, signal) < 0.05
    assert np.linalg.norm(np.array(last["release"]["mean"]) - mean) < 0.5
    # fixed at the first batch and published in every manifest: the same values each time
    for release in releases:
        manifest = release.manifest
        assert manifest["release"]["mean"] == first["release"]["mean"]
        assert manifest["parameters"]["row_norm"] == first["parameters"]["row_norm"]
        assert (
            manifest["parameters"]["center"] is True
            and manifest["parameters"]["mean_n_rows"] == 4_000
        )
    # the centred rows' bound (their norms: ~3.6 typical), not the raw rows' (≥ 20)
    assert first["parameters"]["row_norm"] < 12
    assert "centred_norm_bound" in first["parameters"]["row_norm_source"]
    with open_stream(raw) as stream:
        for path in files:
            release = stream.append(path, client=dask_client)
    assert release.manifest["parameters"]["center"] is False
    assert "mean" not in release.manifest["release"]
    direction = mean / np.linalg.norm(mean)
    assert np.linalg.norm(release.basis.T @ direction) > 0.99  # the mean's direction
    assert subspace_error(release.basis, signal) > 0.5


def test_first_batch_steps_are_calibrated_to_their_shares(tmp_path, batches, dask_client):
    """The first append charges norm_bound, mean and centred_norm_bound with the shares of the
    plan (5%, 18%, 5%; the tree 72% over L levels), and every draw has the σ or scale those
    shares buy: the sparse vectors at ε = √(2ρ_step), the mean at Δ = 2 scaled by B/n, the
    nodes at √2/√(2ρ_tree/L). Later batches charge only the tree's levels."""
    from dpsub_dist.privacy import noise

    files, _ = batches
    rho, horizon = 0.5, 4
    state = str(tmp_path / "s.db")
    settings = init_stream(state, horizon=horizon, rank=2, rho=rho, delta=1e-6, center=None)
    levels = tree_levels(horizon)
    expected = {"norm_bound": 0.05, "mean": 0.18, "centred_norm_bound": 0.05}
    expected |= {f"batch {2**h}": 0.72 / levels for h in range(levels)}
    assert settings.plan.keys() == expected.keys()
    assert [p for p, _ in settings.plan.values()] == pytest.approx(list(expected.values()))
    assert settings.node_sigma == pytest.approx(math.sqrt(2) / math.sqrt(2 * 0.72 * rho / levels))
    with open_stream(state) as stream, noise.draw_log() as draws:
        release = stream.append(files[0], client=dask_client)
    steps = {s["step"]: s["rho"] for s in release.manifest["privacy"]["budget"]["steps"]}
    assert list(steps) == ["norm_bound", "mean", "centred_norm_bound", "batch 1"]
    assert list(steps.values()) == pytest.approx([expected[s] * rho for s in steps])
    assert release.charged_rho == pytest.approx(sum(steps.values()))
    parameters = release.manifest["parameters"]
    n = release.manifest["n_rows"]
    mean_sigma = 2 / math.sqrt(2 * 0.18 * rho)
    assert release.manifest["release"]["mean_noise_sigma"] == pytest.approx(mean_sigma)
    scales = sorted(d.scale for d in draws)
    eps = [math.sqrt(2 * 0.05 * rho)] * 2
    wanted = [4 / e for e in eps]  # the two sparse vectors' query noise
    wanted += [mean_sigma * parameters["mean_row_norm"] / n, settings.node_sigma]
    for scale in wanted:
        assert any(math.isclose(scale, s, rel_tol=1e-12) for s in scales), (scale, scales)
    assert {d.kind for d in draws if d.scale == settings.node_sigma} == {"symmetric_gaussian"}
    with open_stream(state) as stream:
        second = stream.append(files[1], client=dask_client)
        third = stream.append(files[2], client=dask_client)
    assert second.charged_rho == pytest.approx(0.72 * rho / levels)
    assert third.charged_rho == 0.0  # batch 3 enters no new level for batch 1's rows


def _as_before_the_plan(state: str) -> None:
    """Rewrite a stream file as streams were made before the budget plan: schema 2, no
    centring, no plan, no first-batch values in its settings."""
    with sqlite3.connect(state) as conn:
        (text,) = conn.execute(
            "SELECT value FROM dpsub_stream_meta WHERE key = 'settings'"
        ).fetchone()
        settings = json.loads(text)
        for key in ("center", "shares", "tree_rho", "first_batch"):
            settings.pop(key)
        conn.execute(
            "UPDATE dpsub_stream_meta SET value = ? WHERE key = 'settings'", (json.dumps(settings),)
        )
        conn.execute("UPDATE dpsub_stream_meta SET value = '2' WHERE key = 'schema_version'")


def test_a_stream_made_before_centring_opens_and_appends_as_before(tmp_path, batches, dask_client):
    """Old stream files (no centring or plan in their settings) keep the public bound and the
    uncentred second moment, with and without batches already appended."""
    files, _ = batches
    fresh, started = str(tmp_path / "fresh.db"), str(tmp_path / "started.db")
    for state in (fresh, started):
        init_stream(state, horizon=2, rank=2, clip_norm=1.5, rho=1e9, delta=1e-6, center=False)
    with open_stream(started) as stream:
        stream.append(files[0], client=dask_client)
    for state in (fresh, started):
        _as_before_the_plan(state)
    with open_stream(fresh) as stream:
        assert stream.settings.center is False and stream.settings.shares is None
        first = stream.append(files[0], client=dask_client)
        assert first.charged_rho == pytest.approx(1e9 / 2)  # ρ/L, as before
    with open_stream(started) as stream:
        assert stream.settings.first_batch is None
        last = stream.append(files[1], client=dask_client)
        assert stream.accountant().spent.rho == pytest.approx(1e9)
    gram = exact_gram(files[0], 1.5) + exact_gram(files[1], 1.5)
    _, exact = top_eigenvectors(gram, 2)
    assert subspace_error(last.basis, exact) < 1e-4
    assert last.manifest["parameters"]["center"] is False
    assert last.manifest["parameters"]["row_norm"] == 1.5
    assert first.manifest["parameters"]["row_norm_source"] == "public (--clip-norm)"


def _show(state: str, capsys) -> tuple[str, dict]:
    """``stream show`` as text, then as JSON (its ``bound_and_centre``)."""
    capsys.readouterr()
    assert main(["stream", "show", state]) == 0
    text = capsys.readouterr().out
    assert main(["stream", "show", state, "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)["bound_and_centre"]


def test_stream_show_prints_the_released_bound_and_centre(tmp_path, batches, dask_client, capsys):
    """A private bound and centre (the default): pending before the first append, then the
    released B and ‖μ̂‖ (the first batch's, as every manifest publishes them), no budget."""
    files, _ = batches
    state = str(tmp_path / "s.db")
    init_stream(state, horizon=2, rank=2, rho=0.5, delta=1e-6, center=None)
    text, shown = _show(state, capsys)
    assert "B: private, released by the first append (none yet)" in text
    assert "centred: the private mean μ̂ is released by the first append (none yet)" in text
    assert shown == {
        "row_norm": None,
        "row_norm_source": "private, from the first batch",
        "center": True,
        "mean_norm": None,
        "mean_dim": None,
    }
    with open_stream(state) as stream:
        manifest = stream.append(files[0], client=dask_client).manifest
        spent = stream.accountant().spent.rho
    bound, mean = manifest["parameters"]["row_norm"], np.array(manifest["release"]["mean"])
    assert bound > 0 and np.linalg.norm(mean) > 0
    text, shown = _show(state, capsys)
    assert f"row-norm bound B = {bound:.6g}, private, from the first batch\n" in text
    assert f"private mean μ̂: ‖μ̂‖ = {np.linalg.norm(mean):.6g}, 10 dimensions" in text
    assert shown["row_norm"] == bound and shown["center"] is True and shown["mean_dim"] == 10
    assert shown["mean_norm"] == pytest.approx(np.linalg.norm(mean), rel=1e-12)
    with open_stream(state) as stream:
        assert stream.accountant().spent.rho == spent  # showing charges nothing


def test_stream_show_of_a_public_bound_and_of_an_old_file(tmp_path, batches, dask_client, capsys):
    """--clip-norm and --no-center: the public B and "uncentred", before and after the first
    append; an old stream file (no first-batch values at all) says the same."""
    files, _ = batches
    state = str(tmp_path / "s.db")
    init_stream(state, horizon=2, rank=2, clip_norm=1.5, rho=1.0, delta=1e-6, center=False)
    expected = {
        "row_norm": 1.5,
        "row_norm_source": "public (--clip-norm)",
        "center": False,
        "mean_norm": None,
        "mean_dim": None,
    }
    for append in (False, True):
        if append:
            with open_stream(state) as stream:
                stream.append(files[0], client=dask_client)
        text, shown = _show(state, capsys)
        assert "row-norm bound B = 1.5, public (--clip-norm)\n" in text
        assert "uncentred" in text and shown == expected
    _as_before_the_plan(state)
    with open_stream(state) as stream:
        assert stream.settings.first_batch is None
    text, shown = _show(state, capsys)
    assert "B = 1.5, public (--clip-norm)" in text and "uncentred" in text and shown == expected


def test_bad_stream_input_is_refused_with_nothing_made_or_charged(tmp_path, batches, capsys):
    """--clip-norm 0 with a ledger: exit 2, no stream file, the grant untouched; an empty
    first batch of a centred stream: exit 2 before anything is charged."""
    import pyarrow as pa

    files, _ = batches
    dataset = str(Path(files[0]).parent)
    ledger = str(tmp_path / "ledger.db")
    grant = ["budget", "init", "--ledger", ledger, "--dataset", dataset]
    assert main([*grant, "--rho", "1", "--delta", "1e-6"]) == 0
    state = str(tmp_path / "s.db")
    init = ["stream", "init", state, "--horizon", "4", "--rank", "2", "--rho", "0.5"]
    init += ["--delta", "1e-6", "--ledger", ledger, "--dataset", dataset]
    for bad in (["--clip-norm", "0"], ["--clip-norm", "inf"], ["--horizon", "-1"]):
        capsys.readouterr()
        assert main([*init, *bad]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "must be" in err, err
        assert not list(tmp_path.glob("s.db*"))
    assert main(["budget", "show", "--ledger", ledger, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["remaining"]["rho"] == pytest.approx(1.0)
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({f"x{j}": pa.array([], pa.float64()) for j in range(10)}), empty)
    plain = str(tmp_path / "plain.db")
    init_stream(plain, horizon=2, rank=2, rho=1.0, delta=1e-6, center=None)
    with open_stream(plain) as stream:
        with pytest.raises(InputError, match="has no rows: the first batch fixes"):
            stream.append(str(empty))
        assert stream.status()["step"] == 0 and stream.accountant().spent.rho == 0
    few = tmp_path / "few.parquet"  # 30 rows: too few for the sparse vector's margins
    pq.write_table(pa.table({f"x{j}": np.ones(30) * (j + 1) for j in range(10)}), few)
    with open_stream(plain) as stream:
        with pytest.raises(InputError, match="the first batch: 30 rows are too few"):
            stream.append(str(few))
        assert stream.status()["step"] == 0 and stream.accountant().spent.rho == 0
    bounded = str(tmp_path / "bounded.db")  # a public bound needs no margin: the batch runs
    init_stream(bounded, horizon=2, rank=2, rho=1.0, delta=1e-6, center=False, clip_norm=40.0)
    with open_stream(bounded) as stream:
        assert stream.append(str(few)).step == 1


# ------------------------------------------ audit of the first release (the released mean)

MEAN_AUDIT_DELTA = 1e-2


def first_release_means(settings, rows: np.ndarray, runs: int, seed: int) -> tuple:
    """The stream's first-batch driver (:func:`online.first_batch`, what ``stream append``
    runs and publishes, in its first append's context) on ``rows``, ``runs`` times: the
    released mean's first coordinate in units of unit-norm rows' sums (× n/B), and the
    ``mean`` step's charge."""
    from dpsub_dist.engine.compute import IN_PROCESS
    from dpsub_dist.engine.sources import array_dataset
    from dpsub_dist.methods import stream as online

    dataset = array_dataset(rows)
    out = np.empty(runs)
    for i in range(runs):  # the audit's own, reproducible seeds
        ctx = online.append_context(settings, 1, dataset, IN_PROCESS, False, seed * runs + i)
        fixed = online.first_batch(ctx, settings)
        out[i] = fixed["mean"][0] * len(rows) / fixed["mean_row_norm"]
    return out, dict(ctx.accountant._steps)["mean"]


def _audit_first_release(
    tmp_path, monkeypatch, twin_factor: float, runs: int, threshold: float
) -> dict:
    """Neighbouring first batches: one row +e₁ or −e₁ (the sum moves by 2 = Δ, tight), the
    other rows 0. The event "mean₀ above threshold·σ" (σ: the charged grant's, for Δ = 2)
    bounds ε from below; the claim is the ε of
    the ``mean`` step's published charge (the mean is released by that step alone). The twin
    draws the mean at ``twin_factor`` times the σ of the mechanism charged."""
    from dataclasses import replace

    from dpsub_dist.methods import _centring as centring
    from dpsub_dist.privacy.accountant import gaussian_sigma

    state = str(tmp_path / f"audit-{twin_factor}.db")
    settings = init_stream(
        state, horizon=4, rank=1, clip_norm=1.0, rho=1.0, delta=1e-6, center=True
    )
    rows = np.zeros((20, 2))
    bounds = {}
    for name, factor in (("real", 1.0), ("twin", twin_factor)):
        real = centring.gaussian_mean
        if factor != 1.0:
            monkeypatch.setattr(
                centring,
                "gaussian_mean",
                lambda s, n, mech, *a, real=real, f=factor, **k: real(
                    s, n, replace(mech, sigma=mech.sigma * f), *a, **k
                ),
            )
        hits = []
        for sign, seed in ((1.0, 1), (-1.0, 2)):
            rows[0, 0] = sign
            means, charged = first_release_means(settings, rows, runs, seed)
            hits.append(int((means > threshold * gaussian_sigma(charged, 2.0)).sum()))
        monkeypatch.setattr(centring, "gaussian_mean", real)
        bounds[name] = epsilon_lower_bound(*hits, runs, MEAN_AUDIT_DELTA, 0.95)
    assert charged.rho == pytest.approx(0.2)  # the mean's share of ρ = 1, public bound
    bounds["claimed"] = zcdp_epsilon(charged.rho, MEAN_AUDIT_DELTA)
    return bounds


def test_audit_the_first_releases_mean_and_catch_an_under_noised_twin(tmp_path, monkeypatch):
    """600 runs per neighbour: a twin with a third of the mean's noise is caught."""
    bounds = _audit_first_release(tmp_path, monkeypatch, 1 / 3, 600, 0.5)
    assert bounds["real"] <= bounds["claimed"] < bounds["twin"], bounds


@pytest.mark.slow
def test_audit_the_first_releases_mean_catches_a_half_noise_twin(tmp_path, monkeypatch):
    """3,000 runs per neighbour (about 2 minutes): half the mean's noise is caught."""
    bounds = _audit_first_release(tmp_path, monkeypatch, 1 / 2, 3_000, 0.75)
    assert bounds["real"] <= bounds["claimed"] < bounds["twin"], bounds


# ------------------------- data-dependent failures: published as "failed", charged (#27)


def _list_batch(path: Path, lengths: list[int], nan_row: int | None = None) -> str:
    """A batch with one variable-length list column ``x``: row i has ``lengths[i]`` values."""
    import pyarrow as pa

    rng = np.random.default_rng(len(lengths))
    rows = [list(rng.normal(size=n) * 0.3) for n in lengths]
    if nan_row is not None:
        rows[nan_row][0] = float("nan")
    pq.write_table(pa.table({"x": pa.array(rows, type=pa.list_(pa.float64()))}), path)
    return str(path)


def _published(state: str, code: int, captured, capsys) -> tuple:
    """What an append publishes: exit code, stdout, stderr without the diagnostics file's
    path (a random token), and the stream file (show --json without the
    times, and the manifest this append stored; earlier releases differ by their noise)."""
    line = captured.err.strip().rsplit(" ", 1)[0] if code == 6 else captured.err
    assert main(["stream", "show", state, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    for batch in status["batches"]:
        batch.pop("appended_at")
    status.pop("state")
    status["settings"].pop("created_at")
    with sqlite3.connect(state) as conn:
        manifest = conn.execute(
            "SELECT manifest FROM dpsub_stream_releases ORDER BY step DESC LIMIT 1"
        ).fetchone()
    return code, captured.out, line, status, manifest


FAILED_LINE = (
    "dpsub stream: error: the run failed after reading its data (next: dpsub inspect INPUT "
    "shows each column's missing and non-finite values); details for the operator in"
)


def test_a_first_batch_whose_list_width_fails_the_rank_is_charged_like_its_neighbour(
    tmp_path, scheduler_address, capsys, monkeypatch
):
    """A variable list's width is read from a row: rank 2 on width 2 (every row valid), and
    the neighbour whose first row has 5 values (ragged), publish the same thing (exit 6, one
    generic line, step 1 taken and charged), not a free exit 2 naming the width for one.
    A stream whose first batch failed has no bound or mean: it takes no more batches."""
    diagnostics = tmp_path / "diagnostics"
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(diagnostics))
    common = ["--scheduler", scheduler_address, "--quiet"]
    published = {}
    for name, first in (("valid", 2), ("longer", 5)):
        batch = _list_batch(tmp_path / "batch.parquet", [first] + [2] * 59)  # one name
        state = str(tmp_path / f"{name}.db")
        init = ["stream", "init", state, "--horizon", "4", "--rank", "2", "--clip-norm", "3"]
        assert main([*init, "--no-center", "--rho", "1", "--delta", "1e-6"]) == 0
        capsys.readouterr()
        code = main(["stream", "append", state, batch, "--batch-id", "day-1", *common])
        published[name] = _published(state, code, capsys.readouterr(), capsys)
    assert published["valid"] == published["longer"], published
    code, out, line, status, manifest = published["valid"]
    assert (code, out, line) == (6, "", FAILED_LINE)
    assert status["step"] == 1 and status["batches"][0]["n_rows"] == 0
    assert status["budget"]["spent"]["rho"] == pytest.approx(1 / 3)  # batch 1: one level of 3
    assert json.loads(manifest[0])["outcome"] == "failed: the run failed after reading its data"
    details = " ".join(p.read_text() for p in diagnostics.iterdir())
    assert "number of features (2)" in details and "different lengths" in details
    fine = _list_batch(tmp_path / "fine.parquet", [3] * 60)
    assert main(["stream", "append", state, fine, *common]) == 2
    assert "first batch of stream" in capsys.readouterr().err
    assert main(["stream", "show", state, "--out", str(tmp_path / "out")]) == 2
    assert "released no basis yet" in capsys.readouterr().err


def test_later_batches_that_fail_validation_are_charged_and_the_stream_goes_on(
    tmp_path, scheduler_address, capsys, monkeypatch
):
    """After a batch of width 3: a batch whose first row has 5 values (its width against
    the stream's) and its neighbour whose eighth row has (ragged) publish the same; each
    takes its step and charges it, once (the same batch id fails again for free); a batch
    with a NaN does too; the tree stays on schedule and the next valid batch is released."""
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diagnostics"))
    common = ["--scheduler", scheduler_address, "--quiet"]
    first = _list_batch(tmp_path / "first.parquet", [3] * 60)
    published = {}
    for name, row in (("first_row", 0), ("eighth_row", 7)):
        lengths = [3] * 60
        lengths[row] = 5
        probe = _list_batch(tmp_path / "probe.parquet", lengths)  # one name: the same input
        state = str(tmp_path / f"{name}.db")
        init = ["stream", "init", state, "--horizon", "4", "--rank", "2", "--clip-norm", "3"]
        assert main([*init, "--no-center", "--rho", "1", "--delta", "1e-6"]) == 0
        assert main(["stream", "append", state, first, *common]) == 0
        capsys.readouterr()
        code = main(["stream", "append", state, probe, "--batch-id", "day-2", *common])
        published[name] = _published(state, code, capsys.readouterr(), capsys)
    assert published["first_row"] == published["eighth_row"], published
    code, _, line, status, _ = published["first_row"]
    assert (code, line) == (6, FAILED_LINE) and status["step"] == 2
    assert status["budget"]["spent"]["rho"] == pytest.approx(2 / 3)  # batches 1 and 2
    assert main(["stream", "append", state, probe, "--batch-id", "day-2", *common]) == 6
    nan = _list_batch(tmp_path / "nan.parquet", [3] * 60, nan_row=11)
    assert main(["stream", "append", state, nan, "--batch-id", "day-3", *common]) == 6
    assert "NaN" not in capsys.readouterr().err
    last = _list_batch(tmp_path / "last.parquet", [3] * 61)
    out = str(tmp_path / "day-4")
    assert main(["stream", "append", state, last, "--out", out, *common]) == 0
    basis, manifest = read_run(out)
    assert manifest["stream"]["step"] == 4 and basis.shape == (3, 2)
    assert manifest["stream"]["rows_so_far"] == 60 + 61  # failed batches add no row
    with open_stream(state) as stream:
        assert stream.status()["step"] == 4
        assert stream.accountant().spent.rho == pytest.approx(1.0)
