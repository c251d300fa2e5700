"""Subset assignment (ALGORITHMS.md §1 step 1): independent of row values by construction.

- row level, ``random``: keyed hash of (public seed, global row position) mod t, so a
  row whose values are replaced stays in its subset (replace-one neighbours);
- row level, ``contiguous`` (SS21): the j-th block of consecutive rows;
- user level: keyed BLAKE2b of the user id's canonical bytes, keyed by (purpose, public
  seed), mod t, so adding or removing a user touches exactly one subset (add/remove
  neighbours).

User ids are made canonical at the Arrow level, before pandas or NumPy can change their
type (a partition holding a null turns pandas' int64 into float64, and int 5 and float 5.0
hashed differently, so one user reached two subsets). One value has one encoding
whatever its physical type:

- numbers (any integer width, signed or not; float16/32/64; decimals): an integer value
  ``v`` is ``b"i:" + str(v)`` (so 5, 5.0 and Decimal("5.00") are one user); any other
  finite value is its exact fraction ``b"q:<num>/<den>"`` in lowest terms; ±inf are
  ``b"q:inf"``/``b"q:-inf"``;
- strings: ``b"s:"`` + UTF-8; binary: ``b"b:"`` + the bytes (a string is not the binary
  of its UTF-8: the types are told apart);
- dictionary-encoded columns: their values, as above;
- null ids, and NaN in a float id column, belong to no user: their rows are dropped when
  read (:func:`canonical_unit_ids`), so the release does not depend on them at all;
- other types (booleans, dates, times, timestamps, nested) are refused from the schema
  alone (:func:`unit_type_supported`), before any row is read.

Two assignments that must be independent (subsets, and boosting's groups) hash with
different keys (``purpose``).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijective mixing of 64-bit integers."""
    z = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _seed_key(seed: int) -> np.uint64:
    return _mix64(np.array([seed & int(_MASK64)], dtype=np.uint64))[0]


def random_row_subsets(positions: np.ndarray, seed: int, subsets: int) -> np.ndarray:
    """Subset of each global row position: keyed hash (seed, position) mod t."""
    keyed = positions.astype(np.uint64) ^ _seed_key(seed)
    return (_mix64(_mix64(keyed)) % np.uint64(subsets)).astype(np.int64)


def contiguous_row_subsets(positions: np.ndarray, n_rows: int, subsets: int) -> np.ndarray:
    """Subset j holds rows [j·n/t, (j+1)·n/t): consecutive blocks in file/row order (SS21)."""
    return (positions.astype(np.int64) * subsets) // n_rows


@dataclass(frozen=True)
class UnitIds:
    """Each row's user: row i belongs to the user whose canonical id is ``keys[inverse[i]]``.

    ``keys`` (an object array of bytes) holds each distinct id once, so every per-user
    computation (hashing, per-user sums) runs once per user, not once per row.
    """

    keys: np.ndarray
    inverse: np.ndarray

    def __len__(self) -> int:
        return len(self.inverse)

    def __getitem__(self, rows: Any) -> UnitIds:
        """The ids of the selected rows (a mask or indices), keys still distinct and used."""
        used, inverse = np.unique(self.inverse[rows], return_inverse=True)
        return UnitIds(self.keys[used], inverse.astype(np.int64).reshape(-1))


_SCALAR_ID = re.compile(
    r"(u?int(8|16|32|64)|halffloat|float|double|decimal(32|64|128|256)\(\d+, -?\d+\)"
    r"|(large_)?string|string_view|(large_)?binary|binary_view|fixed_size_binary\[\d+\])"
)
_DICTIONARY = re.compile(r"dictionary<values=(.+), indices=\w+, ordered=\d>")


def unit_type_supported(type_name: str) -> bool:
    """Whether a column of this Arrow type (as ``str(type)``) can hold user ids."""
    nested = _DICTIONARY.fullmatch(type_name)
    return bool(_SCALAR_ID.fullmatch(nested.group(1) if nested else type_name))


