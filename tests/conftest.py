"""Shared fixtures: one real multi-process Dask cluster and small synthetic datasets."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DASK_DISTRIBUTED__WORKER__DAEMON", "False")


@pytest.fixture(scope="session", autouse=True)
def diagnostics_folder(tmp_path_factory):
    """Runs keep their operator-only timings here, not in the tester's ~/.dpsub/diagnostics."""
    os.environ.setdefault("DPSUB_DIAGNOSTICS_DIR", str(tmp_path_factory.mktemp("diagnostics")))


@pytest.fixture(scope="session")
def dask_cluster():
    """A LocalCluster with 2 worker *processes* on 127.0.0.1, shared by the session."""
    from distributed import LocalCluster

    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        memory_limit="4GiB",
    )
    yield cluster
    cluster.close()


@pytest.fixture(autouse=True)
def no_stale_distributed_scheduler():
    """After each test, no global ``scheduler: dask.distributed`` without a live client.

    A distributed Client sets that config key while it is open and restores the previous value
    when it closes; two clients that close out of order (a test's client and one a CLI run
    opened in the same process) restore it to ``dask.distributed`` with no client left, and
    every later plain ``dask.compute`` in the session fails ("no Client active"). The library
    never relies on the key (its in-process computes name their scheduler)."""
    yield
    import dask
    from distributed import default_client

    if dask.config.get("scheduler", None) == "dask.distributed":
        try:
            default_client()
        except ValueError:
            dask.config.set(scheduler=None)


@pytest.fixture()
def dask_client(dask_cluster):
    """A Client on the shared cluster."""
    from distributed import Client

    with Client(dask_cluster) as client:
        yield client


@pytest.fixture(scope="session")
def scheduler_address(dask_cluster) -> str:
    """tcp:// address of the shared cluster, for ``dpsub ... --scheduler``."""
    return dask_cluster.scheduler_address


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """20,000 × 10 float32 rows near a rank-2 subspace (γ = 0.01), 4 files, truth saved."""
    from dpsub_dist.synth import generate

    out = tmp_path_factory.mktemp("data") / "small"
    return generate(out, rows=20_000, dim=10, rank=2, gamma=0.01, partitions=4, seed=7)


# ----------------------------------------------------------------------------- skip policy

ALLOWED_SKIPS: dict[str, tuple[str, str]] = {
    # test node id: (text its skip reason must contain, why a skip is acceptable there)
    "tests/engine/test_faults.py::test_real_disk_full": (
        "cannot mount a tmpfs here",
        "mounting needs CAP_SYS_ADMIN, which unprivileged CI containers lack; the same ENOSPC "
        "path is exercised without privileges by test_disk_full_while_writing_the_manifest",
    ),
}
"""The only skips a green run may contain. Any other skip fails the session: a test that
silently does not run hides untested code (PostgreSQL, strace, matplotlib are all set up
by .ci/run and the ``dev`` extra, so their tests must run)."""

_UNEXPECTED_SKIPS: list[tuple[str, str]] = []


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def unexpected_skip(nodeid: str, reason: str) -> bool:
    """Whether a skip of ``nodeid`` with ``reason`` is outside ALLOWED_SKIPS."""
    allowed = ALLOWED_SKIPS.get(nodeid.split("[")[0])
    return allowed is None or allowed[0] not in reason


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Remember every skip (in setup or call) that the allow-list does not cover."""
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = _skip_reason(report)
        if unexpected_skip(report.nodeid, reason):
            _UNEXPECTED_SKIPS.append((report.nodeid, reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a run that skipped a test for a reason not in ALLOWED_SKIPS."""
    if _UNEXPECTED_SKIPS and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if _UNEXPECTED_SKIPS:
        terminalreporter.section("skips not in tests/conftest.py ALLOWED_SKIPS (session fails)")
        for nodeid, reason in _UNEXPECTED_SKIPS:
            terminalreporter.write_line(f"{nodeid}: {reason}")
