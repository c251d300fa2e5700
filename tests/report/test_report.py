"""``dpsub report``: the run and ledger pages, opened in headless Chromium (tests/browser.py).

The checks read what the browser rendered (its DOM after parsing, and a screenshot's
pixels): the charts are drawn, the budget numbers are the manifest's and the ledger's,
the page fetches nothing, the operator section appears only when asked for, and every
number on a published page is a released value or a public fact, at user level too.

``DPSUB_REPORT_SCREENSHOTS=docs/img pytest tests/report/test_report.py`` also copies the ledger
page's screenshot to docs/img (report-ledger.png); the run page's comes from the commands in
docs/report.md, whose input path, unlike a test's, reads well in the page's title.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import stat
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import Dom, colour_pixels, host_of, render
from dpsub_shim import dpsub, write_job
from pg import postgres_server, postgres_url  # noqa: F401  (fixtures)

from dpsub_dist.cli import main
from dpsub_dist.errors import DataError, InputError
from dpsub_dist.ledger import open_ledger
from dpsub_dist.report.run import BUDGET_KEYS
from dpsub_dist.report.svg import FLAG, PALETTE, number

BAR = tuple(int(PALETTE[0][i : i + 2], 16) for i in (1, 3, 5))
RED = tuple(int(FLAG[i : i + 2], 16) for i in (1, 3, 5))
NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def keep_screenshot(png: Path, name: str) -> None:
    """Copy a screenshot to $DPSUB_REPORT_SCREENSHOTS (docs/img), less its blank bottom."""
    folder = os.environ.get("DPSUB_REPORT_SCREENSHOTS")
    if folder:
        from PIL import Image, ImageOps

        with Image.open(png) as image:
            box = ImageOps.invert(image.convert("RGB")).getbbox()
            image.crop((0, 0, image.width, min(image.height, box[3] + 24))).save(
                Path(folder) / name
            )


@pytest.fixture(scope="module")
def row_run(small_dataset, scheduler_address, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("row") / "run"
    args = ["estimate", str(small_dataset.path), "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
    assert main([*args, "--out", str(out), "--scheduler", scheduler_address, "--quiet"]) == 0
    return out


USERS = 700


@pytest.fixture(scope="module")
def user_run(scheduler_address, tmp_path_factory) -> tuple[Path, int]:
    """A user-level run on 5,000 rows of 700 users, with a string column left out."""
    folder = tmp_path_factory.mktemp("user")
    rng = np.random.default_rng(3)
    n = 5_000
    basis = np.linalg.qr(rng.standard_normal((8, 2)))[0]
    rows = rng.standard_normal((n, 2)) @ basis.T + 0.01 * rng.standard_normal((n, 8))
    frame = pd.DataFrame(rows, columns=[f"f{i}" for i in range(8)])
    frame["user_id"] = rng.integers(0, USERS, n)
    frame["comment"] = "free text"
    frame.to_parquet(folder / "events.parquet")
    out = folder / "run"
    args = ["estimate", str(folder / "events.parquet"), "--rank", "2", "--rho", "0.5"]
    args += ["--delta", "1e-6", "--unit-column", "user_id", "--out", str(out)]
    assert main([*args, "--scheduler", scheduler_address, "--quiet"]) == 0
    return out, n


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """Render a page once per module: ``shown(page) -> (Dom, requests, screenshot)``."""
    folder, seen = tmp_path_factory.mktemp("shots"), {}

    def show(page: Path, height: int = 2400) -> tuple[Dom, list[str], Path]:
        if page not in seen:
            png = folder / f"{len(seen)}.png"
            html, requests = render(page, png, height=height)
            seen[page] = (Dom(html), requests, png)
        return seen[page]

    return show


@functools.cache
def report_of(run: Path) -> tuple[Path, dict]:
    """``dpsub report RUN`` (once per run) and the run's manifest."""
    done = dpsub("report", str(run))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {run}/report.html"
    return run / "report.html", json.loads((run / "manifest.json").read_text())


