"""Private mean of points near a k-dim subspace (T24 §6): via a private basis vs directly.

Data: the ``sphere`` model of ``dpsub_dist.synth`` (``x = U u/‖u‖ + e``, ``e ~ N(0, γ²I)``)
shifted by ``U a`` with ``‖a‖ = --shift`` so the mean is not zero; the target is the
empirical mean of the rows. Rows are clipped to the public bound
``C = ‖a‖ + 1 + 3γ√D``; under replace-one neighbours a clipped mean has L2 sensitivity
``2C/n``. Approaches, all at the same total (ε, δ):

- ``direct``: Gaussian mechanism on the D-dim clipped mean;
- ``via <method>``: half the budget for a private basis B̂ (dpsub ``<method>`` on the
  same rows), half for the Gaussian mechanism on the k-dim clipped mean of ``B̂ᵀx``,
  released as ``B̂ z̄``; on ⊥ it falls back to ``direct`` with the remaining half (⊥ rate
  reported).

Noise comes from ``dpsub_dist.privacy.noise`` and its calibration from the accountant's
``gaussian_sigma``. Example (the published run):
``python -m bench.mean_estimation --rows 20000 --dims 10,100,1000,5000 --seeds 3``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bench import common, peers


def clipped_mean(rows: np.ndarray, bound: float) -> np.ndarray:
    """Mean of the rows after scaling those with norm > bound down to the bound."""
    norms = np.linalg.norm(rows, axis=1)
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    return (rows * scale[:, None]).mean(axis=0)


def gaussian_mean(rows: np.ndarray, bound: float, epsilon: float, delta: float) -> np.ndarray:
    """(ε, δ)-DP mean of rows clipped to ``bound`` (replace-one sensitivity 2·bound/n)."""
    from dpsub_dist.privacy import noise
    from dpsub_dist.privacy.accountant import ApproxDP, gaussian_sigma

    sensitivity = 2 * bound / rows.shape[0]
    sigma = gaussian_sigma(ApproxDP(epsilon, delta), sensitivity)
    return noise.add_gaussian(noise.noise_rng(), clipped_mean(rows, bound), sigma, sensitivity)


def main(argv: list[str] | None = None) -> int:
    parser = common.base_parser("mean_estimation", __doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda v: int(float(v)), default=20_000)
    parser.add_argument("--dims", type=common.int_list, default=[10, 100, 1000, 10_000])
    parser.add_argument("--rank", type=int, default=2)
    parser.add_argument("--gamma-dim", type=float, default=0.1, help="γ = gamma_dim / D")
    parser.add_argument("--shift", type=float, default=0.5, help="‖a‖, the mean's norm")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--methods", type=common.str_list, default=["friendly", "gauss"])
    args = common.parse_args(parser, argv)
    run = common.BenchRun.start("mean_estimation", args)
    methods = common.available_methods(args.methods)
    records: list[dict[str, Any]] = []
    if run.replayed:
        records = run.replayed["records"]
    else:
        half_eps, half_delta = args.epsilon / 2, args.delta / 2
        for d in args.dims:
            gamma = args.gamma_dim / d
            for seed in range(1, args.seeds + 1):
                path, truth = common.dataset(
                    args.data_dir,
                    rows=args.rows,
                    dim=d,
                    rank=args.rank,
                    gamma=gamma,
                    model="sphere",
                    seed=seed,
                )
                shift = np.random.default_rng([seed, 6]).standard_normal(args.rank)
                shift *= args.shift / np.linalg.norm(shift)
                rows = common.load_rows(path)
                rows += truth @ shift
                target = rows.mean(axis=0)
                bound = args.shift + 1 + 3 * gamma * math.sqrt(d)
                base = {"dim": d, "seed": seed, "rows": args.rows, "bound": bound}
                direct = gaussian_mean(rows, bound, args.epsilon, args.delta)
                records.append(
                    {
                        **base,
                        "tool": "direct",
                        "status": "ok",
                        "error": float(np.linalg.norm(direct - target)),
                    }
                )
                for method in methods:
                    fit = common.run_dpsub(
                        method,
                        common.array_opener(rows),
                        rank=args.rank,
                        epsilon=half_eps,
                        delta=half_delta,
                        seed=seed,
                        truth=truth,
                        **peers.method_config(method, bound),
                    )
                    if fit["status"] == "ok":
                        basis = fit["basis"]
                        coords = gaussian_mean(rows @ basis, bound, half_eps, half_delta)
                        estimate = basis @ coords
                    else:  # ⊥ or failure: spend the other half directly
                        estimate = gaussian_mean(rows, bound, half_eps, half_delta)
                    records.append(
                        {
                            **base,
                            "tool": f"via {method}",
                            "status": fit["status"],
                            "basis_error": fit.get("error"),
                            "error": float(np.linalg.norm(estimate - target)),
                        }
                    )
                del rows
                for r in records[-1 - len(methods) :]:
                    common.log(
                        f"D={d} seed={seed} {r['tool']:>14}: {r['status']} error={r['error']:.4g}"
                    )
    table = peers.summarise(records, "dim")
    plots = [] if args.no_plot else plot(run, table, args)
    parameters = {
        "rows": args.rows,
        "dims": args.dims,
        "rank": args.rank,
        "model": "sphere + shift U a",
        "gamma": f"{args.gamma_dim} / D",
        "shift_norm": args.shift,
        "seeds": list(range(1, args.seeds + 1)),
        "methods": methods,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "split": "via: (eps/2, delta/2) basis + (eps/2, delta/2) k-dim mean",
        "clip_bound": "C = shift + 1 + 3 gamma sqrt(D)",
    }
    run.write(parameters, records, table, plots)
    return 0


def plot(run: common.BenchRun, table: list[dict[str, Any]], args: Any) -> list:
    fig, (ax,) = common.figure(
        run,
        f"n={args.rows}, k={args.rank}, sphere model gamma={args.gamma_dim}/D shifted by |a|="
        f"{args.shift}; eps={args.epsilon}, delta={args.delta} total; {args.seeds} seeds",
    )
    for tool in sorted({r["tool"] for r in table}):
        rows = sorted((r for r in table if r["tool"] == tool), key=lambda r: r["dim"])
        med = [r["error"]["median"] for r in rows]
        p90 = [r["error"]["p90"] for r in rows]
        ax.errorbar(
            [r["dim"] for r in rows],
            med,
            yerr=[[0] * len(med), [b - a for a, b in zip(med, p90, strict=True)]],
            fmt="o-",
            capsize=3,
            label=tool,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("D (columns)")
    ax.set_ylabel("||mean_hat - mean||: median, bar to p90")
    ax.set_title("private mean of points near a subspace (T24 §6)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return [common.save(fig, run)]


if __name__ == "__main__":
    raise SystemExit(main())
