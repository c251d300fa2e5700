"""A ``dpsub`` executable of this checkout for scheduler tests, and job files for them.

The shipped scheduler examples call ``dpsub`` (``$DPSUB`` or the one on ``PATH``). The tests
put this checkout's first: a script running ``python -m dpsub_dist.cli`` with the test's own
interpreter (the repository's venv, here ``.venv`` as .ci/run creates it) and this
checkout on ``PYTHONPATH``, so it works wherever the suite runs.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dpsub(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """``dpsub ARGS`` as a user runs it: a fresh process of this checkout's CLI under the
    test's interpreter, output captured as text; ``env`` adds to this process's variables."""
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-m", "dpsub_dist.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": python_path, **(env or {})},
    )


def write_dpsub(bin_dir: Path, name: str = "dpsub", log: Path | None = None) -> Path:
    """``bin_dir/name``: this checkout's dpsub; with ``log``, each call appends start/end lines."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    python, root = shlex.quote(sys.executable), shlex.quote(str(ROOT))
    run = f'{python} -m dpsub_dist.cli "$@"'
    if log is not None:
        where = shlex.quote(str(log))
        run = f'echo "start $$" >> {where}\n{run}\ncode=$?\necho "end $$" >> {where}\nexit $code'
    script = bin_dir / name
    script.write_text(f"#!/bin/sh\nexport PYTHONPATH={root}${{PYTHONPATH:+:$PYTHONPATH}}\n{run}\n")
    script.chmod(0o755)
    return script


ABORT_ONCE = '''#!{python}
"""dpsub whose first call is killed (whole process group) once its run is reserved: exit 5."""
import os, signal, sqlite3, subprocess, sys, time
from pathlib import Path

marker = Path({marker!r})
command = [{python!r}, "-m", "dpsub_dist.cli", *sys.argv[1:]]
os.environ["PYTHONPATH"] = {root!r}
if marker.exists():
    os.execv(command[0], command)
marker.touch()
run_id = sys.argv[sys.argv.index("--run-id") + 1]
driver = subprocess.Popen(command, start_new_session=True)
while driver.poll() is None:
    try:
        with sqlite3.connect({ledger!r}, timeout=1) as db:
            sql = "SELECT state FROM dpsub_runs WHERE run_id = ?"
            reserved = db.execute(sql, (run_id,)).fetchall()
    except sqlite3.Error:
        reserved = []
    if reserved:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        print("aborted: the driver was killed after its reservation", file=sys.stderr)
        sys.exit(5)
    time.sleep(0.02)
sys.exit(99)  # finished before it could be aborted: the test reports it
'''


def write_aborting_dpsub(bin_dir: Path, ledger: Path) -> Path:
    """A dpsub whose first run is killed mid-run after reserving (exit 5); later calls are real."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "dpsub-abort-once"
    script.write_text(
        ABORT_ONCE.format(
            python=sys.executable,
            root=str(ROOT),
            ledger=str(ledger),
            marker=str(bin_dir / "aborted-once"),
        )
    )
    script.chmod(0o755)
    return script


def write_job(path: Path, dataset: Path, ledger: Path, results: Path, **fields: str) -> Path:
    """A job file on ``dataset`` (one local worker), one output folder per run under ``results``."""
    values = {
        "name": "events-basis",
        "dataset": str(dataset),
        "rank": "2",
        "budget": "{epsilon: 1.0, delta: 1.0e-6}",
        "output": str(results / "{run_id}"),
        "ledger": str(ledger),
        "workers": "1",
        **fields,
    }
    path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    return path


FAIL_AT_FIRST_RELEASE = """
import sys
from dpsub_dist import cli, context

def planted(self, step, *args, **kwargs):
    raise RuntimeError(f"planted bug at step {step}: row 17 held 3.25")

context.RunContext.release = planted
sys.argv[0] = "dpsub"
sys.exit(cli.main())
"""
"""``python -c`` code: dpsub whose first release (after the rows were read) raises an
unexpected error naming its step and a made-up private value (a bug only some data hits)."""


def failing_dpsub() -> list[str]:
    """The argv prefix of :data:`FAIL_AT_FIRST_RELEASE`, run with this checkout's package."""
    return [sys.executable, "-c", FAIL_AT_FIRST_RELEASE]
