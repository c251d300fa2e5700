"""The report's views of issue #38: the run page's loadings of the published basis and its
human type names, the ledger page's drift axis scaled to the drifts and time labels that
tell two runs apart. Pages are read as the browser parses them (tests/browser.py's Dom);
the heat map's colours are checked in headless Chromium."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime

import numpy as np
import pytest
from browser import Dom, colour_pixels, render

from dpsub_dist.report.ledger import angle_axis, time_labels
from dpsub_dist.report.run import LOADING_ROWS, run_page
from dpsub_dist.report.svg import PALETTE, number

ORANGE = tuple(int(PALETTE[1][i : i + 2], 16) for i in (1, 3, 5))


def manifest_of(columns: list[str], rank: int, **more) -> dict:
    return {
        "method": "gauss",
        "input": "/data/t",
        "columns": columns,
        "rank": rank,
        "release": {},
        **more,
    }


def test_the_loadings_view_names_the_columns_that_drive_each_component(tmp_path):
    basis = np.linalg.qr(np.random.default_rng(1).standard_normal((5, 2)))[0]
    basis[:, 1] *= -1  # a negative component: drawn orange
    page = run_page(manifest_of(["age", "income", "x0", "x1", "score"], 2), [], basis=basis)
    dom = Dom(page)
    assert "loadings" in dom.sections
    shown = dom.text_by_id["loadings"]
    for name in ("age", "income", "score", "PC1", "PC2"):
        assert name in shown
    assert all(number(v) in shown for v in basis.ravel())
    assert "all 5 features" in shown and "sign is arbitrary" in shown
    cells = re.findall(r'<rect class="cell"[^>]*fill-opacity="([\d.]+)"', page)
    assert len(cells) == basis.size
    largest = int(np.argmax(np.abs(basis)))
    assert float(cells[largest]) == 1.0  # the deepest colour: the largest |entry|
    (tmp_path / "page.html").write_text(page)
    html, requests = render(tmp_path / "page.html", tmp_path / "page.png", height=1200)
    assert requests == [] and colour_pixels(tmp_path / "page.png", ORANGE) > 200


def test_a_wide_basis_shows_the_features_with_the_largest_entries_by_name():
    """A vector column's features are named ``emb[j]``; of D = 200, the 30 largest rows."""
    rng = np.random.default_rng(2)
    basis = rng.standard_normal((200, 3)) * 0.01
    basis[[7, 150], 0] = [0.9, -0.8]  # two features that drive PC1
    manifest = manifest_of(["emb"], 3, vector_columns={"emb": 200}, dim=200)
    dom = Dom(run_page(manifest, [], basis=basis))
    labels = [t.strip() for t in dom.visible if re.fullmatch(r"\s*emb\[\d+\]\s*", t)]
    assert len(labels) == LOADING_ROWS and labels[:2] == ["emb[7]", "emb[150]"]
    assert (
        f"the {LOADING_ROWS} of 200 features with the largest entries" in dom.text_by_id["loadings"]
    )


def test_no_basis_no_loadings_and_left_out_types_have_human_names():
    left_out = [
        ("city", "dictionary<values=string, indices=int32, ordered=0>", "not numeric"),
        ("emb", "fixed_size_list<item: float>[8]", "not in --columns"),
        ("when", "timestamp[us]", "not numeric"),
    ]
    manifest = manifest_of(["a"], 1, outcome="no_stable_subspace")
    dom = Dom(run_page(manifest, left_out, basis=None))
    assert "this run published no basis" in dom.text_by_id["loadings"]
    types = {row[0]: row[1] for row in dom.cells["left-out"][1:]}
    assert types == {
        "city": "categorical (dictionary of text)",
        "emb": "vector of 8 float32",
        "when": "timestamp (us)",
    }


@pytest.mark.parametrize(
    ("largest", "top"), [(0.7, 1.0), (0.31, 0.5), (3.0, 5.0), (40.0, 50.0), (89.0, 90.0)]
)
def test_the_drift_axis_is_scaled_to_the_largest_drift(largest, top):
    assert angle_axis(largest) == top


def test_time_labels_tell_two_runs_of_one_minute_apart():
    start = datetime(2026, 12, 4, 22, 15, 3, tzinfo=UTC).timestamp()
    assert time_labels(start, start + 3600) == ("2026-12-04 22:15", "2026-12-04 23:15")
    assert time_labels(start, start + 20) == ("2026-12-04 22:15:03", "2026-12-04 22:15:23")


def test_small_drifts_fill_the_chart_and_runs_of_one_minute_have_two_labels(tmp_path, monkeypatch):
    """Bases 0.3–0.7° apart, published seconds apart: the drift line spans the chart's
    height (not a flat line at the bottom of 0–90°), the budget axis's ends differ."""
    from dpsub_dist.ledger import RunRequest, core, open_ledger
    from dpsub_dist.ledger.core import encode_array
    from dpsub_dist.privacy.accountant import ApproxDP
    from dpsub_dist.report.ledger import ledger_page

    ticks = iter(range(0, 60, 3))  # the ledger's clock: 3 s between its stamps, one minute
    monkeypatch.setattr(core, "now_utc", lambda: f"2026-12-04T22:15:{next(ticks):02d}+00:00")

    def turned(degrees: float) -> np.ndarray:
        t = math.radians(degrees)
        return np.array([[1, 0], [0, math.cos(t)], [0, math.sin(t)], [0, 0]], dtype=float)

    manifest = json.dumps({"ledger": {"job": "daily"}})
    with open_ledger(str(tmp_path / "ledger.db"), create=True) as book:
        book.grant("/data/events", "row", ApproxDP(10.0, 1e-5))
        for day, angle in enumerate([0.0, 0.3, 1.0, 1.5]):  # drifts 0.3, 0.7, 0.5
            run_id = f"daily-{day}"
            charge = ApproxDP(1.0, 1e-6)
            request = RunRequest("/data/events", "row", run_id, charge, "j", None, "/o")
            lease = book.reserve(request).lease
            book.begin_publishing("/data/events", run_id, lease)
            book.publish("/data/events", run_id, lease, "ok", manifest, encode_array(turned(angle)))
        page = ledger_page(book)
    drift = page[page.index('<section id="drift"') :]
    dom = Dom(drift)
    assert "1°" in dom.visible and "90°" not in dom.visible
    points = re.search(r'<polyline class="series" points="([^"]+)"', drift)[1]
    ys = [float(pair.split(",")[1]) for pair in points.split()]
    assert max(ys) - min(ys) > 60  # of a 172 px plot: 0.4° of a 1° axis, not of 90°
    budget = Dom(page[: page.index('<section id="outcomes"')])
    ends = [t for t in budget.visible if re.fullmatch(r"\d{4}-\d\d-\d\d [\d:.]+", t)]
    assert len(ends) == 2 and ends[0] != ends[1], ends
