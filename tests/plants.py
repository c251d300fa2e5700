"""Plant realistic privacy bugs one at a time and run only the end-to-end net against each.

Each plant is one textual edit of the package that makes the real privacy loss exceed the
claim (docs/testing.md, "Planted bugs"). For each, this script copies the tracked files to a
scratch folder, applies the edit, runs the net (tests/privacy/test_noise_ledger.py and
tests/privacy/test_privacy_net.py, never the module unit tests) and prints the tests that failed.
A plant that no net test catches is reported as SURVIVED and the exit status is 1.

``MUTATIONS`` are hand mutations of modules mutmut has not covered (each changes a scale, a
sensitivity, δ, a charge, a seed, clipping or grouping), run against the net cases that reach
them and, where the net cannot see one by design, the focused unit test named with it
(docs/testing.md, "Hand mutations").

Usage: .venv/bin/python tests/plants.py [--mutations] [name ...]   (default: every plant)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NET = ["tests/privacy/test_noise_ledger.py", "tests/privacy/test_privacy_net.py"]


@dataclass(frozen=True)
class Plant:
    name: str
    kind: str  # the class of bug (issue 27, "What the suite cannot see"), or "mutation"
    path: str
    old: str
    new: str
    select: str = ""  # a pytest -k expression: the net cases that run the mutated code
    unit: str = ""  # a focused unit test run too, where the net cannot see the mutation


PLANTS = [
    Plant(
        "sulq noise matrix shared across clusters",
        "number/shape of draws",
        "dpsub_dist/privacy/subspace_clustering.py",
        "    return iteration.release_symmetric(rng, grams)",
        "    shared = iteration.release_symmetric(rng, grams[0])\n"
        "    return grams - grams[0] + shared",
    ),
    Plant(
        "tree node above level 0 released un-noised",
        "number/shape of draws",
        "dpsub_dist/privacy/tree_aggregation.py",
        "                self.closed[node] = noised(node, exact)",
        "                self.closed[node] = noised(node, exact) if node[0] == 0 else exact",
    ),
    Plant(
        "power: the first iteration's σ reused for all",
        "number/shape of draws",
        "dpsub_dist/privacy/noisy_power.py",
        "noise.add_gaussian(rng, product, self.sigmas[t - 1], self.sensitivity)",
        "noise.add_gaussian(rng, product, self.sigmas[0], self.sensitivity)",
    ),
    Plant(
        "discrete Gaussian narrowed inside the sampler (σ/2, σ reported)",
        "noise narrowed in a sampler",
        "dpsub_dist/privacy/noise.py",
        "        y = _discrete_laplace(rng, sigma + 1, pending.size)\n"
        "        whole, frac = _acceptance_exponent(y, sigma)",
        "        y = _discrete_laplace(rng, sigma // 2 + 1, pending.size)\n"
        "        whole, frac = _acceptance_exponent(y, sigma // 2)",
    ),
    Plant(
        "GAP-MAX truncated Laplace calibrated at 10× the grant's δ",
        "δ",
        "dpsub_dist/privacy/gap_max.py",
        "    decision = mechanism.truncated_laplace(GAP_SENSITIVITY, epsilon, delta_gap)\n"
        "    snap = ",
        "    decision = mechanism.truncated_laplace(GAP_SENSITIVITY, epsilon, 10 * delta_gap)\n"
        "    snap = ",
    ),
    Plant(
        "boosting groups by row position at user level (a user in two groups)",
        "data side: grouping",
        "dpsub_dist/methods/boost.py",
        "    if user_level:  # keyed apart",
        "    if user_level and units is None:  # keyed apart",
    ),
    Plant(
        "subsets by row position at user level (a user in two subsets)",
        "data side: subsets",
        "dpsub_dist/engine/subsets.py",
        "        if self.user_level:\n            return unit_subsets(",
        "        if self.user_level and units is None:\n            return unit_subsets(",
    ),
    Plant(
        "Gram pass scales rows by 1/bound without clipping them",
        "data side: clipping",
        "dpsub_dist/engine/gram.py",
        "        block = clip_rows(rows[start : start + step], bound, in_place=True)",
        "        block = rows[start : start + step] / bound",
    ),
    Plant(
        "Gram pass skips the per-user scaling",
        "data side: per-user scaling",
        "dpsub_dist/engine/gram.py",
        "    users = None if user_norms is None else user_scale(units, user_norms)\n    dim",
        "    users = None\n    dim",
    ),
    Plant(
        "OS-entropy noise seed drawn once per process and reused by every generator",
        "seed",
        "dpsub_dist/privacy/noise.py",
        "def new_noise_seed() -> int:",
        "@functools.cache\ndef new_noise_seed() -> int:",
    ),
    Plant(
        "explained variance's norm bound drawn but not charged (a step missing from the plan)",
        "plan ≠ steps drawn",
        "dpsub_dist/methods/_centring.py",
        "    return ctx.release(\n        step,\n",
        '    if step == "variance_norm_bound":\n'
        "        mech = norm_bound_mechanism(ctx.grant(step))\n"
        "        return private_norm_bound(counts, n_rows, mech, ctx._rng, quantile).bound\n"
        "    return ctx.release(\n        step,\n",
    ),
    Plant(
        "tree node of the top level released un-noised",
        "number/shape of draws",
        "dpsub_dist/privacy/tree_aggregation.py",
        "                self.closed[node] = noised(node, exact)",
        "                self.closed[node] = noised(node, exact) if node[0] < 2 else exact",
        select="stream",
    ),
    Plant(
        "GAP-MAX's truncated Laplace drawn at the whole step's δ (its part is charged δ_gap)",
        "a part drawn at another calibration than charged",
        "dpsub_dist/privacy/gap_max.py",
        "    noisy = decision.release(rng, statistic)\n",
        "    whole = steps.cost().delta  # the step's δ: it still fits, the snap's share is spent\n"
        "    noisy = mechanism.truncated_laplace(decision.sensitivity, "
        "decision.sensitivity / decision.scale, whole).release(rng, statistic)\n",
        select="exact",
        unit="tests/privacy/test_release_guard.py",
    ),
]


MUTATIONS = [
    Plant(
        "noise: Gaussian grid widening dropped",
        "mutation",
        "dpsub_dist/privacy/noise.py",
        "    widened = Fraction(sigma) * (delta + step * _ceil_sqrt(changed)) / delta",
        "    widened = Fraction(sigma)",
        "gauss or sulq",
    ),
    Plant(
        "noise: Laplace parameter rounded down",
        "mutation",
        "dpsub_dist/privacy/noise.py",
        "    return g, math.ceil(Fraction(scale) * (delta + step * changed) / (delta * step))",
        "    return g, math.floor(Fraction(scale) * (delta + step * changed) / (delta * step))",
        "histogram",
    ),
    Plant(
        "noise: grid twice as coarse",
        "mutation",
        "dpsub_dist/privacy/noise.py",
        "    return math.ldexp(1.0, exponent - 1 - GRID_BITS)",
        "    return math.ldexp(1.0, exponent - GRID_BITS)",
        "gauss",
    ),
    Plant(
        "covariance: the mean scaled by unit/n for its value, unit²/n for its σ",
        "mutation",
        "dpsub_dist/privacy/covariance_noise.py",
        "        mech, sensitivity=mech.sensitivity * factor, sigma=mech.sigma * factor\n    )\n"
        "    return MeanRelease(",
        "        mech, sensitivity=mech.sensitivity * factor, sigma=mech.sigma * factor / unit\n"
        "    )\n    return MeanRelease(",
        "gauss",
    ),
    Plant(
        "variance: sums scaled by C/n instead of C²/n",
        "mutation",
        "dpsub_dist/privacy/variance.py",
        "    factor = bound**2 / n_rows",
        "    factor = bound / n_rows",
        "friendly",
    ),
    Plant(
        "norm_bound: user count's share of ε 0.5 → 0.75",
        "mutation",
        "dpsub_dist/privacy/norm_bound.py",
        "USER_COUNT_SHARE = 0.5",
        "USER_COUNT_SHARE = 0.75",
        "test_user_level",
    ),
    Plant(
        "clustering: SuLQ Gram sensitivity 2 → 1",
        "mutation",
        "dpsub_dist/privacy/subspace_clustering.py",
        "GRAM_SENSITIVITY = 2.0",
        "GRAM_SENSITIVITY = 1.0",
        "sulq",
    ),
    Plant(
        "tree: node sensitivity √2 → 1",
        "mutation",
        "dpsub_dist/privacy/tree_aggregation.py",
        "REPLACE_ONE_SENSITIVITY = math.sqrt(2.0)",
        "REPLACE_ONE_SENSITIVITY = 1.0",
        "stream",
    ),
    Plant(
        "gap_max: gap sensitivity 2 → 1",
        "mutation",
        "dpsub_dist/privacy/gap_max.py",
        "GAP_SENSITIVITY = 2.0",
        "GAP_SENSITIVITY = 1.0",
        "exact",
    ),
    Plant(
        "boost: each step charged at its smallest cost over the groups",
        "mutation",
        "dpsub_dist/privacy/mechanism.py",
        "                max(c.epsilon for c in costs),",
        "                min(c.epsilon for c in costs),",
        "boost",
        "tests/methods/test_boost.py::test_parallel_composition_covers_every_group_s_total",
    ),
    Plant(
        "gram: rows clipped at the larger of norm and bound swapped for the smaller",
        "mutation",
        "dpsub_dist/engine/gram.py",
        "    scale = (1.0 / np.maximum(row_norms(rows), bound))[:, None]",
        "    scale = (1.0 / np.minimum(row_norms(rows), bound))[:, None]",
        "gauss or power",
    ),
    Plant(
        "power: replace-one product sensitivity √2 → add/remove's 1",
        "mutation",
        "dpsub_dist/privacy/noisy_power.py",
        "    return SENSITIVITY[relation].gram",
        '    return SENSITIVITY["add_remove"].gram',
        "power",
    ),
    Plant(
        "power: iteration shares normalised without the first (Σ ρ_t > ρ)",
        "mutation",
        "dpsub_dist/privacy/noisy_power.py",
        "    total = math.fsum(weights)\n",
        "    total = math.fsum(weights[1:])\n",
        "power",
    ),
    Plant(
        "power: iteration t drawn at the σ of iteration T + 1 − t",
        "mutation",
        "dpsub_dist/privacy/noisy_power.py",
        "noise.add_gaussian(rng, product, self.sigmas[t - 1], self.sensitivity)",
        "noise.add_gaussian(rng, product, self.sigmas[-t], self.sensitivity)",
        "power",
        "tests/methods/test_power.py::test_each_iteration_draws_sigma_t_for_its_share_of_rho",
    ),
    Plant(
        "power: the next iterate orthonormalised from the exact product, not the release",
        "mutation",
        "dpsub_dist/privacy/noisy_power.py",
        "            basis = orthonormalise(released)",
        "            basis = orthonormalise(product)",
        "power",
        "tests/methods/test_power.py::test_each_iterate_is_the_orthonormalised_release_not_the_exact_product",
    ),
    Plant(
        "power: the iterations' cost stated as zCDP under an (ε, δ) grant",
        "mutation",
        "dpsub_dist/privacy/noisy_power.py",
        "    delta = None if isinstance(grant, ZCDP) else grant.delta\n",
        "    delta = None\n",
        "power",
    ),
    Plant(
        "methods/power: user weights divided by √(user total), not the total",
        "mutation",
        "dpsub_dist/methods/power.py",
        "        weights /= user_totals(units, users)",
        "        weights /= np.sqrt(user_totals(units, users))",
        "power",
    ),
    Plant(
        "methods/power: the passes run without per-user scaling",
        "mutation",
        "dpsub_dist/methods/power.py",
        "RowPasses(dataset, loader, row_norm, ctx.executor, ctx.progress, user_level)",
        "RowPasses(dataset, loader, row_norm, ctx.executor, ctx.progress, False)",
        "power",
    ),
    Plant(
        "gram: clip weight 1/max(‖x‖, B) instead of its square",
        "mutation",
        "dpsub_dist/engine/gram.py",
        "    return CLIP_MARGIN / np.maximum(norms, bound) ** 2",
        "    return CLIP_MARGIN / np.maximum(norms, bound)",
        "power",
    ),
    Plant(
        "gram: user totals floored with min(·, 1) instead of max",
        "mutation",
        "dpsub_dist/engine/gram.py",
        "    return np.maximum(user_norms.to_numpy()[index][units.inverse], 1.0)",
        "    return np.minimum(user_norms.to_numpy()[index][units.inverse], 1.0)",
        "test_user_level or test_removing",
    ),
    Plant(
        "gram: user scale 1/total instead of 1/√total",
        "mutation",
        "dpsub_dist/engine/gram.py",
        "    return 1.0 / np.sqrt(user_totals(units, user_norms))",
        "    return 1.0 / user_totals(units, user_norms)",
        "test_user_level or test_removing",
        "tests/privacy/test_user_level_privacy.py::test_user_scale_brings_each_heavy_user_to_unit_total_and_leaves_light_ones",
    ),
    Plant(
        "variance: projected sums scale rows by 1/B without clipping",
        "mutation",
        "dpsub_dist/privacy/variance.py",
        "    scaled = rows * (1.0 / np.maximum(norms, bound))[:, None]",
        "    scaled = rows / bound",
        "friendly",
    ),
    Plant(
        "variance: sum sensitivity √2 → 1",
        "mutation",
        "dpsub_dist/privacy/variance.py",
        "SENSITIVITY = math.sqrt(2.0)",
        "SENSITIVITY = 1.0",
        "friendly",
    ),
    Plant(
        "norm_bound: user-level search at the whole ε (the count's share not taken off)",
        "mutation",
        "dpsub_dist/privacy/norm_bound.py",
        "    search_epsilon = epsilon - count.cost().epsilon",
        "    search_epsilon = epsilon",
        "test_user_level",
    ),
    Plant(
        "norm_bound: user-level threshold from the exact user count, not the noisy ñ",
        "mutation",
        "dpsub_dist/privacy/norm_bound.py",
        "private_norm_bound(counts, users, search, rng, quantile=quantile, grid=grid)",
        "private_norm_bound(\n"
        "        counts, int(counts.sum()), search, rng, quantile=quantile, grid=grid\n    )",
        "test_user_level",
        "tests/privacy/test_norm_bound.py::test_user_level_threshold_is_q_times_the_noisy_count_not_the_exact_one",
    ),
    Plant(
        "sparse_vector: queries compared with the un-noised threshold",
        "mutation",
        "dpsub_dist/privacy/sparse_vector.py",
        ">= noisy_threshold:",
        ">= threshold:",
        "friendly or histogram",
        "tests/privacy/test_mechanisms.py::test_above_threshold_compares_the_noisy_query_with_the_noisy_threshold",
    ),
    Plant(
        "assign: user ids -0.0 and 0.0 not merged (a user in two subsets)",
        "mutation",
        "dpsub_dist/engine/assign.py",
        "        column = pc.add(column.cast(pa.float64()), 0.0)",
        "        column = column.cast(pa.float64())",
        "test_user_level",
        "tests/privacy/test_user_level_privacy.py::test_negative_and_positive_zero_ids_are_one_user",
    ),
    Plant(
        "assign: row subsets ignore the public seed",
        "mutation",
        "dpsub_dist/engine/assign.py",
        "    keyed = positions.astype(np.uint64) ^ _seed_key(seed)",
        "    keyed = positions.astype(np.uint64)",
        "friendly",
        "tests/methods/test_core.py::test_assignment_depends_on_position_not_values",
    ),
    Plant(
        "boost: user groups hashed with the subsets' key (groups and subsets correlated)",
        "mutation",
        "dpsub_dist/methods/boost.py",
        'purpose=b"groups")',
        'purpose=b"subsets")',
        "boost",
        "tests/privacy/test_user_level_privacy.py::test_group_hash_is_keyed_apart_from_the_subsets_even_at_one_seed",
    ),
    Plant(
        "covariance: each centred bound given the whole norm share (shares sum > 1)",
        "mutation",
        "dpsub_dist/methods/gauss.py",
        "    half = (norm_share / 2, 0.0)",
        "    half = (norm_share, 0.0)",
        "private or auto",
        "tests/methods/test_power.py::test_plan_gives_the_private_bound_powers_own_share",
    ),
    Plant(
        "covariance: row-level Gram drawn at add/remove's sensitivity, charged at replace's",
        "mutation",
        "dpsub_dist/methods/gauss.py",
        "lambda mech, rng: analyze_gauss(summary.gram, mech, rng),",
        "lambda mech, rng: analyze_gauss(\n"
        '                summary.gram, mechanism.gaussian(ctx.grant("gram_noise"), 1.0), rng\n'
        "            ),",
        "gauss or auto",
    ),
    Plant(
        "centring: the mean drawn in unit-norm units, not the clip bound's",
        "mutation",
        "dpsub_dist/methods/_centring.py",
        "gaussian_mean(row_sum, n_rows, mech, rng, unit=bound)",
        "gaussian_mean(row_sum, n_rows, mech, rng, unit=1.0)",
        "centred or auto",
    ),
    Plant(
        "sample_aggregate: core noise charged with its own grant as the core test's",
        "mutation",
        "dpsub_dist/methods/_sample_aggregate.py",
        "friendly.core_noise_mechanism(noise_grant, test_grant, radius, core.lower_bound)",
        "friendly.core_noise_mechanism(noise_grant, noise_grant, radius, core.lower_bound)",
        "friendly or sample-aggregate",
    ),
    Plant(
        "online: tree ρ taken as one level's grant times L + 1",
        "mutation",
        "dpsub_dist/methods/stream.py",
        '    tree_rho = grants["batch 1"].rho * levels',
        '    tree_rho = grants["batch 1"].rho * (levels + 1)',
        "stream",
    ),
    Plant(
        "online: tree steps charged a node of the whole stream's ρ, not the tree's share",
        "mutation",
        "dpsub_dist/methods/stream.py",
        "    return node_mechanism(settings.tree_total, settings.horizon)",
        "    return node_mechanism(settings.rho, settings.horizon)",
        "stream",
    ),
    Plant(
        "tree: a batch enters no node of the top level",
        "mutation",
        "dpsub_dist/privacy/tree_aggregation.py",
        "    nodes = [(h, (batch - 1) >> h) for h in range(tree_levels(horizon))]",
        "    nodes = [(h, (batch - 1) >> h) for h in range(tree_levels(horizon) - 1)]",
        "stream",
        "tests/methods/test_stream.py::test_each_batch_enters_at_most_L_nodes_and_prefixes_cover_exactly",
    ),
    Plant(
        "covariance: gap-perturb's projector noise given no δ share under (ε, δ)",
        "mutation",
        "dpsub_dist/methods/gauss.py",
        "Step.PROJECTOR_NOISE: (1.0 - GAP_TEST_SHARE, 0.0 if zcdp else 0.5)",
        "Step.PROJECTOR_NOISE: (1.0 - GAP_TEST_SHARE, 0.0)",
        "gap-perturb",
    ),
]


def _scratch_copy(target: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        source = REPO / name.decode()
        if source.is_file():
            (target / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name.decode())


def run_plant(plant: Plant, scratch: Path) -> list[str]:
    """Apply ``plant`` in a fresh copy, run the net; the net tests that failed, and why."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    _scratch_copy(scratch)
    path = scratch / plant.path
    text = path.read_text()
    assert text.count(plant.old) == 1, f"{plant.name}: the text to replace is not unique"
    path.write_text(text.replace(plant.old, plant.new))
    python = REPO / ".venv" / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(scratch), "COLUMNS": "400"}  # workers import it too
    check = f"import dpsub_dist; assert dpsub_dist.__file__.startswith({str(scratch)!r})"
    subprocess.run([python, "-c", check], cwd=scratch, env=env, check=True)
    pytest = [python, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    runs = [[*NET, *(["-k", plant.select] if plant.select else [])]]
    runs += [[plant.unit]] if plant.unit else []
    out = "".join(
        subprocess.run(pytest + args, cwd=scratch, env=env, capture_output=True, text=True).stdout
        for args in runs
    )
    failed = r"^FAILED (\S+?::\w+(?:\[[^\]]*\])?)(?: - (.{0,120}))?"
    return [f"{test}: {why}" for test, why in re.findall(failed, out, flags=re.M)]


def main(names: list[str]) -> int:
    pool = MUTATIONS if "--mutations" in names else PLANTS
    names = [n for n in names if n != "--mutations"]
    chosen = [p for p in pool if not names or p.name in names]
    survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        for plant in chosen:
            caught = run_plant(plant, Path(tmp) / "tree")
            survived += not caught
            print(f"## {plant.name} [{plant.kind}]: {'caught by' if caught else 'SURVIVED'}")
            for test in caught:
                print(f"   {test}")
            sys.stdout.flush()
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
