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

``dpsub transform`` writes its folder by the same rules (:func:`staged_output`): the workers
fill it with Parquet parts, and ``_transform.json``, its manifest, is written last (Parquet
readers skip names that start with ``_``, so the folder reads as one table).

Nothing of the user's is ever replaced (:func:`check_apart`, :func:`check_replaceable`, the
one rule of every command that writes): an output that is, holds or lies inside an input is
refused, and ``--overwrite`` replaces only what the command itself wrote before (a run
folder whose ``manifest.json`` is a dpsub manifest, a ``dpsub synth`` folder, a report
page), never the input or another folder. Both checks run before any work, so a refused
output reserves and charges nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from fsspec.utils import get_protocol

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
REPORT = "report.html"
"""A run's page, written into its folder by ``dpsub report RUN`` and the job runner."""
TRANSFORM_MANIFEST = "_transform.json"
"""The manifest of a ``dpsub transform`` output (its Parquet parts beside it), written last."""


def _local_path(out: str) -> Path:
    """A local output as a path (``~`` expanded, as job files may write it)."""
    path = Path(filesystem(out)[1]) if str(out).startswith("file:") else Path(out)
    return path.expanduser()


def is_run_manifest(data: bytes | None) -> bool:
    """Whether ``data`` is a manifest dpsub wrote, which makes its folder a previous run's
    output: a JSON object with an ``outcome`` and the ``outputs`` :func:`write_run` lists
    (or, in manifests older than that list, the ``dpsub_dist`` version)."""
    try:
        manifest = json.loads(data or b"")
    except ValueError:
        return False
    if not isinstance(manifest, dict) or "outcome" not in manifest:
        return False
    versions = manifest.get("versions")
    listed = isinstance(manifest.get("outputs"), dict)
    return listed or (isinstance(versions, dict) and "dpsub_dist" in versions)


@dataclass(frozen=True)
class Written:
    """What a command writes in every output, by which ``--overwrite`` knows its own."""

    what: str
    """the output, in the refusal: ``dpsub run output``."""
    marker: str
    """the file it always writes, relative to the output (``""``: the output is that file)."""
    recognise: Callable[[bytes | None], bool]
    """whether the marker's bytes (None: missing) are the command's own."""
    writes: Callable[[str], bool] = lambda name: True
    """whether it writes a file of this name at the output's top level."""


RUN_OUTPUT = Written(
    "dpsub run output", MANIFEST, is_run_manifest, {BASIS, MANIFEST, REPORT}.__contains__
)
TRANSFORM_OUTPUT = Written(
    "dpsub transform output",
    TRANSFORM_MANIFEST,
    is_run_manifest,
    lambda name: name == TRANSFORM_MANIFEST or re.fullmatch(r"part-\d+\.parquet", name) is not None,
)


def check_output_dir(
    out: str,
    overwrite: bool,
    storage_options: Mapping[str, Any] | None = None,
    inputs: Iterable[str | None] = (),
    written: Written = RUN_OUTPUT,
) -> None:
    """Refuse an unusable output before any work: one that is, holds or lies inside one of
    ``inputs`` (:func:`check_apart`), an existing one unless ``overwrite``, and one that
    ``overwrite`` may not replace (:func:`check_replaceable`: only a previous ``written``)."""
    if not is_local(out):
        _remote_prefix(out, storage_options)  # a bucket root is refused as such, first
        check_apart(out, inputs)
        _check_remote_output(out, overwrite, storage_options, written)
        return
    check_apart(out, inputs)
    path = _local_path(out)
    if path.exists() and not overwrite:
        raise InputError(
            f"output folder already exists: {out}: choose a new --out or pass --overwrite"
        )
    if path.exists() and not path.is_dir():
        raise InputError(f"output path is a file, not a folder: {out}: choose another --out")
    check_replaceable(out, written)
    _check_parent_can_hold(path.resolve().parent, out)


def check_apart(out: str, inputs: Iterable[str | None]) -> None:
    """Refuse an output that is, holds or lies inside an input (data, ledger, stream file):
    writing there would mix the run into the data, and replacing it would delete the data."""
    where = _place(out)
    for given in inputs:
        if not given:
            continue
        there = _place(str(given))
        if where[0] != there[0]:
            continue
        if where[1] == there[1]:
            relation = "is"
        elif where[1] in there[1].parents:
            relation = "holds"
        elif there[1] in where[1].parents and _listed(where[1], there[1], _glob_tail(given)):
            relation = "lies inside"
        else:
            continue
        raise InputError(
            f"--out {out} {relation} the input {given}: write the output to a folder "
            "outside the input"
        )


