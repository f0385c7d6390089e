"""What a format is and what a converted matrix costs: the data behind ``sparsec formats --describe``.

    from sparsec import inspect
    inspect.describe_format("nm")              # family, axis chain, value layout, knobs
    inspect.describe_format("nm", n=2, m=4)    # the chain with those knobs filled in
    inspect.describe(convert(m, "hyb"))         # shape, nnz, stored, padding, bytes, parts

Both return plain dicts (JSON-serialisable: tuples become lists) and work for simple
formats (``Format`` / ``FormatInstance``) and composites (``CompositeFormat`` /
``CompositeInstance``, e.g. hyb and bsr+csr), whose parts are listed one by one.
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np

from . import formats
from .formats import Format, FormatInstance
from .formats.composite import CompositeFormat, CompositeInstance

# per family and knob: (CLI option, meaning). The knob names themselves come from each
# family's parse_spec, so a knob added there shows up (with an empty meaning) here.
KNOB_HELP: Dict[str, Dict[str, tuple]] = {
    "csr": {},
    "bsr": {"block": ("--block RxC", "block shape r x c (required)")},
    "ell": {"width": ("--width W", "slots per row (default: the longest row)")},
    "nm": {"n": ("--n N", "slots kept per window (1 <= N < M)"),
           "m": ("--m M", "window of M consecutive columns"),
           "vec": ("--vec V", "V consecutive rows share one pattern (1, 2, 4, 8, 16, 32)")},
    "nm_tc": {"n": ("--n N", "columns kept per window (1 <= N < M)"),
              "m": ("--m M", "window of M consecutive columns"),
              "vec": ("--vec V", "V consecutive rows share one pattern (16, 32, 64, 128; default 128)")},
    "srbcrs": {"vec": ("--vec V", "rows per column vector (2, 4, 8)"),
               "dtype": ("--dtype D", "value precision: int8, int4 (packed) or float16")},
    "rell": {"width": ("spec rell:W", "slots per listed row"),
             "unique": ("spec rell:W,dup", "whether a row id may repeat (split long rows)")},
    "hyb": {"col_parts": ("--col-parts P", "column ranges (default: automatic)"),
            "buckets": ("--buckets 1,2,4,...", "power-of-two ELL bucket widths (default: automatic)")},
    "bsr+csr": {"block": ("--block RxC", "block shape of the BSR part (default 8x8)"),
                "block_fill": ("--block-fill F", "a block at least this full goes to BSR (default 0.5)")},
    "tiled": {"tile": ("--tile RxC", "tile shape, multiples of 8 up to 256 (default 64x64)")},
}

# parameters that make a declarable format of each family, for describing a family
# whose knobs are not given (marked "example": True in the result)
EXAMPLE_PARAMS: Dict[str, Dict[str, Any]] = {
    "bsr": {"block": (4, 4)},
    "nm": {"n": 2, "m": 4, "vec": 1},
    "srbcrs": {"vec": 8, "dtype": "int8"},
    "nm_tc": {"n": 1, "m": 8, "vec": 128},
    "rell": {"width": 8, "unique": True},
    "hyb": {"col_parts": 1, "buckets": (1, 2, 4, 8)},
}


def _plain(v):
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


def describe_axis(axis) -> Dict[str, Any]:
    """One axis as a dict: name, kind, dim, scale, extent or width (None: known at run
    time / from the matrix), index array names, and its flags."""
    out: Dict[str, Any] = {"name": axis.name, "kind": axis.kind, "dim": axis.dim, "scale": axis.scale}
    if hasattr(axis, "extent"):
        out["extent"] = axis.extent
    if hasattr(axis, "width"):
        out["width"] = axis.width
    for attr in ("indptr", "indices"):
        if getattr(axis, attr, None) is not None:
            out[attr] = getattr(axis, attr)
    out["flags"] = {"variable": bool(axis.variable), "sparse": bool(axis.sparse),
                    "padded": bool(axis.padded), "unique": bool(axis.unique)}
    return out


def _describe_simple(fmt: Format) -> Dict[str, Any]:
    return {"spec": fmt.spec, "family": fmt.name,
            "params": {k: _plain(v) for k, v in fmt.params},
            "axes": [describe_axis(a) for a in fmt.axes],
            "value_layout": {"chunk": int(fmt.value_chunk), "bits": int(fmt.value_bits)},
            "index_arrays": list(fmt.index_array_names()),
            "runtime_extents": list(fmt.runtime_extent_axes())}


def _knobs(module) -> List[Dict[str, Any]]:
    defaults = module.parse_spec(None)
    helps = KNOB_HELP.get(module.NAME, {})
    return [{"name": k, "default": _plain(v), "cli": helps.get(k, ("", ""))[0], "help": helps.get(k, ("", ""))[1]}
            for k, v in defaults.items()]


def describe_format(name_or_spec, **params) -> Dict[str, Any]:
    """A format family (``"nm"``), spec (``"bsr:4x4"``, ``"hyb:4:1/2/4"``) or declared
    ``Format``/``CompositeFormat``: its name, description, axis chain (one dict per axis:
    ``describe_axis``), value layout (chunk, bits), and the knobs it takes. Keyword
    ``params`` override the spec's (``describe_format("nm", n=1, m=8)``). Knobs still
    unset (a family alone) are filled with an example (``"example": True``); a width
    chosen from the matrix (ell) stays None. Composites describe each part format
    under ``parts`` (top-level ``axes``/``value_layout`` are None)."""
    if isinstance(name_or_spec, (Format, CompositeFormat)):
        module, fmt, example = formats.module_for(name_or_spec.name), name_or_spec, False
        given = dict(name_or_spec.params)
    else:
        module, given = formats.parse_spec(name_or_spec)
        given.update({k: v for k, v in params.items() if v is not None})
        unknown = sorted(set(params) - set(module.parse_spec(None)))
        if unknown:
            raise ValueError(f"format {module.NAME} does not take {', '.join(unknown)} "
                             f"(its knobs: {', '.join(module.parse_spec(None)) or 'none'})")
        example = False
        filled = dict(given)
        for k, v in EXAMPLE_PARAMS.get(module.NAME, {}).items():
            if filled.get(k) is None:
                filled[k] = v
                example = True
        fmt = module.declare(**filled)
    out: Dict[str, Any] = {"name": module.NAME, "description": module.DESCRIPTION, "spec": fmt.spec,
                           "example": example, "composite": isinstance(fmt, CompositeFormat),
                           "params": {k: _plain(v) for k, v in fmt.params}, "knobs": _knobs(module)}
    if isinstance(fmt, CompositeFormat):
        out.update(axes=None, value_layout=None, parts=[_describe_simple(p) for p in fmt.parts])
    else:
        d = _describe_simple(fmt)
        out.update(axes=d["axes"], value_layout=d["value_layout"], index_arrays=d["index_arrays"],
                   runtime_extents=d["runtime_extents"], parts=[d])
    return out


def _nbytes(part: FormatInstance) -> Dict[str, int]:
    index = sum(int(a.nbytes) for a in part.arrays.values())
    return {"index_bytes": index, "value_bytes": int(part.data.nbytes), "bytes": index + int(part.data.nbytes)}


def _ratio(stored: int, nnz: int) -> float:
    return float(stored / nnz) if nnz else 1.0


def describe(inst) -> Dict[str, Any]:
    """A converted matrix: its format spec and family, shape, nnz, stored slots, padding
    ratio (stored / nnz; 1.0 without entries), bytes (index arrays + values, all parts;
    also split as ``index_bytes``/``value_bytes``), value dtype, conversion time, and
    ``parts``: per part its spec, stored, nnz, padding ratio and bytes (a simple format
    has one part, itself). A family whose Tensor Core kernel streams less than its arrays
    (``tiled``: values, a bitmap bit per element, an int32 per tile) adds ``stream_bytes``:
    those bytes, per element, and as a fraction of the dense float16 weight."""
    if isinstance(inst, CompositeInstance):
        parts = list(inst.parts)
    elif isinstance(inst, FormatInstance):
        parts = [inst]
    else:
        raise TypeError(f"describe takes a converted matrix (sparsec.formats.convert), got {type(inst).__name__}")
    per = []
    for p in parts:
        b = _nbytes(p)
        per.append({"format": p.format.spec, "family": p.format.name, "stored": int(p.stored), "nnz": int(p.nnz),
                    "padding_ratio": _ratio(int(p.stored), int(p.nnz)), **b})
    stored, nnz = int(inst.stored), int(inst.nnz)
    rows, cols = (int(s) for s in inst.shape)
    streamed = getattr(formats.module_for(inst.format.name), "stream_bytes", None)
    extra = {} if streamed is None or isinstance(inst, CompositeInstance) else {"stream_bytes": streamed(inst)}
    return {**extra,
        "format": inst.format.spec, "family": inst.format.name, "composite": isinstance(inst, CompositeInstance),
        "shape": [rows, cols], "nnz": nnz, "density": float(nnz / (rows * cols)) if rows * cols else 0.0,
        "stored": stored, "padding_ratio": _ratio(stored, nnz),
        "bytes": sum(p["bytes"] for p in per), "index_bytes": sum(p["index_bytes"] for p in per),
        "value_bytes": sum(p["value_bytes"] for p in per), "value_dtype": inst.value_dtype,
        "params": {k: _plain(v) for k, v in inst.format.params},
        "parts": per, "conversion_s": float(inst.conversion_s),
    }


def format_text(d: Dict[str, Any]) -> str:
    """``describe_format``'s dict as the lines ``sparsec formats --describe`` prints."""
    lines = [f"{'family':<9} {d['name']}: {d['description']}",
             f"{'spec':<9} {d['spec']}" + ("  (example knobs)" if d["example"] else "")]
    for k, part in enumerate(d["parts"]):
        head = "axes" if not d["composite"] else f"part {k}"
        if d["composite"]:
            lines.append(f"{head:<9} {part['spec']}")
            head = ""
        for a in part["axes"]:
            lines.append(f"{head:<9} {_axis_text(a)}")
            head = ""
        vl = part["value_layout"]
        lines.append(f"{'values':<9} " + _layout_text(vl))
    if not d["knobs"]:
        lines.append(f"{'knobs':<9} none")
    for k, kn in enumerate(d["knobs"]):
        default = "" if kn["default"] is None else f" (spec default {kn['default']})"
        lines.append(f"{'knobs' if k == 0 else '':<9} {kn['name']:<10} {kn['cli']:<20} {kn['help']}{default}")
    return "\n".join(lines)


