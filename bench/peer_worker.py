"""Fit one peer PCA on a .npy matrix and save its top-k basis; runs inside the peer's own venv.

Standalone on purpose (no dpsub_dist import): ``bench/peers.py`` starts it with the
interpreter of ``bench/.venvs/<library>`` under a time and memory limit.

    python bench/peer_worker.py LIBRARY DATA.npy OUT.npy --rank K --epsilon E --norm C
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.metadata import PackageNotFoundError, version

import numpy as np


def clip_rows(rows: np.ndarray, norm: float) -> np.ndarray:
    """Scale rows with ‖x‖ > norm down to norm (the public bound both peers require)."""
    lengths = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, norm / np.maximum(lengths, 1e-300))


def fit(
    library: str,
    rows: np.ndarray,
    rank: int,
    epsilon: float,
    norm: float,
    bounds: tuple[float, float] | None = None,
) -> np.ndarray:
    """The k × D components of the library's PCA (``bounds``: diffprivlib centres privately)."""
    if library == "diffprivlib":
        from diffprivlib.models import PCA

        if bounds is not None:  # public feature bounds: diffprivlib pays for a private mean
            model = PCA(n_components=rank, epsilon=epsilon, data_norm=norm, bounds=bounds)
            return model.fit(rows).components_
        # Zero-mean data by construction: no budget spent on a mean (as dpsub, uncentred).
        model = PCA(n_components=rank, epsilon=epsilon, data_norm=norm, centered=True)
        return model.fit(rows).components_
    if library == "opendp":
        import opendp.prelude as dp

        dp.enable_features("contrib", "honest-but-curious", "idealized-numerics")
        model = dp.sklearn.decomposition.PCA(
            epsilon=epsilon,
            row_norm=norm,
            n_samples=rows.shape[0],
            n_features=rows.shape[1],
            n_components=rank,
        )
        return model.fit(rows).components_
    if library == "sklearn":  # non-private reference
        from sklearn.decomposition import PCA

        model = PCA(n_components=rank, svd_solver="randomized", random_state=0)
        return model.fit(rows).components_
    raise SystemExit(f"unknown library {library!r}")


DISTRIBUTIONS = {
    "diffprivlib": ("diffprivlib", "scikit-learn", "numpy"),
    "opendp": ("opendp", "scikit-learn", "numpy"),
    "sklearn": ("scikit-learn", "numpy"),
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("library", choices=sorted(DISTRIBUTIONS))
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--norm", type=float, required=True)
    parser.add_argument(
        "--bounds", help="LO,HI, or a 2×D .npy of per-feature bounds (diffprivlib centres)"
    )
    args = parser.parse_args()
    started = time.monotonic()
    rows = np.load(args.data).astype(np.float64)
    loaded = time.monotonic()
    if args.bounds and args.bounds.endswith(".npy"):  # per-feature (lower, upper) rows, 2 × D
        bounds = tuple(np.load(args.bounds))
        clipped = rows  # diffprivlib clips the rows it centres at --norm itself
    else:
        bounds = tuple(float(v) for v in args.bounds.split(",")) if args.bounds else None
        clipped = clip_rows(rows, args.norm)
    del rows
    components = fit(args.library, clipped, args.rank, args.epsilon, args.norm, bounds)
    fitted = time.monotonic()
    np.save(args.out, np.asarray(components, dtype=np.float64).T)
    found = {}
    for name in DISTRIBUTIONS[args.library]:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "missing"
    report = {"load_s": loaded - started, "fit_s": fitted - loaded, "versions": found}
    print("PEER_REPORT " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
