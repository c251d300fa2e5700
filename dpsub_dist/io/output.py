"""Run outputs: ``basis.npy`` then ``manifest.json``, so only finished runs have a manifest.

Readers trust a run folder only if it holds ``manifest.json``; the manifest lists the
size and SHA-256 of every other output (``outputs``), so a basis that does not belong to
its manifest is refused.

- Local folders are written atomically: a hidden temporary sibling folder is filled
  (basis, then manifest, each fsync'ed) and renamed into place. ``--overwrite`` renames the
  previous run aside first and back if the new one cannot be moved in, so a failed write
  leaves it intact; it is deleted only after the new run is in place. Missing parent
  folders (``--out runs/x`` with no ``runs/``) are created at write time, after the run,
  and removed again if the write fails.
- Object storage (``s3://bucket/prefix/`` …) has no rename, but each object PUT is atomic:
  the run prefix must be empty (or ``--overwrite``, which first deletes the old
  ``manifest.json`` and then the rest of the prefix), then the basis is written, then
  the manifest, last.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from dpsub_dist.errors import InputError, RunAborted
from dpsub_dist.io.storage import (
    STORAGE_ERRORS,
    bucket_of,
    filesystem,
    is_local,
    join,
    short_error,
    storage_error,
)

MANIFEST = "manifest.json"
BASIS = "basis.npy"


def _local_path(out: str) -> Path:
    """A local output as a path (``~`` expanded, as job files may write it)."""
    path = Path(filesystem(out)[1]) if str(out).startswith("file:") else Path(out)
    return path.expanduser()


def check_output_dir(
    out: str, overwrite: bool, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Refuse an unusable or existing output (before any work) unless overwriting is asked for."""
    if not is_local(out):
        _check_remote_output(out, overwrite, storage_options)
        return
    path = _local_path(out)
    if path.exists() and not overwrite:
        raise InputError(
            f"output folder already exists: {out}: choose a new --out or pass --overwrite"
        )
    if path.exists() and not path.is_dir():
        raise InputError(f"output path is a file, not a folder: {out}: choose another --out")
    _check_parent_can_hold(path.resolve().parent, out)


def _check_parent_can_hold(parent: Path, out: str) -> None:
    """The output's parent folder exists, or its nearest existing ancestor is a writable
    folder in which :func:`write_run` can create the missing folders."""
    existing = next(p for p in (parent, *parent.parents) if p.exists())
    if not existing.is_dir():
        raise InputError(
            f"{existing} is a file, so the output {out} cannot be created under it: "
            "choose another --out"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(
            f"{existing} is not writable by this user, so the output {out} cannot be "
            "created there: fix its permissions or choose another --out"
        )


def _make_parents(parent: Path) -> list[Path]:
    """Create the missing folders above an output (as ``mkdir -p``); return them, outermost
    first, so that a failed write can remove them again."""
    missing = [p for p in (parent, *parent.parents) if not p.exists()][::-1]
    for folder in missing:
        folder.mkdir(exist_ok=True)
    return missing


def _remote_prefix(out: str, storage_options: Mapping[str, Any] | None) -> tuple[Any, str]:
    fs, path = filesystem(out, storage_options)
    path = path.rstrip("/")
    if "/" not in path:
        raise InputError(
            f"--out {out} is a bucket root: write each run under its own prefix, "
            f"e.g. {join(out, 'runs/run-001')}/"
        )
    return fs, path


def _objects_under(fs: Any, path: str) -> list[str]:
    fs.invalidate_cache()
    return [p for p in fs.find(path + "/") if p.startswith(path + "/")]


def _check_remote_output(
    out: str, overwrite: bool, storage_options: Mapping[str, Any] | None
) -> None:
    fs, path = _remote_prefix(out, storage_options)
    try:
        if _objects_under(fs, path) and not overwrite:
            raise InputError(
                f"output prefix is not empty: {out}: choose a new --out or pass --overwrite"
            )
        probe = f"{path}/.dpsub-write-check-{uuid.uuid4().hex[:8]}"
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except InputError:
        raise
    except FileNotFoundError as err:
        raise InputError(
            f"bucket {bucket_of(fs, path)!r} of --out {out} does not exist ({short_error(err)}): "
            "create it or choose another --out (check the endpoint too)"
        ) from None
    except STORAGE_ERRORS as err:
        raise storage_error(err, out, "checking the output") from None


def _json_bytes(manifest: dict[str, Any]) -> bytes:
    return (json.dumps(manifest, indent=2, sort_keys=True, default=_jsonable) + "\n").encode()


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to the manifest")


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=np.float64))
    return buffer.getvalue()


def _run_files(basis: np.ndarray | None, manifest: dict[str, Any]) -> dict[str, bytes]:
    """The run's files in write order, manifest last, with the outputs' checksums in it."""
    files = {} if basis is None else {BASIS: _npy_bytes(basis)}
    outputs = {
        name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for name, data in files.items()
    }
    files[MANIFEST] = _json_bytes({**manifest, "outputs": outputs})
    return files


