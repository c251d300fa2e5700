"""Local run folders are published atomically (docs/testing.md): seen from outside, a run
folder holds a complete run or nothing, and ``--overwrite`` keeps the previous run intact
and readable until the new one is in place, whatever step of the write fails."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest

from dpsub_dist.cli import main
from dpsub_dist.io import output
from dpsub_dist.io.output import read_run
from dpsub_dist.synth import generate

BUDGET = ["--epsilon", "2", "--delta", "1e-6"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("atomic") / "data"
    generate(out, rows=8_000, dim=6, rank=2, partitions=2, seed=3)
    return out


def _estimate(data: Path, out: Path, scheduler: str, *extra: str) -> int:
    return main(
        ["estimate", str(data), "--rank", "2", *BUDGET, "--method", "gauss", "--row-norm", "10"]
        + ["--out", str(out), "--scheduler", scheduler, "--quiet", *extra]
    )


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


_WRITES: list[str] | None = None


def _record_writes(event: str, args: tuple) -> None:
    if _WRITES is not None and event == "open" and isinstance(args[0], str | Path):
        mode, flags = args[1], args[2]
        if (mode and "w" in mode) or (isinstance(flags, int) and flags & os.O_WRONLY):
            _WRITES.append(Path(args[0]).name)


sys.addaudithook(_record_writes)  # audit hooks cannot be removed: it records only when armed


def test_manifest_is_written_last(data: Path, tmp_path: Path, scheduler_address: str) -> None:
    global _WRITES
    _WRITES = []
    try:
        code = _estimate(data, tmp_path / "out", scheduler_address)
    finally:
        written, _WRITES = _WRITES, None
    assert code == 0
    names = [n for n in written if n in ("basis.npy", "manifest.json")]
    assert names == ["basis.npy", "manifest.json"], written


def _enospc_at(name: str):
    write = output._write_synced

    def full(path: Path, payload: bytes) -> None:
        if path.name == name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        write(path, payload)

    return "_write_synced", full


def _rename_fails_into_place():
    rename = Path.rename

    def refused(self: Path, target):
        if ".tmp-" in self.name and ".tmp-" not in Path(target).name:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(target))
        return rename(self, target)

    return "rename", refused


@pytest.mark.parametrize("failure", ["basis.npy", "manifest.json", "rename into place"])
def test_failed_overwrite_keeps_the_previous_run(
    data: Path, tmp_path: Path, scheduler_address: str, monkeypatch, capsys, failure: str
) -> None:
    out = tmp_path / "out"
    assert _estimate(data, out, scheduler_address) == 0
    before = _snapshot(out)
    previous = read_run(str(out))
    if failure == "rename into place":
        monkeypatch.setattr(Path, *_rename_fails_into_place())
    else:
        monkeypatch.setattr(output, *_enospc_at(failure))
    capsys.readouterr()
    code = _estimate(data, out, scheduler_address, "--overwrite")
    err = capsys.readouterr().err
    assert code == 5, err
    assert "nothing was written or released" in err
    monkeypatch.undo()
    assert _snapshot(out) == before  # the previous run, byte for byte
    basis, manifest = read_run(str(out))
    assert manifest == previous[1] and (basis == previous[0]).all()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary or old folders left
