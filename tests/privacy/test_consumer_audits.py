"""Privacy audits at the level a consumer sees: the whole run, read from its published manifest.

The mechanism-level audits (tests/privacy/test_covariance_audit.py,
tests/privacy/test_norm_bound.py, …) call one mechanism on the values it is handed. These
run ``run_estimate`` end to end on crafted
neighbouring inputs and read the released number from the manifest, so they also catch a
wrong clipping bound, a wrong scaling by ``B/n`` or a wrong sensitivity anywhere between the
rows and the draw. Each event depends on one step's release only, so its ε lower bound must
stay below that step's charge as the manifest reports it; the planted twin under-noises the
sampler (below the accountant, which would refuse a stated cost above the grant) and must be
caught. Runs are sized for ~30 s on 2 shared cores; the ``slow`` variants use a milder twin.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from privacy_audit import AuditResult, audit, scale_samplers

from dpsub_dist.context import RunContext
from dpsub_dist.engine.assign import UnitIds
from dpsub_dist.engine.compute import IN_PROCESS
from dpsub_dist.engine.sources import Dataset, array_dataset
from dpsub_dist.job import ClusterConfig, EstimateConfig, run_cluster, run_estimate
from dpsub_dist.methods import _centring as centring
from dpsub_dist.privacy import column_scales as scales
from dpsub_dist.privacy.accountant import ApproxDP, gaussian_sigma

EPSILON, DELTA = 10.0, 1e-5
"""Run budget: gauss's ``mean`` step (centred, public --row-norm) then gets (2, 2·10⁻⁶)."""


@pytest.fixture()
def gaussian_factor(monkeypatch) -> Callable[[float], None]:
    """The discrete Gaussian sampler with its σ times a factor (the twin), and no BLAS
    thread-pool probing per run (``threadpoolctl`` reads /proc on every in-process compute:
    half of a small run's time, and no part of what is audited)."""
    monkeypatch.setattr("threadpoolctl.threadpool_limits", lambda *a, **k: contextlib.nullcontext())
    return scale_samplers(monkeypatch, "add_gaussian")