def write_run(
    out: str,
    basis: np.ndarray | None,
    manifest: dict[str, Any],
    overwrite: bool,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """Write basis.npy (if any) then manifest.json into ``out``; return where it went."""
    files = _run_files(basis, manifest)
    if not is_local(out):
        return _write_remote(out, files, overwrite, storage_options)
    final = _local_path(out)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    created: list[Path] = []
    try:
        created = _make_parents(final.absolute().parent)
        tmp.mkdir(parents=False)
        for name, data in files.items():
            _write_synced(tmp / name, data)
        _set_public_times(tmp, manifest)
        if final.exists():
            if not overwrite:
                raise InputError(f"output folder appeared while running: {out}: choose a new --out")
            _replace_folder(tmp, final)
        else:
            tmp.rename(final)
    except OSError as err:  # disk full, read-only, permissions: nothing is left behind
        _remove_partial(tmp, created)
        raise RunAborted(
            f"cannot write the run to {out} ({err.strerror or short_error(err)}): nothing was "
            "written or released; free space or fix the folder's permissions, then re-run"
        ) from None
    except BaseException:
        _remove_partial(tmp, created)
        raise
    return str(final)


def _set_public_times(folder: Path, manifest: Mapping[str, Any]) -> None:
    """Date a ledger run's files and folder at its published ``reserved_at``, not at the
    write: with ``reserved_at``, a finish time would publish the run's duration, which
    depends on the data. (A file's ``ctime`` and an object's LastModified cannot be set:
    docs/privacy.md.)"""
    reserved = (manifest.get("ledger") or {}).get("reserved_at")
    if not reserved:
        return
    stamp = datetime.fromisoformat(reserved).timestamp()
    for path in [*folder.iterdir(), folder]:
        os.utime(path, (stamp, stamp))


def _remove_partial(tmp: Path, created: list[Path]) -> None:
    """Remove a failed write's temporary folder and the parent folders it created."""
    shutil.rmtree(tmp, ignore_errors=True)
    for folder in reversed(created):
        try:
            folder.rmdir()
        except OSError:
            break  # not empty: someone else wrote there meanwhile


def _replace_folder(new: Path, final: Path) -> None:
    """Put the finished folder ``new`` in place of the run at ``final`` (``--overwrite``).

    The previous run is renamed aside, never deleted first, and renamed back if the new one
    cannot be moved in: a failure leaves it intact and readable. It is deleted only once
    the new run is in place.
    """
    old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
    final.rename(old)
    try:
        new.rename(final)
    except BaseException:
        old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _write_remote(
    out: str, files: dict[str, bytes], overwrite: bool, storage_options: Mapping[str, Any] | None
) -> str:
    fs, path = _remote_prefix(out, storage_options)
    written: list[str] = []
    try:
        existing = _objects_under(fs, path)
        if existing and not overwrite:
            raise InputError(f"output prefix filled while running: {out}: choose a new --out")
        manifest = f"{path}/{MANIFEST}"
        if manifest in existing:  # untrust the old run before touching its other files
            fs.rm_file(manifest)
        for old in existing:
            if old != manifest:
                fs.rm_file(old)
        for name, data in files.items():
            fs.pipe_file(f"{path}/{name}", data)
            written.append(f"{path}/{name}")
    except BaseException as err:
        for name in written:
            try:
                fs.rm_file(name)
            except STORAGE_ERRORS:
                pass
        if isinstance(err, STORAGE_ERRORS):
            reason = storage_error(err, out, "writing the run to")
            raise RunAborted(f"{reason}; nothing was written or released, re-run") from None
        raise
    return out


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def read_run(
    out: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[np.ndarray | None, dict[str, Any]]:
    """Read a run (local folder or object-store prefix); only runs with a manifest are trusted."""
    try:
        fs, path = filesystem(out, storage_options)
        path = path.rstrip("/")
        try:
            manifest = json.loads(fs.cat_file(f"{path}/{MANIFEST}"))
        except FileNotFoundError:
            raise InputError(f"no {MANIFEST} in {out}: pass the --out of a finished run") from None
        listed = manifest.get("outputs")
        basis_path = f"{path}/{BASIS}"
        if listed is not None and BASIS not in listed:
            return None, manifest
        try:
            data = fs.cat_file(basis_path)
        except FileNotFoundError:
            if listed is None:
                return None, manifest
            raise InputError(
                f"{join(out, BASIS)} is missing but its manifest lists it: re-run the estimate"
            ) from None
    except InputError:
        raise
    except STORAGE_ERRORS as err:
        raise storage_error(err, out, "reading the run") from None
    if listed is not None and hashlib.sha256(data).hexdigest() != listed[BASIS]["sha256"]:
        raise InputError(
            f"{join(out, BASIS)} does not match the checksum in its manifest (overwritten or "
            "corrupt): re-run the estimate"
        )
    return np.load(io.BytesIO(data)), manifest


def read_npy(uri: str, storage_options: Mapping[str, Any] | None = None) -> np.ndarray:
    """Load a ``.npy`` array from a local path or an object-store URL."""
    try:
        fs, path = filesystem(uri, storage_options)
        return np.load(io.BytesIO(fs.cat_file(path)))
    except FileNotFoundError:
        raise InputError(f"file not found: {uri}: check the path") from None
    except ValueError as err:
        raise InputError(f"{uri} is not a .npy array ({err}): pass the saved basis") from None
    except STORAGE_ERRORS as err:
        raise storage_error(err, uri, "reading") from None
