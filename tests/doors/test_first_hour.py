"""The first hour, where a newcomer meets it (issue 26): the commands in a real terminal.

CI has no terminal, so a module imported only on one (``rich``, for the progress bar) was
never imported by the suite and ``dpsub demo`` died in every terminal. Here the installed
``dpsub`` runs on a pseudo-terminal (Python's :mod:`pty`): exit 0, no traceback. The slow
test takes the README's two set-up commands as written and runs them on a fresh clone.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

DPSUB = Path(sys.executable).with_name("dpsub")  # the venv's console script, as installed
ROOT = Path(__file__).resolve().parents[2]
CRASH = ("Traceback", "ModuleNotFoundError", "Error:")


def in_terminal(argv: list[str], cwd: Path, timeout: float = 600, env=None) -> tuple[int, str]:
    """Exit code and all output of ``argv`` run with stdin, stdout and stderr on a pty."""
    leader, follower = pty.openpty()
    environ = {**os.environ, "TERM": "xterm-256color", **(env or {})}
    proc = subprocess.Popen(
        argv, stdin=follower, stdout=follower, stderr=follower, cwd=cwd, env=environ
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return code, b"".join(chunks).decode(errors="replace")


def assert_clean(code: int, output: str) -> None:
    assert code == 0, output
    for word in CRASH:
        assert word not in output, output


def test_demo_and_estimate_in_a_terminal(tmp_path: Path) -> None:
    assert DPSUB.is_file(), f"no dpsub console script next to {sys.executable}"
    code, output = in_terminal([str(DPSUB), "demo", "--dir", str(tmp_path / "demo")], tmp_path)
    assert_clean(code, output)
    assert re.search(r"subspace_error=0\.\d+", output), output
    assert "\x1b[" in output, output  # the live bar (rich) drew on the terminal
    data, out = tmp_path / "data", tmp_path / "run"
    synth = ["synth", str(data), "--rows", "20000", "--dim", "8", "--rank", "2"]
    assert_clean(*in_terminal([str(DPSUB), *synth], tmp_path))
    estimate = ["estimate", str(data), "--rank", "2", "--epsilon", "1", "--delta", "1e-6"]
    code, output = in_terminal([str(DPSUB), *estimate, "--out", str(out)], tmp_path)
    assert_clean(code, output)
    assert (out / "basis.npy").is_file() and "\x1b[" in output, output


def readme_commands() -> tuple[str, str]:
    """The README's set-up commands as written: the demo's, then the tests'."""
    text = (ROOT / "README.md").read_text()
    setup = r"(?:bash \.ci/setup\.sh && )?"
    commands = re.findall(rf"^    ({setup}python3 -m venv \.venv && .+)$", text, re.M)
    assert len(commands) == 2 and "dpsub demo" in commands[0], commands
    assert commands[1].endswith("-m pytest"), commands
    return commands[0], commands[1]


@pytest.mark.slow
def test_readme_commands_on_a_fresh_clone(tmp_path: Path) -> None:
    """A clone of HEAD, a fresh venv, the README's commands: the demo on a terminal, then the
    tests, bounded to ``-x -q tests/privacy/test_release_checksums.py`` and with OpenBLAS choosing
    its own kernel (``OPENBLAS_CORETYPE`` unset), as on a newcomer's machine."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    subprocess.run(["git", "checkout", "-q", head], cwd=clone, check=True)
    demo, tests = readme_commands()
    code, output = in_terminal(["bash", "-c", demo], clone, timeout=1500)
    assert_clean(code, output)
    assert re.search(r"subspace_error=0\.\d+", output), output
    environ = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    bounded = f"{tests} -x -q -p no:cacheprovider tests/privacy/test_release_checksums.py"
    done = subprocess.run(
        ["bash", "-c", bounded], cwd=clone, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run runs the README's test command as written (pip quietened), so the command a
    newcomer copies is the one CI proves."""
    _, tests = readme_commands()
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests.replace("pip install -e", "pip install -q -e") in lines
