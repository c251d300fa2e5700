"""Where files live: fsspec filesystems for local paths and URLs (``s3://`` …), storage
options whose secrets never print, and storage errors turned into one-line fixes.

Storage options travel with the tasks to the workers (they read the data), so they are
held in :class:`StorageOptions`: a read-only mapping whose ``repr`` shows only the values
of known non-secret options and whose Dask token is a random nonce (task keys carry no
hash of a secret). Dask logs a failed task's ``repr``; this keeps credentials out of it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import fsspec
from fsspec.utils import get_protocol

from dpsub_dist.errors import InputError, StorageFailure

SHOWN_OPTIONS = frozenset(
    {
        "endpoint_url",
        "region_name",
        "anon",
        "use_ssl",
        "requester_pays",
        "profile",
        "default_block_size",
        "version_aware",
        "client_kwargs",
        "config_kwargs",
        "s3_additional_kwargs",
    }
)
"""Options whose values are printed; every other value (key, secret, token, …) is redacted."""

REDACTED = "***"

CREDENTIALS_HINT = (
    "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or "
    "--storage-option key=... secret=...) and the bucket policy"
)


def _redact(options: Mapping[str, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for name, value in options.items():
        if name not in SHOWN_OPTIONS:
            shown[name] = REDACTED
        elif isinstance(value, Mapping):
            shown[name] = _redact(value)
        else:
            shown[name] = value
    return shown


class StorageOptions(Mapping[str, Any]):
    """fsspec/s3fs options (endpoint, region, credentials) with a redacting ``repr``."""

    __slots__ = ("_options", "_nonce")

    def __init__(self, options: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None):
        self._options = dict(options or {})
        self._nonce = uuid.uuid4().hex

    @classmethod
    def wrap(cls, options: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> StorageOptions:
        """``options`` itself if it already is a StorageOptions, else a new one."""
        return options if isinstance(options, StorageOptions) else cls(options)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]]) -> StorageOptions:
        """From ``--storage-option KEY=VALUE`` strings.

        For the known non-secret options, ``true``/``false`` become booleans and a value
        starting with ``{`` is read as JSON (``client_kwargs={"region_name": "eu-west-1"}``);
        everything else, secrets included, stays a string.
        """
        options: dict[str, Any] = {}
        for name, text in pairs:
            value: Any = text
            if name in SHOWN_OPTIONS and text.lower() in ("true", "false"):
                value = text.lower() == "true"
            elif name in SHOWN_OPTIONS and text.lstrip().startswith("{"):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError:
                    raise InputError(
                        f"--storage-option {name}: not valid JSON: quote it as "
                        f'{name}=\'{{"key": "value"}}\''
                    ) from None
            options[name] = value
        return cls(options)

    def __getitem__(self, name: str) -> Any:
        return self._options[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._options)

    def __len__(self) -> int:
        return len(self._options)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._options == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._options)))

    def __repr__(self) -> str:
        return f"StorageOptions({_redact(self._options)!r})"

    __str__ = __repr__

    def __dask_tokenize__(self) -> tuple[str, str]:
        return ("StorageOptions", self._nonce)

    def __getstate__(self) -> tuple[dict[str, Any], str]:
        return self._options, self._nonce

    def __setstate__(self, state: tuple[dict[str, Any], str]) -> None:
        self._options, self._nonce = state


def _storage_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError]
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    except ImportError:  # pragma: no cover - botocore comes with s3fs
        pass
    return tuple(errors)


STORAGE_ERRORS = _storage_errors()
"""What a filesystem call may raise for a storage problem (botocore's are not OSErrors)."""


def is_local(uri: str) -> bool:
    """Whether ``uri`` is a local path (or ``file://`` URL) rather than object storage."""
    return get_protocol(str(uri)) in ("file", "local")


def filesystem(uri: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem of ``uri`` and the path within it; ``options`` configure remote
    filesystems only (a local path beside an ``s3://`` input ignores them)."""
    if is_local(uri):
        return fsspec.core.url_to_fs(str(uri))
    return fsspec.core.url_to_fs(str(uri), **dict(options or {}))


def with_protocol(fs: Any, path: str) -> str:
    """A filesystem path as a URL again (``s3://bucket/key``); local paths stay plain."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return path if protocol in ("file", "local") else f"{protocol}://{path}"


def join(uri: str, name: str) -> str:
    """``uri/name`` for a local path or a URL."""
    return f"{str(uri).rstrip('/')}/{name}"


def short_error(err: BaseException) -> str:
    """The first line of an error message (at most 200 characters)."""
    return str(err).splitlines()[0][:200] if str(err) else type(err).__name__


def bucket_of(fs: Any, path: str) -> str:
    """The bucket (first path component) of an object-store path."""
    return fs._strip_protocol(path).split("/", 1)[0]


def storage_error(err: BaseException, uri: str, action: str) -> StorageFailure:
    """A one-line StorageFailure for an fsspec/s3fs failure on ``uri`` (no secrets in it)."""
    if isinstance(err, PermissionError):
        return StorageFailure(
            f"access denied {action} {uri} ({short_error(err)}): {CREDENTIALS_HINT}"
        )
    if isinstance(err, FileNotFoundError) and "bucket" in str(err).lower():
        return StorageFailure(
            f"bucket of {uri} does not exist ({short_error(err)}): check the bucket name "
            "and the endpoint (AWS_ENDPOINT_URL or --storage-option endpoint_url=...)"
        )
    if isinstance(err, FileNotFoundError):
        return StorageFailure(f"not found while {action} {uri}: check the path")
    return StorageFailure(
        f"cannot reach storage while {action} {uri} ({short_error(err)}): check the endpoint, "
        "network and credentials"
    )
