"""Mechanisms state their own cost and the accountant charges what they state (issue #15):
a mechanism whose noise is smaller than its grant buys is refused before any noise is drawn
(docs/methods.md, "Privacy maps")."""

from __future__ import annotations

import numpy as np
import pytest

from dpsub_dist import PrivateSubspace
from dpsub_dist.privacy import mechanism, noise
from dpsub_dist.privacy.accountant import ZCDP, ApproxDP, BudgetExceeded


def _rows() -> np.ndarray:
    rng = np.random.default_rng(1)
    return rng.normal(size=(4_000, 2)) @ rng.normal(size=(2, 6))


@pytest.mark.parametrize(
    ("kind", "options"),
    [
        ("laplace", {"method": "friendly", "scale": 0.5, "center": False}),  # core_test
        ("gaussian", {"method": "gauss", "row_norm": 50.0, "center": False}),  # gram_noise
    ],
)
def test_an_understated_noise_scale_is_refused_before_any_draw(kind, options, monkeypatch):
    """Halve a mechanism's noise without touching its grant: the accountant, reading the
    cost off that noise, refuses the step (nothing drawn, nothing released)."""
    calibrated = getattr(mechanism, kind)

    def halved(*args, **kwargs):
        mech = calibrated(*args, **kwargs)
        if isinstance(mech, mechanism.Laplace):
            return mechanism.Laplace(mech.sensitivity, mech.scale / 2)
        return mechanism.Gaussian(mech.sensitivity, mech.sigma / 2, mech.epsilon)

    monkeypatch.setattr(mechanism, kind, halved)
    est = PrivateSubspace(2, epsilon=1.0, delta=1e-6, seed=3, **options)
    with noise.draw_log() as draws, pytest.raises(BudgetExceeded, match="its plan grants"):
        est.fit(_rows())
    assert draws == []


@pytest.mark.parametrize("grant", [ApproxDP(0.7, 1e-6), ZCDP(0.3, 1e-7)])
def test_privacy_maps_reproduce_their_calibration(grant) -> None:
    """Each constructor's stated cost is its grant (Gaussian (ε, δ): at most the grant's δ)."""
    eps = grant.epsilon if isinstance(grant, ApproxDP) else float(np.sqrt(2 * grant.rho))
    pure = ApproxDP(eps, 0.0)
    for mech in (mechanism.laplace(grant, 2.0), mechanism.above_threshold(1.0, eps)):
        assert mech.cost().epsilon == pytest.approx(pure.epsilon, rel=1e-12)
        assert mech.cost().delta == 0.0
    gauss = mechanism.gaussian(grant, 3.0).cost()
    if isinstance(grant, ZCDP):
        assert gauss.rho == pytest.approx(grant.rho, rel=1e-12)
    else:
        assert gauss.epsilon == grant.epsilon
        assert 0 < gauss.delta <= grant.delta * (1 + 1e-9)
    tlap = mechanism.truncated_laplace(2.0, eps, 1e-6).cost()
    assert (tlap.epsilon, tlap.delta) == pytest.approx((eps, 1e-6), rel=1e-9)
