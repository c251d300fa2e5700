"""Rows and loaders shared by the engine's and the methods' tests: a loader that counts its
calls (how many times a run read each partition), awkward rows for the norm grid, and the
relative closeness the Gram passes are held to."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from dpsub_dist.privacy.norm_bound import GRID

GRAM_RTOL = 1e-12
"""Largest entry difference between two ways of computing one Gram, relative to its largest
entry (rows added in another order)."""


@dataclasses.dataclass
class CountingLoader:
    """The dataset's loader, counting its calls (in process: threads share the count)."""

    inner: Any
    calls: list[int] = dataclasses.field(default_factory=lambda: [0])
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def __call__(self, part: Any) -> tuple[np.ndarray, Any]:
        with self.lock:
            self.calls[0] += 1
        return self.inner(part)


def heavy_rows(n: int = 3000, dim: int = 5) -> np.ndarray:
    """Norms spread over many bins, a zero row, a row past the grid's top (overflow bin), and
    rows exactly on bin edges (grid values, odd and even exponents)."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((n, dim)) * np.exp(3 * rng.standard_normal((n, 1)))
    rows[0], rows[1] = 0.0, 2.0**45
    for i, j in enumerate((20, 21, 27, 33), start=2):
        rows[i] = 0.0
        rows[i, i % dim] = GRID[j]  # norm exactly the grid value
    rows[6] = np.full(dim, 0.5)
    rows[6, 0] = 0.0
    rows[6] *= GRID[20] / np.linalg.norm(rows[6])
    return rows


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = GRAM_RTOL) -> None:
    """Largest entry difference at most ``rtol`` of ``expected``'s largest entry."""
    scale = max(float(np.abs(expected).max()), np.finfo(float).tiny)
    assert float(np.abs(actual - expected).max()) <= rtol * scale
