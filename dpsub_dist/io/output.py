"""Atomic outputs: build the run folder under a temporary name, manifest last, then rename."""

from __future__ import annotations

import io
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from dpsub_dist.errors import InputError


def check_output_dir(out: str, overwrite: bool) -> None:
    """Refuse an existing output folder (before any work) unless overwriting is asked for."""
    path = Path(out)
    if path.exists() and not overwrite:
        raise InputError(
            f"output folder already exists: {out}: choose a new --out or pass --overwrite"
        )
    if path.exists() and not path.is_dir():
        raise InputError(f"output path is a file, not a folder: {out}: choose another --out")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise InputError(f"parent folder of {out} does not exist: create it first")


def _json_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, default=_jsonable) + "\n").encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to the manifest")


def write_run(
    out: str, basis: np.ndarray | None, manifest: dict[str, Any], overwrite: bool
) -> Path:
    """Write basis.npy (if any) then manifest.json into ``out`` atomically."""
    final = Path(out)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=False)
    try:
        if basis is not None:
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(basis, dtype=np.float64))
            _write_synced(tmp / "basis.npy", buffer.getvalue())
        _write_synced(tmp / "manifest.json", _json_bytes(manifest))
        if final.exists():
            if not overwrite:
                raise InputError(f"output folder appeared while running: {out}: choose a new --out")
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def read_run(out: str) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Read a run folder; only folders with a manifest are trusted."""
    path = Path(out)
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise InputError(f"no manifest.json in {out}: pass the --out folder of a finished run")
    manifest = json.loads(manifest_path.read_text())
    basis_path = path / "basis.npy"
    basis = np.load(basis_path) if basis_path.is_file() else None
    return basis, manifest
