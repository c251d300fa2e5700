"""Concurrent attempts at one run id, with failures injected between reserve and publish.

Each test runs on a SQLite file and on a real PostgreSQL server (``ledger`` fixture).
Two attempts run in threads, each with its own ledger connection; the estimator is
replaced by one whose "release" is a function of the run's private noise seed, so a
second release drawn with fresh noise is a different array. Every write of a release is
recorded. The invariant checked: every release ever written is covered by a charge
the ledger still counts, and re-running the run id publishes nothing new.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from pg import postgres_server, postgres_url  # noqa: F401  (fixtures)
from test_ledger import grant, ledger, write_job  # noqa: F401  (fixture and helpers)

from dpsub_dist import jobfile
from dpsub_dist.errors import DpsubError, InputError
from dpsub_dist.io.output import read_run
from dpsub_dist.io.storage import storage_error
from dpsub_dist.job import EstimateResult
from dpsub_dist.jobfile import load_job, run_job
from dpsub_dist.ledger import open_ledger

WAIT_S = 60


class Race:
    """Threads named ``A``/``B`` run one job; the fake estimator calls ``script[name]``."""

    def __init__(self, monkeypatch, job) -> None:
        self.job = job
        self.events = {name: threading.Event() for name in ("A in", "B in", "A out", "B out")}
        self.errors: dict[str, BaseException] = {}
        self.writes: list[np.ndarray] = []
        self.script: dict[str, Callable[[], None]] = {}
        real_write = jobfile.write_run

        def estimate(config, open_dataset, client, progress, noise_seed):
            name = threading.current_thread().name
            self.events.setdefault(f"{name} in", threading.Event()).set()
            self.script.get(name, lambda: None)()
            basis = np.random.default_rng(noise_seed).standard_normal((6, 1))
            return EstimateResult(basis, {"outcome": "ok", "method": "fake"})

        def write(out, basis, manifest, overwrite, *rest):
            self.writes.append(basis)
            return real_write(out, basis, manifest, overwrite, *rest)

        monkeypatch.setattr(jobfile, "run_estimate", estimate)
        monkeypatch.setattr(jobfile, "write_run", write)

    def wait(self, event: str) -> None:
        assert self.events[event].wait(WAIT_S), f"timed out waiting for {event}"

    def start(self, name: str, run_id: str = "day-1") -> threading.Thread:
        def attempt() -> None:
            try:
                run_job(self.job, run_id)
            except BaseException as err:  # noqa: BLE001 - recorded for the test to check
                self.errors[name] = err
            finally:
                self.events[f"{name} out"].set()

        thread = threading.Thread(target=attempt, name=name)
        thread.start()
        return thread


def charged_epsilon(location: str, dataset: Path) -> float:
    with open_ledger(location) as book:
        status = book.status(str(dataset))[0]
    return status.grant.total.epsilon - status.remaining.epsilon


def distinct(arrays: list[np.ndarray]) -> int:
    return len({a.tobytes() for a in arrays})


@pytest.fixture
def race(ledger, tmp_path, small_dataset, monkeypatch):  # noqa: F811
    grant(ledger, small_dataset.path, 3.0)
    path = write_job(tmp_path, small_dataset.path, ledger)
    path.write_text(path.read_text() + "overwrite: true\n")
    return Race(monkeypatch, load_job(path))


def test_refund_of_a_resumed_run_is_refused(race, ledger, small_dataset):  # noqa: F811
    """Finding 9: A fails with bad input after B resumed the run; B publishes.

    Before the fix A returned the whole charge, B's release sat on disk uncharged, and a
    re-run drew fresh noise for a second release on one charge.
    """

    def bad_input_after_b_resumed() -> None:
        race.wait("B in")
        raise InputError("public bad input (injected)")

    race.script["A"] = bad_input_after_b_resumed
    race.script["B"] = lambda: race.wait("A out")
    a = race.start("A")
    race.wait("A in")
    b = race.start("B")
    a.join(WAIT_S), b.join(WAIT_S)
    assert isinstance(race.errors.get("A"), InputError)
    assert "B" not in race.errors, race.errors.get("B")
    rerun = run_job(race.job, "day-1")
    assert rerun.status == "already_published"
    with open_ledger(ledger) as book:
        assert book.lookup(str(small_dataset.path), "day-1").state == "published"
    assert distinct(race.writes) == 1
    assert charged_epsilon(ledger, small_dataset.path) == pytest.approx(1.0)
    assert np.array_equal(read_run(rerun.output)[0], race.writes[0])


def test_overtaken_attempt_writes_nothing(race, ledger, small_dataset):  # noqa: F811
    """A is overtaken between its estimate and its write: only B's release is written."""
    race.script["A"] = lambda: race.wait("B out")
    a = race.start("A")
    race.wait("A in")
    b = race.start("B")
    a.join(WAIT_S), b.join(WAIT_S)
    assert "B" not in race.errors, race.errors.get("B")
    lost = race.errors.get("A")
    assert isinstance(lost, DpsubError) and lost.exit_code == 5, lost
    assert "taken over" in str(lost)
    assert len(race.writes) == 1
    assert charged_epsilon(ledger, small_dataset.path) == pytest.approx(1.0)


def test_storage_failure_is_not_refunded_and_resumes(race, ledger, small_dataset):  # noqa: F811
    """A transient storage error after the reservation keeps the charge; the resume is free."""

    def flaky() -> None:
        raise storage_error(ConnectionError("connection reset (injected)"), "s3://b/x", "reading")

    race.script["A"] = flaky
    a = race.start("A")
    a.join(WAIT_S)
    assert isinstance(race.errors.get("A"), InputError)
    with open_ledger(ledger) as book:
        record = book.lookup(str(small_dataset.path), "day-1")
    assert record.state == "reserved"
    assert charged_epsilon(ledger, small_dataset.path) == pytest.approx(1.0)
    resumed = run_job(race.job, "day-1")
    assert resumed.status == "resumed"
    assert distinct(race.writes) == 1
    assert charged_epsilon(ledger, small_dataset.path) == pytest.approx(1.0)
