"""A checkpoint's tensors read by their stored names, a group (or some rows of a matrix) at a time: what a model
streamed layer by layer (:class:`~headwise.models.streamed.LayerStream`) reads its units from.

- :class:`StoredTensors` — the protocol: names, shapes, stored bytes, ``load(names)`` as new float32 tensors.
- :class:`RowTensors` — one that also reads some rows of a matrix (an embedding's rows for a batch's tokens, an
  unembedding a slice at a time).
- :class:`SafetensorsTensors` — a folder's safetensors files (one, or shards), each read opened and closed again;
  a GGUF file's blocks are read by :class:`headwise.models.gguf_stream.GGUFTensors`.

Shape legend: V rows of a matrix (an embedding's or unembedding's vocabulary), D model width.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

__all__ = ["RowTensors", "StoredTensors", "SafetensorsTensors"]


class StoredTensors(Protocol):
    """A checkpoint's tensors by their stored names, read a group at a time."""

    def names(self) -> list[str]:
        """Every stored tensor's name."""
        ...

    def shape(self, name: str) -> tuple[int, ...]:
        """A stored tensor's shape, as the model holds it."""
        ...

    def stored_bytes(self, name: str) -> int:
        """The bytes of a stored tensor in the file (what reading it touches)."""
        ...

    def load(self, names: Sequence[str], *, into: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        """The tensors ``names`` as float32 tensors (nothing of the file kept mapped after the call): written into
        ``into[name]`` (a float32 tensor of its shape, warm memory to reuse) where given, else new."""
        ...


class RowTensors(StoredTensors, Protocol):
    """A checkpoint that can also read some rows of a matrix (:class:`LayerStream` then reads an embedding's rows for
    the tokens it is given, and an unembedding a slice of rows at a time)."""

    def rows_ok(self, name: str) -> bool:
        """Whether :meth:`load_rows` reads ``name`` (a matrix stored row by row, the rows finished alone)."""
        ...

    def load_rows(self, name: str, rows: Tensor) -> Tensor:
        """Rows ``rows`` (sorted, distinct, ``(n,)``) of matrix ``name`` as a new float32 ``(n, D)`` tensor."""
        ...


class SafetensorsTensors:
    """The tensors of a folder's safetensors files (one, or shards), read with ``safe_open`` per call.

    ``safe_open`` memory-maps the file; the pages a conversion touches count in the process's resident memory until
    the file is closed, so each :meth:`load` opens the files it needs, copies its tensors into float32 and closes
    them. Raises ValueError naming the file where safetensors cannot read it.
    """

    def __init__(self, files: Sequence[str | os.PathLike]):
        from safetensors import SafetensorError, safe_open

        self._where: dict[str, Path] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._bytes: dict[str, int] = {}
        for path in map(Path, files):
            try:
                with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        sl = f.get_slice(name)
                        shape = tuple(sl.get_shape())
                        self._where.setdefault(name, path)
                        self._shapes[name] = shape
                        numel = 1
                        for d in shape:
                            numel *= d
                        self._bytes[name] = numel * _DTYPE_BYTES.get(sl.get_dtype(), 4)
            except (SafetensorError, OSError) as e:
                raise ValueError(f"{path}: cannot read the safetensors file ({' '.join(str(e).split())})") from None

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def stored_bytes(self, name: str) -> int:
        return self._bytes[name]

    def rows_ok(self, name: str) -> bool:
        """Every matrix reads by rows (``get_slice``)."""
        return len(self._shapes[name]) == 2

    def load_rows(self, name: str, rows: Tensor) -> Tensor:
        """Rows ``rows`` (sorted, distinct, ``(n,)``) of matrix ``name`` in float32, ``(n, D)``: each run of
        consecutive rows read at once through ``get_slice`` (only those rows' pages touched), the file closed after."""
        from safetensors import safe_open

        index = [int(r) for r in rows]
        out = torch.empty(len(index), self._shapes[name][1], dtype=torch.float32)  # (n, D)
        with safe_open(os.fspath(self._where[name]), framework="pt", device="cpu") as f:
            part = f.get_slice(name)
            k = 0
            while k < len(index):
                end = k + 1
                while end < len(index) and index[end] == index[end - 1] + 1:
                    end += 1
                out[k:end] = part[index[k] : index[end - 1] + 1].to(torch.float32)
                k = end
        return out

    def load(self, names: Sequence[str], *, into: Mapping[str, Tensor] | None = None) -> dict[str, Tensor]:
        from safetensors import safe_open

        into = into or {}
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self._where[name], []).append(name)
        out = {}
        for path, group in by_file.items():
            with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
                for name in group:
                    # a copy even when stored as float32: the mapped tensor must not outlive the file
                    stored = f.get_tensor(name)
                    if name in into:
                        out[name] = into[name].copy_(stored)
                    else:
                        out[name] = stored.to(torch.float32, copy=True)
                    del stored
        return out


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