def _number_key(value: int | float | Decimal) -> bytes:
    """One encoding per numeric value, whatever type holds it (module docstring)."""
    if isinstance(value, float) and math.isinf(value):
        return b"q:inf" if value > 0 else b"q:-inf"
    num, den = (value, 1) if isinstance(value, int) else value.as_integer_ratio()
    return b"i:%d" % num if den == 1 else b"q:%d/%d" % (num, den)


def _string_key(value: str) -> bytes:
    return b"s:" + value.encode("utf-8")


def _binary_key(value: bytes) -> bytes:
    return b"b:" + bytes(value)


def _encoder(type_: pa.DataType):
    """The canonical encoding of the values of one Arrow type (module docstring)."""
    t = pa.types
    if t.is_integer(type_) or t.is_floating(type_) or t.is_decimal(type_):
        return _number_key
    if t.is_string(type_) or t.is_large_string(type_) or str(type_) == "string_view":
        return _string_key
    if t.is_binary(type_) or t.is_large_binary(type_) or t.is_fixed_size_binary(type_):
        return _binary_key
    if str(type_) == "binary_view":
        return _binary_key
    raise TypeError(f"user ids of type {type_} are not supported")


def canonical_unit_ids(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray | None, UnitIds]:
    """The canonical ids of a unit column, and which rows have one (None: every row).

    Rows whose id is null (or NaN) belong to no user and are left out of ``UnitIds``;
    the caller drops them. Distinct values are found by Arrow's hash kernels and each is
    encoded once. The encoding is one-to-one on the distinct values of one column (floats
    are first widened to float64 and -0.0 made 0.0), so the keys stay distinct.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_floating(column.type):
        column = pc.add(column.cast(pa.float64()), 0.0)  # exact; -0.0 + 0.0 is 0.0
        valid = pc.fill_null(pc.and_kleene(column.is_valid(), pc.invert(pc.is_nan(column))), False)
    else:
        valid = column.is_valid()
    keep = None
    if pc.any(pc.invert(valid)).as_py():
        keep = valid.to_numpy(zero_copy_only=False)
        column = column.filter(valid)
    encoded_column = column.dictionary_encode()  # one hash pass: distinct values and indices
    distinct = encoded_column.dictionary
    inverse = encoded_column.indices.to_numpy(zero_copy_only=False)
    encode = _encoder(distinct.type)
    if pa.types.is_integer(distinct.type):  # Python ints by NumPy: faster than to_pylist
        values = distinct.to_numpy(zero_copy_only=False).tolist()
    else:
        values = distinct.to_pylist()
    keys = np.empty(len(values), dtype=object)
    keys[:] = [encode(value) for value in values]
    return keep, UnitIds(keys, inverse.astype(np.int64))


def _as_unit_ids(units: Any) -> UnitIds:
    if isinstance(units, UnitIds):
        return units
    array = units if isinstance(units, pa.Array | pa.ChunkedArray) else pa.array(units)
    keep, ids = canonical_unit_ids(array)
    if keep is not None:
        raise ValueError("null ids belong to no user: drop their rows first")
    return ids


def unit_key(seed: int, purpose: bytes) -> bytes:
    """The public BLAKE2b key of one assignment: what it assigns, and the run's public seed."""
    return b"dpsub/" + purpose + b"/" + (int(seed) & int(_MASK64)).to_bytes(8, "little")


def unit_subsets(units: Any, seed: int, subsets: int, purpose: bytes = b"subsets") -> np.ndarray:
    """Subset of each row's user: keyed BLAKE2b (8 bytes) of its canonical id, mod t.

    ``units``: :class:`UnitIds`, or ids in any form Arrow reads (no nulls). The modulo bias
    is below t/2⁶⁴ and depends on no row value.
    """
    ids = _as_unit_ids(units)
    keyed = hashlib.blake2b(digest_size=8, key=unit_key(seed, purpose))
    digests = []
    for k in ids.keys:  # one hash per user; copying the keyed state skips the key block
        state = keyed.copy()
        state.update(k)
        digests.append(state.digest())
    hashed = np.frombuffer(b"".join(digests), dtype="<u8")
    return (hashed % np.uint64(subsets)).astype(np.int64)[ids.inverse]
