"""The exported module file: a TVM shared library followed by sparsec's metadata trailer.

    [ELF shared library][metadata JSON][u64 JSON length]["SPARSEC-MODULE-1"]

The library part is what ``tvm.runtime.load_module`` opens (the dynamic loader ignores
bytes past the ELF image). The trailer says what the module is -- operator, format,
knobs, dtypes, parameters, target and device archs, sparsec and TVM versions -- and holds
the SHA-256 of the library part and of the metadata itself, so a file that was truncated
or corrupted anywhere is refused before any of it is loaded or run. Reading it needs
neither TVM nor a GPU.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any, Dict, Tuple

MAGIC = b"SPARSEC-MODULE-1"
FORMAT_VERSION = 1
_ELF = b"\x7fELF"
_MAX_META = 16 << 20


class ModuleFileError(ValueError):
    """The file is not a sparsec module, or it is damaged."""


REQUIRED_KEYS = ("op", "format", "dtype", "target", "knobs", "params", "archs", "sparsec_version",
                 "tvm_version", "format_version", "library_bytes", "library_sha256", "metadata_sha256")


def _metadata_digest(meta: Dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "metadata_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def trailer(lib: bytes, meta: Dict[str, Any]) -> Tuple[Dict[str, Any], bytes]:
    """(the metadata as stored, the trailer bytes) for the library ``lib``: its size and
    checksum and the metadata's own checksum filled in."""
    meta = dict(meta, format_version=meta.get("format_version", FORMAT_VERSION), library_bytes=len(lib),
                library_sha256=hashlib.sha256(lib).hexdigest())
    meta["metadata_sha256"] = _metadata_digest(meta)
    blob = json.dumps(meta, sort_keys=True).encode()
    return meta, blob + struct.pack("<Q", len(blob)) + MAGIC


def append_metadata(path: str, meta: Dict[str, Any]) -> Dict[str, Any]:
    """Add the trailer to the library TVM just wrote at ``path``; returns the metadata as
    stored."""
    with open(path, "rb") as f:
        lib = f.read()
    if not lib.startswith(_ELF):
        raise ModuleFileError(f"{path}: the exported library is not an ELF shared object")
    meta, tail = trailer(lib, meta)
    with open(path, "ab") as f:
        f.write(tail)
    return meta


def read_metadata(path: str) -> Tuple[Dict[str, Any], int]:
    """``(metadata, library size)`` of a sparsec module file, both checksums recomputed: any
    mismatch, truncation, missing field or foreign file raises :class:`ModuleFileError`
    naming what is wrong."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no module file at {path}")
    size = os.path.getsize(path)
    tail = len(MAGIC) + 8
    with open(path, "rb") as f:
        head = f.read(4)
        if size < tail + 4 or head != _ELF:
            raise ModuleFileError(f"{path} is not a sparsec module (not an ELF shared library)")
        f.seek(size - tail)
        (meta_len,), magic = struct.unpack("<Q", f.read(8)), f.read(len(MAGIC))
        if magic != MAGIC:
            raise ModuleFileError(f"{path} has no sparsec metadata trailer: export it with Kernel.export or "
                                  "'sparsec build -o', or it was truncated")
        if meta_len > min(_MAX_META, size - tail - 4):
            raise ModuleFileError(f"{path}: metadata length {meta_len} does not fit the file ({size} bytes)")
        lib_len = size - tail - meta_len
        f.seek(lib_len)
        try:
            meta = json.loads(f.read(meta_len))
        except ValueError as e:
            raise ModuleFileError(f"{path}: the metadata is not valid JSON ({e})") from None
        if not isinstance(meta, dict) or meta.get("library_bytes") != lib_len:
            raise ModuleFileError(f"{path}: the metadata does not describe this file's library "
                                  f"({lib_len} bytes): the file was cut or spliced")
        missing = [k for k in REQUIRED_KEYS if k not in meta]
        if missing:
            raise ModuleFileError(f"{path}: the metadata lacks {', '.join(missing)}")
        if _metadata_digest(meta) != meta["metadata_sha256"]:
            raise ModuleFileError(f"{path}: metadata checksum mismatch: the metadata was modified or corrupted "
                                  "after export; nothing was loaded")
        f.seek(0)
        digest = hashlib.sha256()
        left = lib_len
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise ModuleFileError(f"{path}: truncated library")
            digest.update(chunk)
            left -= len(chunk)
        if digest.hexdigest() != meta["library_sha256"]:
            raise ModuleFileError(f"{path}: checksum mismatch: the library was modified or corrupted "
                                  "after export; nothing was loaded")
    return meta, lib_len