def _axis_text(a: Dict[str, Any]) -> str:
    size = ""
    if "extent" in a:
        size = f"extent {a['extent'] if a['extent'] is not None else 'run-time'}"
    elif "width" in a:
        size = f"width {a['width'] if a['width'] is not None else 'run-time'}"
    arrays = ",".join(a[k] for k in ("indptr", "indices") if k in a)
    flags = ",".join(k for k, v in a["flags"].items() if v and k != "unique")
    if not a["flags"]["unique"]:
        flags = ",".join(filter(None, [flags, "repeats"]))
    return (f"{a['name']:<3} {a['kind']:<15} dim {a['dim']} ({'rows' if a['dim'] == 0 else 'cols'}) "
            f"scale {a['scale']:<3} {size:<17} {('arrays ' + arrays) if arrays else '':<24} {flags}").rstrip()


def _layout_text(vl: Dict[str, int]) -> str:
    chunk = (f"chunks of {vl['chunk']} slots, [inner dense][chunk] order" if vl["chunk"]
             else "flat axis order")
    bits = ", int4 packed 2 per byte" if vl["bits"] == 4 else ""
    return f"{chunk}{bits} (chunk {vl['chunk']}, bits {vl['bits']})"


def instance_text(d: Dict[str, Any]) -> str:
    """``describe``'s dict as the lines ``sparsec formats --describe FMT --random ...`` prints."""
    rows, cols = d["shape"]
    lines = [f"{'format':<9} {d['format']}",
             f"{'matrix':<9} {rows} x {cols}, nnz {d['nnz']} (density {d['density']:.3g}), {d['value_dtype']}",
             f"{'stored':<9} {d['stored']} slots, padding {d['padding_ratio']:.3f}x",
             f"{'bytes':<9} {d['bytes']} ({d['index_bytes']} index + {d['value_bytes']} values)",
             f"{'converted':<9} {d['conversion_s'] * 1e3:.1f} ms"]
    if "stream_bytes" in d:
        b = d["stream_bytes"]
        lines.append(f"{'streamed':<9} {b['total']} bytes by a Tensor Core kernel at float16 ({b['bytes_per_element']:.3f} "
                     f"per element, {100 * b['of_dense']:.1f} % of the dense weight)")
    for k, p in enumerate(d["parts"]):
        lines.append(f"{'parts' if k == 0 else '':<9} {k}: {p['format']:<14} stored {p['stored']}, nnz {p['nnz']}, "
                     f"padding {p['padding_ratio']:.3f}x, {p['bytes']} bytes")
    return "\n".join(lines)