def _place(uri: str) -> tuple[str, PurePosixPath]:
    """Where ``uri`` points: its protocol and absolute path (a glob: the folder it lists)."""
    base = _glob_base(str(uri))
    if is_local(uri):
        return "file", PurePosixPath(_local_path(base).resolve())
    return get_protocol(uri), PurePosixPath("/" + base.split("://", 1)[-1].rstrip("/"))


def _glob_base(uri: str) -> str:
    """A path up to the ``/`` before its first glob character (the whole path if none)."""
    cut = min((uri.index(c) for c in "*?[" if c in uri), default=None)
    return uri if cut is None else uri[: uri.rfind("/", 0, cut) + 1] or "."


def _glob_tail(uri: str) -> str | None:
    """A glob's pattern below its base folder; None for a plain path."""
    base = _glob_base(uri)
    return None if base == uri else uri[len(base) if base != "." else 0 :]


def _listed(out: PurePosixPath, base: PurePosixPath, tail: str | None) -> bool:
    """Whether an output below an input's folder is in the input: always for a folder, and
    for a glob when the output or a folder above it (below the base) matches the glob."""
    if tail is None or "**" in tail:
        return True
    parts = out.relative_to(base).parts
    return any(fnmatch("/".join(parts[: i + 1]), tail) for i in range(len(parts)))


def check_replaceable(
    out: str, written: Written, storage_options: Mapping[str, Any] | None = None
) -> None:
    """The rule of every ``--overwrite``: an existing output is replaced only if the command
    wrote it (its ``written.marker`` is recognised, and it holds no other names than the
    command writes) or it is empty (nothing is lost)."""
    if is_local(out):
        path = _local_path(out)
        if not path.exists() or (written.marker and path.is_dir() and not any(path.iterdir())):
            return
        names = {p.name for p in path.iterdir()} if path.is_dir() else set()
        marker = path / written.marker if written.marker else path
        try:
            data = marker.read_bytes() if marker.is_file() else None
        except OSError:
            data = None
    else:
        fs, prefix = _remote_prefix(out, storage_options)
        try:
            objects = _objects_under(fs, prefix)
            marker_key = f"{prefix}/{written.marker}"
            data = fs.cat_file(marker_key) if marker_key in objects else None
        except STORAGE_ERRORS as err:
            raise storage_error(err, out, "checking the output") from None
        if not objects:
            return
        names = {key[len(prefix) + 1 :].split("/")[0] for key in objects}
    if not written.recognise(data):
        raise InputError(
            f"{out} exists and is not a previous {written.what}, the only thing dpsub "
            "replaces: choose another output path, or move it away first"
        )
    others = sorted(n for n in names if not written.writes(n) and not n.startswith(".dpsub-"))
    if others:
        listed = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
        raise InputError(
            f"{out} is a previous {written.what} but also holds files dpsub did not write "
            f"({listed}): move them away first, or choose another output path"
        )


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
    out: str, overwrite: bool, storage_options: Mapping[str, Any] | None, written: Written
) -> None:
    fs, path = _remote_prefix(out, storage_options)
    try:
        if _objects_under(fs, path) and not overwrite:
            raise InputError(
                f"output prefix is not empty: {out}: choose a new --out or pass --overwrite"
            )
        check_replaceable(out, written, storage_options)
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


def json_bytes(manifest: dict[str, Any]) -> bytes:
    """A manifest as dpsub writes it: indented, sorted keys, NumPy values as plain JSON."""
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
    files[MANIFEST] = json_bytes({**manifest, "outputs": outputs})
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
            check_replaceable(out, RUN_OUTPUT)  # it may have changed while the run ran
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
        _make_room(fs, path, out, overwrite, storage_options, RUN_OUTPUT)
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