def published(config: EstimateConfig) -> Callable[[np.ndarray, np.random.Generator], dict]:
    """The manifest of a whole run on ``rows``; its private noise seed from the audit's rng."""

    def run(rows: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        seed = int(rng.integers(2**63))
        return run_estimate(
            config, lambda _client: array_dataset(rows), None, noise_seed=seed
        ).manifest

    return run


def assert_holds_and_catches(honest: AuditResult, twin: AuditResult, grant: ApproxDP) -> None:
    """The honest run's lower bound stays under the step's charge; the twin's passes it."""
    assert honest.epsilon_lower < grant.epsilon, honest
    assert twin.epsilon_lower > grant.epsilon, twin


def bound_audits(run, before, after, laplace_factor, twin: float, runs: int) -> tuple:
    """The honest and the twin audit of a published private bound (the event: B = 1.0)."""

    def once(factor: float) -> AuditResult:
        laplace_factor(factor)
        event = lambda manifest: manifest["parameters"]["row_norm"] == 1.0  # noqa: E731
        return audit(run, before, after, event, runs, 0.0)

    return once(1.0), once(twin)


def charged(manifest: dict[str, Any], step: str) -> ApproxDP:
    """What the manifest says ``step`` cost."""
    (entry,) = [s for s in manifest["privacy"]["budget"]["steps"] if s["step"] == step]
    return ApproxDP(entry["epsilon"], entry["delta"])


def mean_audit(
    gaussian_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """Centring's mean as published: one row e₁ against one row −e₁ (n = 1, public bound 1).

    The clipped row sum moves by 2 = Δ; the manifest's ``release.mean`` is that sum/n plus
    the noise, so the event "mean₁ > −1 + 3σ_twin" reads the mean step alone (its marginal is
    the mean mechanism's output, whatever the later steps do)."""
    config = EstimateConfig(
        1, epsilon=EPSILON, delta=DELTA, method="gauss", row_norm=1.0, center=True
    )
    run = published(config)
    before, after = np.array([[1.0, 0.0]]), np.array([[-1.0, 0.0]])
    grant = charged(run(before, np.random.default_rng(0)), "mean")
    spread = twin * gaussian_sigma(grant, 2.0)  # the twin's σ of the released mean (n = 1)

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        event = lambda manifest: manifest["release"]["mean"][0] > -1.0 + 3.0 * spread  # noqa: E731
        return audit(run, before, after, event, runs, grant.delta)

    return once(1.0), once(twin), grant


def test_published_mean_audit_catches_an_eighth_of_the_noise(gaussian_factor) -> None:
    honest, twin, grant = mean_audit(gaussian_factor, 0.125, 400)
    assert grant.epsilon == pytest.approx(2.0) and grant.delta == pytest.approx(2e-6)
    assert_holds_and_catches(honest, twin, grant)


@pytest.mark.slow
def test_published_mean_audit_catches_a_quarter_of_the_noise(gaussian_factor) -> None:
    honest, twin, grant = mean_audit(gaussian_factor, 0.25, 3000)
    assert_holds_and_catches(honest, twin, grant)
    assert math.isfinite(twin.epsilon_lower)


def variance_audit(
    gaussian_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """The explained variance as published (``centring.explain``: the private bound of the
    rows, then the Gaussian on the projected sums, divided by n) for a fixed released basis
    V = e₁: 1,000 rows (1, 1)/√2 plus one row e₁ or one zero row. The projected sum moves by 1
    (the whole shift is √2 = Δ with ‖z‖²), the bound's counts by one bin; the claim is what
    both steps are charged. The event reads the sums back from ``explained_variance``, its
    ratio (the total ≈ 1,000 is well above the projected ≈ 500, so the ratio is not clamped at
    1) and the published bound C (values × n/C²)."""
    config = EstimateConfig(1, epsilon=2.5, delta=DELTA, method="gap-perturb")
    shares = {"variance_norm_bound": (0.2, 0.0), "explained_variance": (0.8, 1.0)}
    ones = np.tile([math.sqrt(0.5), math.sqrt(0.5)], (1000, 1))
    before, after = np.vstack([ones, [1.0, 0.0]]), np.vstack([ones, [0.0, 0.0]])
    basis = np.array([[1.0], [0.0]])
    grant = ApproxDP(2.0, DELTA)  # the Gaussian's share of the plan below
    spread = twin * gaussian_sigma(grant, math.sqrt(2.0))  # the twin's σ on the sums

    def run(rows: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        dataset = array_dataset(rows)
        seed = int(rng.integers(2**63))  # the audit's generator seeds the run's private one
        ctx = RunContext(config, dataset, IN_PROCESS, False, seed)
        ctx.plan(shares)
        _, details = centring.explain(ctx, basis, dataset.loader)
        return details

    def event(details: dict[str, Any]) -> bool:
        """Noisy Σ‖Vᵀz‖² + Σ‖z‖² > 1500 + 3.5·(its twin's std): the whole shift, 2, along it."""
        top, ratio = details["explained_variance"][0], details["explained_variance_ratio"][0]
        total = top / ratio if ratio > 0 else 0.0  # the released total (≥ top)
        unit = details["variance_row_norm"] ** 2 / 1001  # C²/n
        return (top + total) / unit > 1500.0 + 3.5 * math.sqrt(2.0) * spread

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        return audit(run, before, after, event, runs, DELTA)

    return once(1.0), once(twin), ApproxDP(2.5, DELTA)


def test_published_explained_variance_audit_catches_an_eighth_of_the_noise(
    gaussian_factor,
) -> None:
    honest, twin, claim = variance_audit(gaussian_factor, 0.125, 400)
    assert honest.epsilon_lower < claim.epsilon, honest
    assert twin.epsilon_lower > claim.epsilon, twin


@pytest.mark.slow
def test_published_explained_variance_audit_catches_a_quarter_of_the_noise(
    gaussian_factor,
) -> None:
    honest, twin, claim = variance_audit(gaussian_factor, 0.25, 3000)
    assert honest.epsilon_lower < claim.epsilon, honest
    assert twin.epsilon_lower > claim.epsilon, twin


@dataclass(frozen=True)
class _UserRows:
    """In-memory loader of (rows, user ids) partitions (Parquet's loader returns the same)."""

    def __call__(self, part: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, UnitIds]:
        rows, ids = part
        keys, inverse = np.unique(ids, return_inverse=True)
        encoded = np.array([str(k).encode() for k in keys], dtype=object)
        return rows, UnitIds(encoded, inverse.astype(np.int64).reshape(-1))


def user_dataset(norms: list[float]) -> Dataset:
    """One user per norm, each with one row (norm, 0)."""
    rows = np.column_stack([norms, np.zeros(len(norms))])
    part = (rows, np.arange(len(norms)))
    return Dataset([part], [0], _UserRows(), ["x0", "x1"], len(norms), "users")


@pytest.fixture()
def laplace_factor(monkeypatch) -> Callable[[float], None]:
    """The discrete Laplace samplers (values and the threshold) with their scale times a
    factor (the twin); no BLAS thread-pool probing per run."""
    monkeypatch.setattr("threadpoolctl.threadpool_limits", lambda *a, **k: contextlib.nullcontext())
    return scale_samplers(monkeypatch, "add_laplace", "laplace_noise")


def user_bound_audit(
    laplace_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """The user-level bound as published (gauss, ``--unit-column``, no ``--row-norm``): 180
    users of norm 1 and 20 of norm 4, against the same plus one user of norm 2⁴² (overflow).

    At ε = 20 the step ``norm_bound`` has ε = 2 (the count and the sparse vector 1 each) and
    the rule's threshold is ñ − 20 (its floor 20/ε₂ wins), so the count at the bound 1 sits
    at the threshold in one input and one below it in the other: the event "row_norm is 1"
    reads the whole step (count, threshold and query noise) and nothing else."""
    config = EstimateConfig(1, epsilon=20.0, delta=DELTA, method="gauss", unit_column="user")
    norms = [1.0] * 180 + [4.0] * 20
    before, after = user_dataset(norms), user_dataset([*norms, 2.0**42])

    def run(dataset: Dataset, rng: np.random.Generator) -> dict[str, Any]:
        seed = int(rng.integers(2**63))
        return run_estimate(config, lambda _client: dataset, None, noise_seed=seed).manifest

    grant = charged(run(before, np.random.default_rng(0)), "norm_bound")
    return (*bound_audits(run, before, after, laplace_factor, twin, runs), grant)


def test_published_user_level_bound_audit_catches_a_32nd_of_the_noise(laplace_factor) -> None:
    honest, twin, grant = user_bound_audit(laplace_factor, 1 / 32, 300)
    assert grant.epsilon == pytest.approx(2.0) and grant.delta == 0.0
    assert_holds_and_catches(honest, twin, grant)


@pytest.mark.slow
def test_published_user_level_bound_audit_catches_a_16th_of_the_noise(laplace_factor) -> None:
    honest, twin, grant = user_bound_audit(laplace_factor, 1 / 16, 2000)
    assert_holds_and_catches(honest, twin, grant)


def power_audit(gaussian_factor, twin: float, runs: int) -> tuple[AuditResult, AuditResult]:
    """``--method power`` as published (public --row-norm 1, one iteration, k′ = D = 2): the
    row e₁ against the row e₂, so C moves by diag(1, −1), ‖E‖_F = √2 = Δ. The released basis
    is the top left singular vector of C·V + G; the event "it leans to e₁" reads the power
    step alone (the whole budget: the other steps are off)."""
    config = EstimateConfig(
        1, epsilon=2.0, delta=DELTA, method="power", row_norm=1.0, iterations=1, seed=3
    )
    before, after = np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])

    def run(rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        seed = int(rng.integers(2**63))
        return run_estimate(
            config, lambda _client: array_dataset(rows), None, noise_seed=seed
        ).basis

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        return audit(
            run, before, after, lambda basis: abs(basis[0, 0]) > abs(basis[1, 0]), runs, DELTA
        )

    return once(1.0), once(twin)


def test_published_power_basis_audit_catches_a_16th_of_the_noise(gaussian_factor) -> None:
    honest, twin = power_audit(gaussian_factor, 1 / 16, 250)
    assert honest.epsilon_lower < 2.0, honest
    assert twin.epsilon_lower > 2.0, twin


def row_bound_audit(
    laplace_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """The row-level bound as published (gauss, ``--no-center``, no ``--row-norm``), with the
    noise-matched quantile of a real run: 190 rows of norm 1 and 10 of norm 4, against one of
    the norm-1 rows replaced by a norm-4 row. At ε = 20 the step ``norm_bound`` has ε = 2 and
    the rule's threshold is q·n ≈ 189.9 (n − 16σ√D, from public n, D, ε, δ), so the count at
    the bound 1 sits on the threshold in one input and one below it in the other."""
    config = EstimateConfig(1, epsilon=20.0, delta=DELTA, method="gauss", center=False)
    rows = np.column_stack([[1.0] * 190 + [4.0] * 10, np.zeros(200)])
    before, after = rows, rows.copy()
    after[0, 0] = 4.0
    run = published(config)
    first = run(before, np.random.default_rng(0))
    quantile = float(re.search(r"q = (\S+) ", first["parameters"]["row_norm_source"])[1])
    assert 189.0 < quantile * 200 <= 190.0  # the threshold, from public n, D, ε, δ
    grant = charged(first, "norm_bound")
    return (*bound_audits(run, before, after, laplace_factor, twin, runs), grant)


def test_published_row_bound_audit_catches_a_32nd_of_the_noise(laplace_factor) -> None:
    honest, twin, grant = row_bound_audit(laplace_factor, 1 / 32, 300)
    assert grant.epsilon == pytest.approx(2.0) and grant.delta == 0.0
    assert_holds_and_catches(honest, twin, grant)


@pytest.mark.slow
def test_published_row_bound_audit_catches_a_16th_of_the_noise(laplace_factor) -> None:
    honest, twin, grant = row_bound_audit(laplace_factor, 1 / 16, 2000)
    assert_holds_and_catches(honest, twin, grant)


def test_one_user_moves_each_cumulative_user_count_by_at_most_one() -> None:
    """Δ = 1 of the user-level bound's queries through the engine's per-user pass: a user
    whose 40 rows are spread over both partitions (and whose rows alone lie in other bins)
    adds exactly 1 to the user count and at most 1 to every cumulative count."""
    from dpsub_dist.methods._norm_pass import compute_user_norm_counts

    rng = np.random.default_rng(12)
    rows = rng.standard_normal((600, 2)) * rng.choice([0.01, 1.0, 50.0], (600, 1))
    ids = rng.integers(0, 150, 600)
    extra = rng.standard_normal((40, 2)) * 3.0
    halves = [slice(0, 300), slice(300, 600)]
    parts = [(rows[h], ids[h]) for h in halves]
    grown = [
        (np.vstack([rows[h], extra[i::2]]), np.append(ids[h], [999] * 20))
        for i, h in enumerate(halves)
    ]
    counts = [
        compute_user_norm_counts(p, _UserRows(), IN_PROCESS, False).cumsum() for p in (parts, grown)
    ]
    moved = counts[1] - counts[0]
    assert moved[-1] == 1 and moved.min() >= 0 and moved.max() == 1
    assert counts[0][-1] == len(np.unique(ids))


def sulq_bound_audit(
    laplace_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """SuLQ's ``--private-norm`` bound as published (``dpsub cluster``, whole run): 200 rows,
    M of norm 1 and the rest of norm 4, M the first count at or above the rule's threshold
    q·n (q from public n, D, ε, δ and one iteration's σ, read from a first run); the
    neighbour moves one norm-1 row to norm 4, so the count at the bound 1 falls below q·n."""
    config = ClusterConfig(
        clusters=2, rank=1, epsilon=20.0, delta=DELTA, method="sulq", private_norm=True,
        iterations=1, seed=1,
    )  # fmt: skip

    def run(rows: np.ndarray, rng: np.random.Generator) -> dict[str, Any]:
        seed = int(rng.integers(2**63))
        return run_cluster(
            config, lambda _client: array_dataset(rows), None, noise_seed=seed
        ).manifest

    def table(short: int) -> np.ndarray:
        return np.column_stack([[1.0] * short + [4.0] * (200 - short), np.zeros((200, 2))])

    first = run(table(200), np.random.default_rng(0))
    quantile = float(re.search(r"q = (\S+) ", first["parameters"]["row_norm_source"])[1])
    short = math.ceil(quantile * 200)
    assert 0 < short < 200
    before, after = table(short), table(short - 1)
    grant = charged(first, "norm_bound")
    return (*bound_audits(run, before, after, laplace_factor, twin, runs), grant)


def test_published_sulq_bound_audit_catches_a_32nd_of_the_noise(laplace_factor) -> None:
    honest, twin, grant = sulq_bound_audit(laplace_factor, 1 / 32, 250)
    assert grant.epsilon == pytest.approx(2.0) and grant.delta == 0.0
    assert_holds_and_catches(honest, twin, grant)


@pytest.mark.slow
def test_published_sulq_bound_audit_catches_a_16th_of_the_noise(laplace_factor) -> None:
    honest, twin, grant = sulq_bound_audit(laplace_factor, 1 / 16, 2000)
    assert_holds_and_catches(honest, twin, grant)


def rows_of_users(users: list[list[list[float]]]) -> Dataset:
    """One partition holding each user's rows, in order."""
    rows = np.array([row for user in users for row in user], dtype=np.float64)
    ids = np.concatenate([np.full(len(user), u) for u, user in enumerate(users)])
    return Dataset([(rows, ids)], [0], _UserRows(), ["x0", "x1"], len(rows), "users")


USER_POWER_BEFORE = [[[0.0, 1.0]]]
"""One user, one row e₂ at the public bound 1."""
USER_POWER_AFTER = [*USER_POWER_BEFORE, [[1.0, 0.0], [1.0, 0.0]]]
"""The same plus a user whose two rows e₁ (Σ‖x‖² = 2) are scaled to weight 1/2 each."""


def user_power_audit(
    gaussian_factor, method: str, twin: float, runs: int
) -> tuple[AuditResult, AuditResult]:
    """``--method power`` (or auto, choosing power) at user level as published: public
    --row-norm 1, add/remove a user, so C moves by e₁e₁ᵀ after the user's scaling, ‖E‖_F ≤ 1
    = Δ (the power step is the whole budget). Before, C·V + G has one direction, e₂; after,
    C = I and the top left singular vector follows the noise: the event "the released basis
    leans to e₁" reads the power step alone."""
    config = EstimateConfig(
        1, epsilon=2.0, delta=DELTA, method=method, row_norm=1.0, seed=3, unit_column="user"
    )
    before, after = rows_of_users(USER_POWER_BEFORE), rows_of_users(USER_POWER_AFTER)

    def result(dataset: Dataset, rng: np.random.Generator) -> Any:
        seed = int(rng.integers(2**63))
        return run_estimate(config, lambda _client: dataset, None, noise_seed=seed)

    manifest = result(before, np.random.default_rng(0)).manifest
    assert manifest["method"] == "power" and manifest["parameters"]["row_norm"] == 1.0
    assert [s["step"] for s in manifest["privacy"]["budget"]["steps"]] == ["power"]

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        return audit(
            lambda dataset, rng: result(dataset, rng).basis,
            before,
            after,
            lambda basis: abs(basis[0, 0]) > abs(basis[1, 0]),
            runs,
            DELTA,
        )

    return once(1.0), once(twin)


def test_published_user_level_power_audit_catches_a_16th_of_the_noise(gaussian_factor) -> None:
    honest, twin = user_power_audit(gaussian_factor, "power", 1 / 16, 250)
    assert honest.epsilon_lower < 2.0, honest
    assert twin.epsilon_lower > 2.0, twin


@pytest.fixture()
def auto_chooses_power(monkeypatch) -> None:
    """auto's driver budget at 0 bytes: it chooses power at D = 2, as at D ≳ 9,459."""
    monkeypatch.setattr("dpsub_dist.methods.auto.DRIVER_BYTES", 0)


def test_published_user_level_auto_power_audit_catches_a_16th_of_the_noise(
    gaussian_factor, auto_chooses_power
) -> None:
    honest, twin = user_power_audit(gaussian_factor, "auto", 1 / 16, 250)
    assert honest.epsilon_lower < 2.0, honest
    assert twin.epsilon_lower > 2.0, twin


def standardize_audit(
    gaussian_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """``--standardize``'s first moments round as published: 200 rows (1, 1) and one row
    (10³, 10³) against one row (−10³, −10³), so the audited row is clipped to +c against −c in
    both columns and (Σz/(2c))_j moves by 1 in each (√2 of Δ = √(2D) = 2).

    The histogram step's coarse centre and spread are the same on both inputs in every run
    (asserted: the 200 equal rows fill one bin far above the noise, the audited row's count
    is far below the threshold), so the event "the first round's location, read back as
    (Σz/(2c))₀ + (Σz/(2c))₁, lies 3σ_twin·√2 above the second input's" depends on the
    ``standardize_moments`` release alone and must stay below that step's charge."""
    config = EstimateConfig(  # ε such that the moments step's share (3 %) is 2
        1, epsilon=200.0 / 3.0, delta=DELTA, method="gauss", row_norm=1.0, standardize=True
    )
    run = published(config)
    base = np.ones((200, 2))
    before, after = np.vstack([base, [[1e3, 1e3]]]), np.vstack([base, [[-1e3, -1e3]]])
    first = run(before, np.random.default_rng(0))
    grant = charged(first, "standardize_moments")
    centre = np.asarray(first["release"]["coarse_centre"])
    spread = np.asarray(first["release"]["coarse_spread"])
    clip = first["parameters"]["standardize_clips"][0]
    sigma = gaussian_sigma(grant, 2.0)  # Δ = √(2D), D = 2
    n = len(before)
    reference = np.sum(np.clip((after - centre) / spread, -clip, clip), axis=0) / (2 * clip)

    def statistic(manifest: dict[str, Any]) -> float:
        release = manifest["release"]
        assert release["coarse_centre"] == centre.tolist(), "the histogram step moved"
        assert release["coarse_spread"] == spread.tolist(), "the histogram step moved"
        location = np.asarray(release["location_rounds"][0])
        sums = (location - centre) * n / (2 * clip * spread)
        return float(np.sum(sums - reference))

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        cut = 3.0 * twin * sigma * math.sqrt(2.0)  # 3σ_twin of the sum of two coordinates
        return audit(run, before, after, lambda m: statistic(m) > cut, runs, grant.delta)

    return once(1.0), once(twin), grant


def test_published_standardize_audit_catches_an_eighth_of_the_noise(gaussian_factor) -> None:
    honest, twin, grant = standardize_audit(gaussian_factor, 0.125, 400)
    assert grant.epsilon == pytest.approx(2.0)
    assert_holds_and_catches(honest, twin, grant)


@pytest.mark.slow
def test_published_standardize_audit_catches_a_quarter_of_the_noise(gaussian_factor) -> None:
    honest, twin, grant = standardize_audit(gaussian_factor, 0.25, 3000)
    assert_holds_and_catches(honest, twin, grant)


def standardize_histogram_audit(
    gaussian_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """``--standardize``'s histogram step as published: 200 rows, column 0 holding 100 rows at
    1 and 100 at 4 (two grid bins, A and B), column 1 all 1; plus one row (4, 1) against one
    row (1, 1). The audited row moves one count from bin A to bin B (√2 of Δ = √(2D) = 2).

    Both bins are far above the threshold and every other bin far below it, so the published
    ``coarse_centre`` of column 0 is the kept mass's mean, ``(ã·v_A + b̃·v_B)/(ã + b̃)``, a
    function of the histogram release alone; read back as ``s ≈ (b̃ − ã)`` (×n, the public
    row count, for ã + b̃), the event "s lies 3σ_twin·√2 above the second input's b − a"
    must stay below that step's charge."""
    config = EstimateConfig(
        1, epsilon=40.0, delta=DELTA, method="gauss", row_norm=1.0, standardize=True
    )
    run = published(config)
    base = np.column_stack([np.repeat([1.0, 4.0], 100), np.ones(200)])
    before, after = np.vstack([base, [[4.0, 1.0]]]), np.vstack([base, [[1.0, 1.0]]])
    first = run(before, np.random.default_rng(0))
    grant = charged(first, "standardize_histogram")
    sigma = gaussian_sigma(grant, 2.0)  # Δ = √(2D), D = 2
    n = len(before)
    low, high = (float(v) for v in scales.GRID[scales.bin_index(np.array([1.0, 4.0]))])
    reference = -1.0  # the second input's b − a: 100 − 101

    def statistic(manifest: dict[str, Any]) -> float:
        centre = manifest["release"]["coarse_centre"][0]
        return (2.0 * (centre - low) / (high - low) - 1.0) * n

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        cut = 3.0 * twin * sigma * math.sqrt(2.0)  # 3σ_twin of b̃ − ã
        return audit(
            run, before, after, lambda m: statistic(m) > reference + cut, runs, grant.delta
        )

    return once(1.0), once(twin), grant


def test_published_standardize_histogram_audit_catches_an_eighth_of_the_noise(
    gaussian_factor,
) -> None:
    honest, twin, grant = standardize_histogram_audit(gaussian_factor, 0.125, 400)
    assert grant.epsilon == pytest.approx(2.4)
    assert_holds_and_catches(honest, twin, grant)


def refined_mean_audit(
    gaussian_factor, twin: float, runs: int
) -> tuple[AuditResult, AuditResult, ApproxDP]:
    """A wide table's refined centre as published (gauss, centred, private bounds): 199 zero
    rows and one row +L·e₁ against the same with −L·e₁ (n = 200, D = 24, L = 10⁶).

    At ε = 10 the single mean's √D·σ/n is 0.105, so the plan refines the centre. Both inputs
    have the same row norms, so every norm bound has one distribution on both; the far row,
    centred at the coarse c₀ and clipped to the released B₁ (``refined_row_norm``), moves
    the refined sum by ≈ 2B₁·e₁ = Δ·B₁. The released centre is c₁ = c₀/n + clip(±L·e₁ − c₀,
    B₁)/n + noise (the zero rows' −c₀ cancel c₀), so z = c₁₁·n/B₁ = ±1 + c₀₁/B₁ + N(0, σ²)
    with σ the ``refined_mean`` step's for Δ = 2: the event "z > −1 + 3σ_twin" reads that
    step (c₀'s share is ±B₀/(nB₁), small)."""
    config = EstimateConfig(1, epsilon=EPSILON, delta=DELTA, method="gauss")
    run = published(config)
    before = np.zeros((200, 24))
    before[0, 0] = 1e6
    after = before.copy()
    after[0, 0] = -1e6
    grant = charged(run(before, np.random.default_rng(0)), "refined_mean")
    spread = twin * gaussian_sigma(grant, 2.0)

    def event(manifest: dict[str, Any]) -> bool:
        n, bound = manifest["n_rows"], manifest["parameters"]["refined_row_norm"]
        return manifest["release"]["mean"][0] * n / bound > -1.0 + 3.0 * spread

    def once(factor: float) -> AuditResult:
        gaussian_factor(factor)
        return audit(run, before, after, event, runs, grant.delta)

    return once(1.0), once(twin), grant


def test_published_refined_centre_audit_catches_a_16th_of_the_noise(gaussian_factor) -> None:
    honest, twin, grant = refined_mean_audit(gaussian_factor, 1 / 16, 120)
    share = centring.REFINED_MEAN_SHARE * 0.9  # of the rest after the norm bounds' 10%
    assert grant.epsilon == pytest.approx(EPSILON * share)
    assert_holds_and_catches(honest, twin, grant)


@pytest.mark.slow
def test_published_refined_centre_audit_catches_an_eighth_of_the_noise(gaussian_factor) -> None:
    honest, twin, grant = refined_mean_audit(gaussian_factor, 1 / 8, 1000)
    assert_holds_and_catches(honest, twin, grant)
