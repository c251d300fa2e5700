"""Progress that a log can carry (issue 16): plain lines, no carriage returns, bounded."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dpsub_dist.engine.progress import closing_line
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


@pytest.fixture(scope="module")
def estimate_log(many_files, tmp_path_factory, scheduler_address) -> str:
    """stderr of one ``dpsub estimate`` written to a file, as under a scheduler."""
    tmp_path = tmp_path_factory.mktemp("estimate-log")
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
    return text


def test_progress_in_a_log_is_plain_periodic_lines(estimate_log):
    text = estimate_log
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


def test_each_pass_is_numbered_with_its_rows_per_second_and_the_run_closes(estimate_log):
    """Issue 26: ``pass i`` on every pass, rows/s at the end of each, and a closing line
    with the public n and the budget spent, and no run time: like the step timings it
    depends on the data, and the manifest withholds those at both levels."""
    lines = [m for line in estimate_log.splitlines() if (m := LINE.match(line))]
    numbers = [int(re.match(r"pass (\d+): ", m["label"])[1]) for m in lines]
    assert numbers[0] == 1 and all(
        b - a in (0, 1) for a, b in zip(numbers, numbers[1:], strict=False)
    )
    for number in set(numbers):
        last = [m for m, i in zip(lines, numbers, strict=True) if i == number][-1]
        assert int(last["done"]) == int(last["total"]) and "rows/s" in last[0], last[0]
    (closing,) = [line for line in estimate_log.splitlines() if line.startswith("done")]
    spent = r"spent epsilon=[\d.]+, delta=[\d.e-]+"  # all of ε = 4, or less on ⊥
    assert re.fullmatch(rf"done: 9,600 rows, {spent}", closing), closing


def test_closing_line_at_user_level_holds_no_row_count():
    manifest = {
        "n_rows": 7919,
        "privacy": {"unit": "user", "budget": {"spent": {"rho": 0.5, "delta": 1e-6}}},
    }
    assert closing_line(manifest) == "done, spent rho=0.5, delta=1e-06"


def test_first_rate_line_of_synth_counts_from_the_start(tmp_path):
    """The first line's rows/s once divided the first file's rows by the microseconds
    between two calls (≈705,626,667 rows/s): now every rate counts from the start."""
    code = "import sys; from dpsub_dist.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["synth", str(tmp_path / "d"), "--rows", "200000", "--dim", "50", "--rank", "4"]
    argv += ["--partitions", "4"]
    with (tmp_path / "log").open("w") as stderr:
        done = subprocess.run([sys.executable, "-c", code, *argv], stderr=stderr, timeout=300)
    text = (tmp_path / "log").read_text()
    assert done.returncode == 0, text
    rates = [int(r.replace(",", "")) for r in re.findall(r"≈([\d,]+) rows/s", text)]
    assert len(rates) == 4, text
    assert rates[0] <= 5 * rates[-1], text  # the last one is rows / the whole time


def test_a_single_file_of_many_row_groups_moves_in_steps(tmp_path):
    """Issue 38: one file read as one task jumped from 0 % to 100 % per pass. A file of 40 row
    groups is now read by at least PROGRESS_PARTS tasks (a row group never split), so each
    reading pass writes several lines between its start and its end."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dpsub_dist.io.parquet import PROGRESS_PARTS

    rows = np.random.default_rng(4).standard_normal((40_000, 5))
    data = tmp_path / "one.parquet"
    table = pa.table({f"x{j}": rows[:, j] for j in range(5)})
    pq.write_table(table, data, row_group_size=1_000)
    assert pq.ParquetFile(data).num_row_groups == 40
    code = "import sys; from dpsub_dist.cli import main; sys.exit(main(sys.argv[1:]))"
    argv = ["estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
    argv += ["--method", "gauss", "--row-norm", "5", "--out", str(tmp_path / "out")]
    with (tmp_path / "log").open("w") as stderr:  # in process: the table is small
        done = subprocess.run([sys.executable, "-c", code, *argv], stderr=stderr, timeout=300)
    text = (tmp_path / "log").read_text()
    assert done.returncode == 0, text
    lines = [m for line in text.splitlines() if (m := LINE.match(line))]
    totals = [int(m["total"]) for m in lines]
    assert totals and max(totals) >= PROGRESS_PARTS, text
    biggest = [int(m["done"]) for m in lines if int(m["total"]) == max(totals)]
    assert len(set(biggest)) >= 5, text  # 0 %, several steps, 100 %