def assert_self_contained(dom: Dom, requests: list[str]) -> None:
    assert requests == [], f"the page fetched {requests}"
    csp = [v for k, v in dom.attributes if k == "content" and "default-src" in v]
    assert csp == ["default-src 'none'; style-src 'unsafe-inline'"]
    linked = [v for k, v in dom.attributes if k in ("src", "href") and v]
    assert linked == [], f"the page links {linked}"


def test_the_network_probe_sees_a_page_that_fetches(tmp_path):
    """The control for the no-fetch checks: a page with remote images is caught."""
    page = tmp_path / "fetches.html"
    page.write_text(
        '<img src="http://example.com/a.png"><img src="https://example.org/b.png">'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
    )
    _, requests = render(page, tmp_path / "fetches.png", height=300)
    hosts = {host_of(r) for r in requests}
    assert hosts == {"example.com", "example.org", "fonts.googleapis.com"}, requests


def test_run_page_renders_budget_scree_and_fetches_nothing(row_run, shown):
    page, manifest = report_of(row_run)
    dom, requests, png = shown(page)
    assert_self_contained(dom, requests)
    assert dom.sections == ["route", "budget", "scree", "loadings", "columns", "versions"]
    assert "costs no privacy budget" in dom.text_by_id["free"]
    assert dom.text_by_id["outcome"] == "published a basis"

    steps = manifest["privacy"]["budget"]["steps"]
    header, *rows = dom.cells["budget-table"]
    assert header == ["step", "ε", "δ"]
    expected = [[s["step"], number(s["epsilon"]), number(s["delta"])] for s in steps]
    spent, granted = (
        manifest["privacy"]["budget"]["spent"],
        manifest["privacy"]["budget"]["total_granted"],
    )
    expected += [
        ["spent", number(spent["epsilon"]), number(spent["delta"])],
        ["granted", number(granted["epsilon"]), number(granted["delta"])],
    ]
    assert rows == expected

    ratios = manifest["release"]["explained_variance_ratio"]
    scree = dom.text_by_id["scree"]
    assert all(number(r) in scree for r in ratios)
    charts = [k for k in ("ε", "δ") if any(s[{"ε": "epsilon", "δ": "delta"}[k]] for s in steps)]
    assert dom.svg_shapes["rect"] >= len(steps) * len(charts) + len(ratios)
    assert colour_pixels(png, BAR) > 20_000, "the bars are not drawn"
    assert colour_pixels(png, RED) > 100, "the noise line is not drawn"
    assert manifest["versions"]["dpsub_dist"] in dom.text_by_id["versions"]


def test_user_level_page_shows_no_row_count(user_run, shown):
    run, n = user_run
    page, manifest = report_of(run)
    dom, requests, png = shown(page)
    assert_self_contained(dom, requests)
    text = " ".join(dom.visible)
    shown = set(NUMBER.findall(text))
    assert not {str(n), str(USERS), number(n)} & shown, "a private count is on the page"
    assert "not released: row counts are private at user level" in dom.text_by_id["route"]
    assert "no noise line" in dom.text_by_id["scree"]
    assert colour_pixels(png, RED) == 0, "a noise line needs n, private at user level"
    assert colour_pixels(png, BAR) > 10_000
    header, *rows = dom.cells["budget-table"]
    assert header == ["step", "ρ", "δ₀"]
    steps = manifest["privacy"]["budget"]["steps"]
    assert [r[:2] for r in rows[: len(steps)]] == [[s["step"], number(s["rho"])] for s in steps]
    left_out = {r[0]: r[2] for r in dom.cells["left-out"][1:]}
    assert left_out == {
        "user_id": "the user id: the privacy unit, never a feature",
        "comment": "not numeric",
    }