def _make_room(
    fs: Any,
    path: str,
    out: str,
    overwrite: bool,
    storage_options: Mapping[str, Any] | None,
    written: Written,
) -> None:
    """Empty the prefix ``path`` for a new output, checked again just before: what is there
    may be replaced only with ``overwrite`` and only if it is a previous ``written``."""
    existing = _objects_under(fs, path)
    if existing and not overwrite:
        raise InputError(f"output prefix filled while running: {out}: choose a new --out")
    if existing:
        check_replaceable(out, written, storage_options)
    _clear_prefix(fs, path, existing, written.marker)


def _clear_prefix(fs: Any, path: str, existing: list[str], marker: str) -> None:
    """Delete a previous output's ``existing`` objects under ``path``: its ``marker`` (the
    manifest readers trust it by) first, so that it is never seen half deleted."""
    manifest = f"{path}/{marker}"
    if manifest in existing:  # untrust the old output before touching its other files
        fs.rm_file(manifest)
    for old in existing:
        if old != manifest:
            fs.rm_file(old)


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


@dataclass(frozen=True)
class Staging:
    """An output being filled (:func:`staged_output`): ``uri`` is where its files go (the
    workers' too), ``final`` where it will be read."""

    uri: str
    final: str
    storage_options: Mapping[str, Any] | None = None

    def write(self, name: str, data: bytes) -> None:
        """Write one file of the output from this process (synced where local)."""
        if is_local(self.uri):
            _write_synced(Path(self.uri) / name, data)
            return
        fs, path = filesystem(self.uri, self.storage_options)
        fs.pipe_file(f"{path.rstrip('/')}/{name}", data)

    def sizes(self) -> dict[str, int]:
        """The files written so far, by name, with their sizes in bytes."""
        fs, path = filesystem(self.uri, self.storage_options)
        path = path.rstrip("/")
        fs.invalidate_cache()
        found = fs.find(path + "/", detail=True)
        return {key[len(path) + 1 :]: int(info["size"]) for key, info in found.items()}


@contextmanager
def staged_output(
    out: str,
    overwrite: bool,
    storage_options: Mapping[str, Any] | None,
    written: Written,
) -> Iterator[Staging]:
    """An output filled in the block and moved into place when it ends, as :func:`write_run`
    writes a run; the block writes ``marker`` (the manifest readers trust it by) last.

    Local: a hidden temporary sibling folder (missing parents created), renamed into place at
    the end (``overwrite``: the previous ``written`` output, checked again, renamed aside,
    back if the rename fails, deleted once the new one is in place); on any error it is
    removed with the parents it created and the previous output is left as it was. Object
    storage: the prefix itself (a previous ``written`` emptied first with ``overwrite``, its
    marker deleted before the rest), and everything under it deleted again on an error.
    """
    if not is_local(out):
        with _staged_remote(out, overwrite, storage_options, written) as staging:
            yield staging
        return
    final = _local_path(out)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    created: list[Path] = []
    try:
        try:
            created = _make_parents(final.absolute().parent)
            tmp.mkdir(parents=False)
        except OSError as err:
            raise _unwritable(out, err) from None
        yield Staging(str(tmp.absolute()), str(final))
        if final.exists() and not overwrite:
            raise InputError(f"output folder appeared while running: {out}: choose a new --out")
        try:
            if final.exists():
                check_replaceable(out, written)  # it may have changed meanwhile
                _replace_folder(tmp, final)
            else:
                tmp.rename(final)
        except OSError as err:
            raise _unwritable(out, err) from None
    except BaseException:
        _remove_partial(tmp, created)
        raise


@contextmanager
def _staged_remote(
    out: str, overwrite: bool, storage_options: Mapping[str, Any] | None, written: Written
) -> Iterator[Staging]:
    fs, path = _remote_prefix(out, storage_options)
    marker = written.marker
    try:
        _make_room(fs, path, out, overwrite, storage_options, written)
    except STORAGE_ERRORS as err:
        raise storage_error(err, out, "clearing the output") from None
    try:
        yield Staging(out, out, storage_options)
    except BaseException:
        try:
            _clear_prefix(fs, path, _objects_under(fs, path), marker)
        except STORAGE_ERRORS:
            pass
        raise


def _unwritable(out: str, err: OSError) -> RunAborted:
    return RunAborted(
        f"cannot write to {out} ({err.strerror or short_error(err)}): nothing was written; "
        "free space or fix the folder's permissions, then re-run"
    )
