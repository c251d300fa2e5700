"""Progress that a log can carry (issue 16): plain lines, no carriage returns, bounded."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dpsub_dist.synth import generate

FILES = 48
LINE = re.compile(
    r"^(?P<label>.+): (?P<done>\d+)/(?P<total>\d+) tasks \(\d+%\), elapsed \d+:\d\d:\d\d"
    r"(, ≈[\d,]+ rows/s)?(, ETA \d+:\d\d:\d\d)?$"
)


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """Enough partitions (48 files) that a per-task bar would draw well over a hundred times."""
    out = tmp_path_factory.mktemp("progress") / "data"
    return generate(out, rows=9_600, dim=6, rank=2, partitions=FILES, seed=3).path


def test_progress_in_a_log_is_plain_periodic_lines(many_files, tmp_path, scheduler_address):
    log = tmp_path / "stderr.log"
    argv = ["estimate", str(many_files), "--rank", "2", "--epsilon", "4", "--delta", "1e-6"]
    argv += ["--subsets", "120", "--seed", "1", "--out", str(tmp_path / "out")]
    argv += ["--assign", "contiguous"]  # in place: one task per partition at least
    argv += ["--scheduler", scheduler_address]
    code = "import sys; from dpsub_dist.cli import main; sys.exit(main(sys.argv[1:]))"
    with log.open("w") as stderr:  # not a terminal, as under a scheduler
        proc = subprocess.run([sys.executable, "-c", code, *argv], stderr=stderr, timeout=300)
    text = log.read_text()
    assert proc.returncode in (0, 3), text  # released a basis, or ⊥: both are runs that finished
    text = log.read_text()
    assert "\r" not in text
    lines = [m for line in text.splitlines() if (m := LINE.match(line))]
    assert lines, text
    passes: dict[str, list[re.Match]] = {}
    for number, match in enumerate(lines):  # one pass starts at 0/total (centring adds passes;
        key = match["label"]  # two may share a label, e.g. the raw and the centred rows' norms)
        if int(match["done"]) == 0:
            key = f"{key} #{number}"
            passes[key] = []
        else:
            key = next(k for k in reversed(passes) if k.startswith(match["label"] + " #"))
        passes[key].append(match)
    local = next(ms for label, ms in passes.items() if "subsets in place" in label)
    assert int(local[0]["total"]) >= FILES  # one task per partition, and more
    assert "rows/s" in local[-1][0] and "ETA 0:00:00" in local[-1][0]
    for label, ms in passes.items():
        total = int(ms[0]["total"])
        assert len(ms) <= 12, text  # start, at most one per 10 % (or 10 s), end
        assert int(ms[0]["done"]) == 0 and int(ms[-1]["done"]) == total, label
        assert all(int(m["done"]) < int(n["done"]) for m, n in zip(ms, ms[1:], strict=False))
