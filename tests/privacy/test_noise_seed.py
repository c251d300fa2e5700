"""DP noise never comes from the public seed (docs/testing.md).

The public ``--seed`` fixes the subset assignment and the reference points and is written
to the manifest; if it also seeded the noise, anyone could subtract the noise from a
release. For every case of the noise ledger (every method, as a user runs it): two runs
with the same ``--seed`` publish different bases, and every DP noise generator was built
from OS entropy (``noise_rng(None)``) or a ledger run record's private seed, never from
the public seed. "OS entropy" is planted (a fresh distinct seed per call) so that every
run reaches its release. Some methods publish a basis that is a function of the data alone once
the noise lets it out (GAP-MAX's best span, the histogram's cell centre); their noisy
numbers in the manifest (the noisy gap, the noisy count) must differ instead.
"""

from __future__ import annotations

import importlib
import itertools
import pkgutil
from pathlib import Path

import numpy as np
import pytest
import test_noise_ledger as ledger

import dpsub_dist
from dpsub_dist.privacy import noise

data = ledger.data  # the ledger's datasets (a module fixture)


PLANTED = 2**100
"""First of the distinct private seeds planted as "OS entropy" (so that outcomes are fixed)."""


class SeedRecorder:
    """Records the seed every ``noise_rng`` call got, wherever the package imported it, and
    plants a fresh distinct private seed for every draw of OS entropy."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seeds: list[int | None] = []
        fresh = itertools.count(PLANTED)
        monkeypatch.setattr(noise.secrets, "randbits", lambda bits: next(fresh))
        make_rng = noise.noise_rng

        def recorded(private_seed: int | None = None):
            self.seeds.append(private_seed)
            return make_rng(private_seed)

        for info in pkgutil.walk_packages(dpsub_dist.__path__, "dpsub_dist."):
            module = importlib.import_module(info.name)  # no import binds the wrapper later
            if getattr(module, "noise_rng", None) is make_rng:
                monkeypatch.setattr(module, "noise_rng", recorded)


@pytest.mark.parametrize("name", sorted(ledger.CASES))
def test_same_public_seed_different_noise(
    name: str,
    data: dict[str, Path],
    tmp_path: Path,
    scheduler_address: str,
    monkeypatch,
) -> None:
    case = ledger.CASES[name]
    seeds = SeedRecorder(monkeypatch)
    releases = []
    for attempt in ("first", "second"):
        (tmp_path / attempt).mkdir()
        folder = tmp_path / attempt
        manifest, basis = ledger.run_case(case, data[case.source], folder, scheduler_address)
        assert manifest["outcome"] == "ok", manifest["release"]
        releases.append((basis, manifest["release"]))
    assert seeds.seeds, "no DP noise generator was built"
    for seed in seeds.seeds:  # OS entropy, or the private seed of a ledger run record
        assert seed is None or seed >= PLANTED, seed
    (first, first_numbers), (second, second_numbers) = releases
    same = np.array_equal(first, second) and first_numbers == second_numbers
    assert not same, "the same public seed gave the same release"