def published_numbers(value, found: set[str]) -> set[str]:
    """Every number a manifest holds, as the page would write it, and inside its texts."""
    if isinstance(value, bool) or value is None:
        return found
    if isinstance(value, int | float):
        found |= {number(value), str(value)}
    elif isinstance(value, str):
        found |= set(NUMBER.findall(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            published_numbers(key, found)
            published_numbers(item, found)
    elif isinstance(value, list):
        for item in value:
            published_numbers(item, found)
    return found


def gram_noise_level(manifest: dict) -> str:
    """2σ√D / trace (the trace from the released ev₁, ratio₁, n and B), as the page shows it."""
    release = manifest["release"]
    trace = manifest["n_rows"] * release["explained_variance"][0]
    trace /= manifest["parameters"]["row_norm"] ** 2 * release["explained_variance_ratio"][0]
    return number(2 * release["gram_noise_sigma"] * math.sqrt(manifest["dim"]) / trace)


@pytest.mark.parametrize("level", ["row", "user"])
def test_every_number_on_the_page_is_published(level, row_run, user_run, shown):
    """Each number the browser shows is one of the manifest's (a released value or a public
    fact, which the manifest's own tests hold to the privacy contract) or the published
    basis's (the loadings view), the Gram noise
    level computed from them, or the constant 2 of its formula 2σ√D."""
    run = row_run if level == "row" else user_run[0]
    page, manifest = report_of(run)
    numbers = set(NUMBER.findall(" ".join(shown(page)[0].visible)))
    allowed = published_numbers(manifest, set()) | {"2"}
    allowed |= {number(v) for v in np.load(run / "basis.npy").ravel()}  # the loadings view
    if level == "row":
        allowed.add(gram_noise_level(manifest))
    assert numbers - allowed == set()
    # The page does show numbers: at least those of the public plan, which no draw moves (a
    # count of distinct numbers would not do: released values can coincide).
    budget = manifest["privacy"]["budget"]
    planned = {number(s[k]) for s in budget["steps"] for k in BUDGET_KEYS if k in s}
    assert planned and planned | {str(manifest["rank"]), str(manifest["dim"])} <= numbers


def test_operator_section_only_when_asked(row_run, tmp_path):
    page, _ = report_of(row_run)
    published = page.read_bytes()
    diagnostics = tmp_path / "diagnostics"
    done = dpsub(
        "report", str(row_run), "--operator", env={"DPSUB_DIAGNOSTICS_DIR": str(diagnostics)}
    )
    assert done.returncode == 0, done.stderr
    [written] = diagnostics.iterdir()
    assert done.stdout.strip() == f"wrote {written} (operator only: do not publish it)"
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert page.read_bytes() == published, "the published page must not change"
    assert sorted(p.name for p in row_run.iterdir()) == [
        "basis.npy",
        "manifest.json",
        "report.html",
    ]
    html, requests = render(written, tmp_path / "operator.png", height=600)
    dom = Dom(html)
    assert requests == []
    assert dom.sections[-1] == "operator"
    assert "OPERATOR ONLY" in dom.text_by_id["operator"]
    assert "No timings were kept for this release" in dom.text_by_id["operator"]
    assert "operator" not in Dom(published.decode()).sections


@pytest.fixture(scope="module")
def timed_run(small_dataset, scheduler_address, tmp_path_factory) -> tuple[Path, dict, Path]:
    """``dpsub estimate`` in a subprocess with its own diagnostics folder: the run, its
    environment and the one file it kept there."""
    folder = tmp_path_factory.mktemp("timed")
    env = {"DPSUB_DIAGNOSTICS_DIR": str(folder / "diagnostics")}
    out = folder / "run"
    done = dpsub(
        "estimate", str(small_dataset.path), "--rank", "2", "--epsilon", "1", "--delta", "1e-6",
        "--out", str(out), "--scheduler", scheduler_address, "--quiet", env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["basis.npy", "manifest.json"]
    kept = list((folder / "diagnostics").iterdir())
    assert len(kept) == 1, f"the run should keep one diagnostics file, kept {kept}"
    return out, env, kept[0]


def test_estimate_keeps_timings_the_operator_page_shows(timed_run, tmp_path):
    run, env, kept = timed_run
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert re.fullmatch(r"run-[0-9a-f]{16}\.json", kept.name), "named by the run's path only"
    timings = json.loads(kept.read_text())["timings"]
    passes = [step for step in timings if step.endswith("_s") and step != "total_s"]
    assert "total_s" in timings and passes
    done = dpsub("report", str(run), "--operator", env=env)
    assert done.returncode == 0, done.stderr
    written = Path(done.stdout.split()[1])
    assert written.parent == kept.parent and stat.S_IMODE(written.stat().st_mode) == 0o600
    assert sorted(p.name for p in run.iterdir()) == ["basis.npy", "manifest.json"]
    dom = Dom(render(written, tmp_path / "operator.png", height=600)[0])
    shown = {row[0]: row[1] for row in dom.cells["timings"][1:] if row}
    assert shown == {step: str(value) for step, value in timings.items()}


def test_published_report_never_shows_kept_timings(timed_run, tmp_path):
    run, env, kept = timed_run
    timings = json.loads(kept.read_text())["timings"]
    before = sorted(kept.parent.iterdir())
    done = dpsub("report", str(run), env=env)
    assert done.returncode == 0, done.stderr
    dom = Dom(render(run / "report.html", tmp_path / "public.png", height=600)[0])
    assert "operator" not in dom.sections
    assert not any(step in " ".join(dom.visible) for step in timings)
    assert sorted(kept.parent.iterdir()) == before, "the published page writes no diagnostics"


def test_timings_of_an_overwritten_release_are_not_shown(timed_run, tmp_path, monkeypatch):
    from dpsub_dist.diagnostics import write_run_diagnostics

    run, env, kept = timed_run
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("basis.npy", "manifest.json"):
        (copy / name).write_bytes((run / name).read_bytes())
    earlier = {**json.loads((run / "manifest.json").read_text()), "seed": 1234}
    monkeypatch.setenv("DPSUB_DIAGNOSTICS_DIR", str(tmp_path / "diag"))
    write_run_diagnostics(str(copy), earlier, {"total_s": 1.0})  # an earlier release's
    done = dpsub("report", str(copy), "--operator")
    assert done.returncode == 0, done.stderr
    page = Dom(Path(done.stdout.split()[1]).read_text())
    assert "No timings were kept for this release" in page.text_by_id["operator"]
    write_run_diagnostics(
        str(copy), json.loads((copy / "manifest.json").read_text()), {"total_s": 1.0}
    )
    page = Dom(Path(dpsub("report", str(copy), "--operator").stdout.split()[1]).read_text())
    assert [row for row in page.cells["timings"][1:] if row] == [["total_s", "1.0"]]


def test_dpsub_run_keeps_timings_for_report_job_operator(
    small_dataset, scheduler_address, tmp_path
):
    book, results, diagnostics = tmp_path / "ledger.db", tmp_path / "results", tmp_path / "diag"
    grant = ["--ledger", str(book), "--dataset", str(small_dataset.path), "--epsilon", "4"]
    assert main(["budget", "init", *grant, "--delta", "1e-5"]) == 0
    job = write_job(tmp_path / "job.yaml", small_dataset.path, book, results, method="gauss")
    env = {"DPSUB_DIAGNOSTICS_DIR": str(diagnostics)}
    ran = dpsub("run", str(job), "--run-id", "day-1", "--scheduler", scheduler_address, env=env)
    assert ran.returncode == 0, ran.stderr
    [kept] = diagnostics.iterdir()
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    timings = json.loads(kept.read_text())["timings"]
    done = dpsub("report", "--job", str(job), "--run-id", "day-1", "--operator", env=env)
    assert done.returncode == 0, done.stderr
    dom = Dom(render(Path(done.stdout.split()[1]), tmp_path / "operator.png", height=600)[0])
    shown = {row[0]: row[1] for row in dom.cells["timings"][1:] if row}
    assert "total_s" in shown and shown == {step: str(value) for step, value in timings.items()}
    assert sorted(p.name for p in (results / "day-1").iterdir()) == ["basis.npy", "manifest.json"]


def test_operator_page_from_python_shows_the_timings(tmp_path):
    from dpsub_dist.engine.sources import array_dataset
    from dpsub_dist.job import EstimateConfig, run_estimate
    from dpsub_dist.report.run import run_page

    rows = np.random.default_rng(0).standard_normal((2000, 6))
    config = EstimateConfig(rank=2, epsilon=1.0, delta=1e-6, method="gauss", row_norm=3.0)
    result = run_estimate(config, lambda client: array_dataset(rows))
    page = tmp_path / "operator.html"
    page.write_text(run_page(result.manifest, operator=True, timings=result.timings))
    operator = Dom(render(page, tmp_path / "o.png", height=400)[0])
    steps = [row[0] for row in operator.cells["timings"][1:] if row and row[0].endswith("_s")]
    assert "total_s" in steps and set(steps) <= set(result.timings)
    public = Dom(run_page(result.manifest, timings=result.timings))  # ignored unless operator
    assert "operator" not in public.sections
    assert not any(key in " ".join(public.visible) for key in result.timings)


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "pass one of RUN_DIR (a run's folder), --job JOB --run-id ID, or --ledger LEDGER"),
        (["RUN", "--ledger", "L"], "(got RUN_DIR and --ledger)"),
        (["--job", "J.yaml"], "--job and --run-id go together"),
        (["--ledger", "L", "--operator"], "--operator applies to a run's page"),
        (["RUN", "--out", "x.html"], "--out goes with --ledger"),
        (["RUN", "--dataset", "/d"], "--dataset goes with --ledger"),
        (["missing-run"], "no manifest.json in missing-run"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", *args]) == 2
    said = capsys.readouterr().err
    assert message in said and len(said.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- ledger page


VISIT_ROWS, VISITORS = 60_013, 30_011  # private at user level; unlike any public number here
USER = ["--unit-column", "user_id"]


class Clock:
    """``now_utc`` for the ledger: one simulated day per run, so the page spans days."""

    def __init__(self) -> None:
        self.day = 0

    def __call__(self) -> str:
        return f"2024-06-{self.day + 1:02d}T02:15:00+00:00"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory, dask_cluster) -> Path:
    """Three datasets: six daily runs of one job on ``events`` (its data replaced before day
    5), a bad-input run (returned), a run on ``sensors`` whose data holds a NaN (failed), and
    a user-level run on ``visits`` (VISIT_ROWS rows of VISITORS users, both private)."""
    from distributed import Client

    from dpsub_dist.jobfile import load_job, run_job
    from dpsub_dist.ledger import core
    from dpsub_dist.synth import generate

    folder = tmp_path_factory.mktemp("ledger")
    book, results = folder / "ledger.db", folder / "results"
    results.mkdir()
    events, sensors = folder / "events", folder / "sensors"
    generate(events, rows=20_000, dim=8, rank=2, partitions=2, seed=1)
    frame = pd.DataFrame(np.random.default_rng(0).standard_normal((500, 4)), columns=list("abcd"))
    frame.loc[7, "b"] = np.nan
    sensors.mkdir()
    frame.to_parquet(sensors / "part-0.parquet")
    visits = folder / "visits"
    visits.mkdir()
    rng = np.random.default_rng(5)
    spread = rng.standard_normal((VISIT_ROWS, 2)) @ np.linalg.qr(rng.standard_normal((6, 2)))[0].T
    rows = spread + 0.01 * rng.standard_normal((VISIT_ROWS, 6))
    frame = pd.DataFrame(rows, columns=[f"v{i}" for i in range(6)])
    frame["user_id"] = np.arange(VISIT_ROWS) % VISITORS
    frame.to_parquet(visits / "part-0.parquet")
    clock = Clock()
    patch = pytest.MonkeyPatch()
    patch.setattr(core, "now_utc", clock)
    for dataset, epsilon, unit in ((events, "8", []), (sensors, "2", []), (visits, "3", USER)):
        grant = ["--ledger", str(book), "--dataset", str(dataset), "--epsilon", epsilon, *unit]
        assert main(["budget", "init", *grant, "--delta", "1e-5"]) == 0
    good = load_job(write_job(folder / "events.yaml", events, book, results, method="gauss"))
    bad = load_job(write_job(folder / "bad.yaml", events, book, results, columns="[x0, nope]"))
    failing = load_job(
        write_job(
            folder / "sensors.yaml",
            sensors,
            book,
            results,
            name="sensors",
            method="gauss",
            parameters="{row_norm: 3.0}",
        )
    )
    by_user = load_job(
        write_job(
            folder / "visits.yaml", visits, book, results, name="visits", unit_column="user_id"
        )
    )
    try:
        with Client(dask_cluster) as client:
            for day in range(6):
                clock.day = day
                if day == 4:  # the data changes: another subspace
                    generate(
                        events, rows=20_000, dim=8, rank=2, partitions=2, seed=99, overwrite=True
                    )
                run_job(good, f"events-basis-2024-06-{day + 1:02d}", client=client)
            clock.day = 6
            with pytest.raises(InputError, match="nope"):
                run_job(bad, "bad-2024-06-07", client=client)
            clock.day = 7
            with pytest.raises(DataError):
                run_job(failing, "sensors-2024-06-08", client=client)
            clock.day = 8
            run_job(by_user, "visits-2024-06-09", client=client)
    finally:
        patch.undo()
    return book


@pytest.fixture(scope="module")
def ledger_report(ledger, tmp_path_factory) -> tuple[Dom, list[str], Path]:
    """``dpsub report --ledger`` rendered in Chromium: (DOM, requests made, screenshot)."""
    folder = tmp_path_factory.mktemp("ledger-report")
    out, png = folder / "ledger.html", folder / "ledger.png"
    done = dpsub("report", "--ledger", str(ledger), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote {out}"
    html, requests = render(out, png, height=1900)
    return Dom(html), requests, png


def ledger_json(ledger: Path, command: str) -> list[dict]:
    """``dpsub budget COMMAND --ledger L --json``, as published."""
    done = dpsub("budget", command, "--ledger", str(ledger), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_ledger_page_matches_the_ledger_and_flags_the_jump(ledger, ledger_report, capsys):
    dom, requests, png = ledger_report
    assert_self_contained(dom, requests)
    assert dom.sections == ["budget", "outcomes", "drift"]
    assert "costs no privacy budget" in dom.text_by_id["free"]

    capsys.readouterr()
    assert main(["budget", "show", "--ledger", str(ledger), "--json"]) == 0
    shown = {row[0]: row for row in dom.cells["budget-table"][1:]}
    for status in json.loads(capsys.readouterr().out):
        row = shown[status["dataset"]]
        granted, remaining = status["granted"], status["remaining"]
        assert row[2] == f"epsilon={granted['epsilon']:.6g}, delta={granted['delta']:.3g}"
        assert row[6] == f"epsilon={remaining['epsilon']:.6g}, delta={remaining['delta']:.3g}"
    events = next(d for d in shown if d.endswith("events"))
    assert shown[events][6].startswith("epsilon=2,")  # 8 granted, six runs of 1

    assert main(["budget", "history", "--ledger", str(ledger), "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    counts = {row[0]: row[1:] for row in dom.cells["outcome-table"][1:]}
    assert counts[events] == ["6", "0", "0", "0", "1"]  # published … returned
    sensors = next(d for d in counts if d.endswith("sensors"))
    assert counts[sensors] == ["0", "0", "1", "0", "0"]
    assert sum(int(c) for row in counts.values() for c in row) == len(history)

    drift = dom.cells["drift-table"][1:]
    assert [(row[1][-5:], row[2][-5:]) for row in drift] == [
        ("06-01", "06-02"), ("06-02", "06-03"), ("06-03", "06-04"), ("06-04", "06-05"),
        ("06-05", "06-06"),
    ]  # fmt: skip
    flagged = [row[4] == "jump" for row in drift]
    assert flagged == [False, False, False, True, False], drift
    angles = [float(row[3]) for row in drift]
    assert angles[3] > 30 and max(angles[:3] + angles[4:]) < 3  # noise alone: about 0.7°

    assert dom.svg_shapes["polyline"] == 4  # a line per dataset, and the job's drift
    assert colour_pixels(png, BAR) > 5_000 and colour_pixels(png, RED) > 30
    assert "2024-06-01 02:15" in dom.text_by_id["budget"]
    keep_screenshot(png, "report-ledger.png")


def test_ledger_page_of_one_dataset(ledger, tmp_path):
    out = tmp_path / "one.html"
    events = str(ledger.parent / "events")
    done = dpsub("report", "--ledger", str(ledger), "--dataset", events, "--out", str(out))
    assert done.returncode == 0, done.stderr
    dom = Dom(out.read_text())  # rendered in the test above; here only what is on it
    assert [row[0] for row in dom.cells["budget-table"][1:]] == [events]
    assert dom.svg_shapes["polyline"] == 2


def drift_angles(history: list[dict]) -> set[str]:
    """The largest principal angle (degrees, as the page writes it) between consecutive
    published bases of each job, recomputed from the released basis.npy files."""
    from scipy.linalg import subspace_angles

    last: dict[str, np.ndarray] = {}
    angles = set()
    for run in history:
        if run["state"] != "published" or run["outcome"] != "ok":
            continue
        output = Path(run["output"])
        job = json.loads((output / "manifest.json").read_text())["ledger"]["job"]
        basis = np.load(output / "basis.npy")
        if job in last and last[job].shape == basis.shape:
            angles.add(number(math.degrees(np.max(subspace_angles(last[job], basis)))))
        last[job] = basis
    return angles


def ledger_numbers(statuses: list[dict], history: list[dict]) -> set[str]:
    """Every number the ledger page may show: budgets as ``budget show`` writes them,
    reservation and grant times to the minute, numbers in dataset names and run ids,
    counts of runs by outcome, drift angles, and the page's constants."""
    from dpsub_dist.ledger.core import budget_from_pair, describe_budget
    from dpsub_dist.report.ledger import JUMP_FACTOR, JUMP_FLOOR_DEG, angle_axis

    def budget(fields: dict) -> list[str]:
        mode = "approx_dp" if "epsilon" in fields else "zcdp"
        return NUMBER.findall(describe_budget(budget_from_pair(mode, *fields.values())))

    def minute(stamp: str) -> list[str]:  # to the second where two labels share a minute
        return NUMBER.findall(datetime.fromisoformat(stamp).astimezone(UTC).strftime("%F %T"))

    allowed = {f"{JUMP_FACTOR:g}", f"{JUMP_FLOOR_DEG:g}", "0", "100"}  # rule, axes
    for status in statuses:
        allowed |= set(NUMBER.findall(status["dataset"])) | set(minute(status["granted_at"]))
        for key in ("granted", "published", "reserved", "failed", "remaining"):
            allowed |= set(budget(status[key]))
    counts: Counter = Counter()
    for run in history:
        allowed |= set(NUMBER.findall(run["run_id"])) | set(minute(run["reserved_at"]))
        allowed |= set(budget(run["charge"]))
        unfinished = run["state"] in ("reserved", "publishing")
        outcome = "unfinished" if unfinished else (run["state"], run["outcome"])
        counts.update([(run["dataset"], outcome), ("all", outcome)])
    allowed |= {str(c) for c in counts.values()}
    angles = drift_angles(history)
    top = angle_axis(max((float(a) for a in angles), default=0.0))  # the drift axis's top
    return allowed | angles | {f"{top:g}"}


def test_every_number_on_the_ledger_page_is_published(ledger, ledger_report):
    """What the browser shows of a ledger (row and user level) is made of the ledger's
    published values and public facts only: no row or user count of the user-level data."""
    dom, _, _ = ledger_report
    statuses, history = ledger_json(ledger, "show"), ledger_json(ledger, "history")
    visits = next(s["dataset"] for s in statuses if s["dataset"].endswith("visits"))
    assert next(s["unit"] for s in statuses if s["dataset"] == visits) == "user:user_id"
    [run] = [r for r in history if r["dataset"] == visits]
    assert run["state"] == "published"
    with open_ledger(str(ledger)) as book:
        stored = json.loads(book.lookup(visits, run["run_id"], with_release=True).manifest)
    assert stored["n_rows"] is None  # the ledger keeps the published manifest: no n

    numbers = set(NUMBER.findall(" ".join(dom.visible)))
    allowed = ledger_numbers(statuses, history)
    assert numbers - allowed == set()
    private = {str(VISIT_ROWS), str(VISITORS), number(VISIT_ROWS), number(VISITORS)}
    assert not private & (allowed | numbers), "a private count is on the page"
    assert len(numbers) > 20  # the page does show numbers


def test_plot_explained_variance_from_the_estimator():
    import matplotlib

    matplotlib.use("Agg")
    from dpsub_dist import PrivateSubspace

    rng = np.random.default_rng(1)
    rows = rng.standard_normal((3000, 2)) @ rng.standard_normal((2, 6))
    est = PrivateSubspace(n_components=2, epsilon=1.0, delta=1e-6, method="gauss").fit(rows)
    ax = est.plot_explained_variance()
    heights = [patch.get_height() for patch in ax.patches]
    assert heights == pytest.approx(est.explained_variance_ratio_.tolist())
    assert len(ax.get_lines()) == 1  # the Gram noise level (row level: published)


@pytest.fixture(params=["sqlite", "postgres"])
def location(request, tmp_path) -> str:
    """A ledger location: a SQLite file path, or a fresh PostgreSQL database URL."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return request.getfixturevalue("postgres_url")


def rotated(degrees: float) -> np.ndarray:
    """A 4×2 orthonormal basis: span(e1, e2) with e2 turned by ``degrees`` towards e3."""
    turn = math.radians(degrees)
    return np.array([[1, 0], [0, math.cos(turn)], [0, math.sin(turn)], [0, 0]], dtype=float)


def test_drift_is_the_largest_principal_angle_and_jumps_are_flagged(location):
    """Published bases at known angles (SQLite and PostgreSQL): drifts 2°, 1°, 3°, then 40°
    (above 5° and twice the median 2°: flagged), then 1°; a ⊥ run in between is skipped."""
    from dpsub_dist.ledger import RunRequest, open_ledger
    from dpsub_dist.ledger.core import encode_array
    from dpsub_dist.privacy.accountant import ApproxDP
    from dpsub_dist.report.ledger import drifts, ledger_page

    angles = [0.0, 2.0, 3.0, 6.0, None, 46.0, 45.0]  # None: published without a basis (⊥)
    manifest = json.dumps({"ledger": {"job": "daily"}})
    with open_ledger(location, create=True) as book:
        book.grant("/data/events", "row", ApproxDP(10.0, 1e-5))
        for day, angle in enumerate(angles):
            run_id = f"daily-{day}"
            charge = ApproxDP(1.0, 1e-6)
            request = RunRequest("/data/events", "row", run_id, charge, "job-a", None, "/out")
            lease = book.reserve(request).lease
            book.begin_publishing("/data/events", run_id, lease)
            outcome, basis = ("ok", encode_array(rotated(angle))) if angle is not None else (
                "no_stable_subspace", None
            )  # fmt: skip
            book.publish("/data/events", run_id, lease, outcome, manifest, basis)
        found = drifts(book, book.history("/data/events"))
        page = Dom(ledger_page(book))
    assert [d.job for d in found] == ["daily"] * 5
    assert [(d.before, d.after) for d in found][3] == ("daily-3", "daily-5")  # ⊥ skipped
    assert [d.degrees for d in found] == pytest.approx([2.0, 1.0, 3.0, 40.0, 1.0], abs=1e-9)
    assert [d.flagged for d in found] == [False, False, False, True, False]
    assert [row[4] for row in page.cells["drift-table"][1:]] == ["", "", "", "jump", ""]
    assert page.cells["outcome-table"][1][1:] == ["6", "1", "0", "0", "0"]
