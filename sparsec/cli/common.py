"""What the subcommands share: argument types, the format options and their reading, the
matrix sources, JSON output and the exit codes.

Nothing here imports TVM or the compiler: ``sparsec --help``, ``ops``, ``formats`` and
``inspect`` must start in well under a second.
"""
from __future__ import annotations

import argparse
import math

# exit codes (documented in the package docstring, --help and the README)
OK, CHECK_FAILED, BAD_INPUT, CHECK_NOT_RUN = 0, 1, 2, 3

# CLI option (attribute) -> (format knob, families that take it); --block, --tile and --dtype are special
KNOB_OPTIONS = {
    "width": ("width", ("ell",)),
    "col_parts": ("col_parts", ("hyb",)),
    "buckets": ("buckets", ("hyb",)),
    "n": ("n", ("nm", "nm_tc")),
    "m": ("m", ("nm", "nm_tc")),
    "vec": ("vec", ("nm", "srbcrs", "nm_tc")),
    "block_fill": ("block_fill", ("bsr+csr",)),
}


# ---- argument types ---------------------------------------------------------------------------
def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"should be a positive integer, got {text!r}")
    return v


def fraction(text):
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"should be a number >= 0 (e.g. 0.5), got {text!r}")
    return v


def buckets(text):
    try:
        vals = tuple(int(t) for t in text.replace("/", ",").split(",") if t.strip())
    except ValueError:
        vals = ()
    if not vals or any(v < 1 or v & (v - 1) for v in vals):
        raise argparse.ArgumentTypeError(f"should be powers of two separated by commas, like 1,2,4,8, got {text!r}")
    return vals


def count(text):
    """``4M`` -> 4000000 (R-MAT non-zero limits)."""
    from ..bench.cases import parse_count

    try:
        return parse_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ---- options ----------------------------------------------------------------------------------
def add_matrix_source(p, required=False, many=False):
    """--matrix FILE.npz | --random ROWS,COLS,DENSITY[,SEED] (mutually exclusive)."""
    src = p.add_mutually_exclusive_group(required=required)
    src.add_argument("--matrix", metavar="FILE.npz", nargs="+" if many else None,
                     help="scipy.sparse.save_npz file" + ("(s)" if many else "")
                          + ("" if required else " (default: the embedded matrix)"))
    src.add_argument("--random", metavar="ROWS,COLS,DENSITY[,SEED]",
                     help="a scipy.sparse.random matrix (float32 standard normal values, seed 0)")
    return src


def add_format_options(p):
    g = p.add_argument_group("format knobs")
    g.add_argument("--block", metavar="RxC", help="bsr / bsr+csr block shape, e.g. 4x4")
    g.add_argument("--width", type=positive_int, metavar="W", help="ELL width (slots per row)")
    g.add_argument("--col-parts", type=positive_int, metavar="P", help="hyb column ranges (default automatic)")
    g.add_argument("--buckets", type=buckets, metavar="1,2,4,...", help="hyb bucket widths (default automatic)")
    g.add_argument("--n", type=positive_int, metavar="N", help="nm / nm_tc: slots kept per window")
    g.add_argument("--m", type=positive_int, metavar="M", help="nm / nm_tc: window width in columns")
    g.add_argument("--vec", type=positive_int, metavar="V",
                   help="nm (1..128) / nm_tc (16, 32, 64, 128) / srbcrs (2, 4, 8) row vector size")
    g.add_argument("--block-fill", type=fraction, metavar="F", help="bsr+csr: fill at which a block goes to BSR")
    g.add_argument("--tile", metavar="RxC", help="tiled: tile shape, multiples of 8 up to 256 (default 64x64)")
    g.add_argument("--dtype", default=None, help="value dtype: float32 (default), float64, float16; "
                                                 "srbcrs also int8, int4")
    add_matrix_source(p)


def add_kernel_options(p):
    p.add_argument("op", help="library operator (see 'sparsec ops')")
    p.add_argument("--format", required=True, metavar="FMT",
                   help="family or spec: csr, bsr:4x4, ell, ell:8, hyb, nm, srbcrs, bsr+csr, mma_sp, nm_tc, tiled "
                        "(see 'sparsec formats'); 'auto' (sparsec run): the tuning logs' pick of format and "
                        "knobs for the matrix, width and target, else the rule-based default")
    add_format_options(p)
    p.add_argument("--feat", type=positive_int, default=64, metavar="N", help="dense feature width (default 64)")
    p.add_argument("--target", default="llvm", help="llvm, cuda, cuda:sm_80 or cuda:sm_90a (default llvm)")


# ---- reading the format options ---------------------------------------------------------------
def format_spec(args, declare_only=False):
    """(spec, params, dtype) from --format plus the knob options and --dtype; params still
    None need a matrix (or are errors the family reports). ``declare_only`` (describing a
    family) leaves unset what describe_format fills with an example."""
    from .. import formats
    from ..dtypes import dtype_spec

    module, params = formats.parse_spec(args.format)
    name = module.NAME
    extra = {}
    if args.block is not None:
        if name not in ("bsr", "bsr+csr"):
            raise ValueError(f"--block does not apply to format {name} (it is for bsr and bsr+csr)")
        extra["block"] = formats.bsr.parse_spec(args.block.lower().replace("/", "x"))["block"]
    if getattr(args, "tile", None) is not None:
        if name != "tiled":
            raise ValueError(f"--tile does not apply to format {name} (it is for tiled)")
        extra["tile"] = formats.tiled.parse_spec(args.tile)["tile"]
    for opt, (knob, families) in KNOB_OPTIONS.items():
        v = getattr(args, opt, None)
        if v is None:
            continue
        if name not in families:
            flag = "--" + opt.replace("_", "-")
            raise ValueError(f"{flag} does not apply to format {name} (it is for {', '.join(families)})")
        extra[knob] = v
    params.update(extra)
    if declare_only:
        dtype = None if args.dtype is None else dtype_spec(args.dtype).name
        if name == "srbcrs" and dtype is not None:
            params["dtype"] = kernel_dtype(args, name, params)
        elif dtype is not None and dtype != "float32":
            kernel_dtype(args, name, params)  # integer dtypes: the srbcrs error
        return args.format, params, dtype
    dtype = kernel_dtype(args, name, params)
    if name == "srbcrs":
        params["dtype"] = dtype
    if name in ("nm", "nm_tc") and (params.get("n") is None or params.get("m") is None):
        raise ValueError(f"{name} needs --n N and --m M (e.g. --format {name} --n 2 --m 4), or a spec like {name}:2:4")
    return args.format, params, dtype


def kernel_dtype(args, family, params):
    """The kernel dtype: --dtype, else (srbcrs) the spec's precision, else float32."""
    from .. import formats
    from ..dtypes import dtype_spec

    given = None if args.dtype is None else dtype_spec(args.dtype).name
    if family == "srbcrs":
        spec_dtype = params.get("dtype")
        if given is not None and spec_dtype is not None and given != spec_dtype:
            raise ValueError(f"--dtype {given} contradicts the spec's precision {spec_dtype} ({args.format})")
        dtype = given or spec_dtype
        if dtype not in formats.srbcrs.DTYPES:
            raise ValueError(f"srbcrs needs --dtype int8, int4 or float16 (the SR-BCRS precisions), "
                             f"got {dtype or 'none'}")
        return dtype
    dtype = given or "float32"
    if dtype_spec(dtype).exact:
        raise ValueError(f"integer kernels need --format srbcrs (--dtype {dtype} with format {family}); "
                         f"e.g. --format srbcrs --vec 8 --dtype {dtype}")
    return dtype


# ---- output -----------------------------------------------------------------------------------
from ..jsonable import dumps, jsonable  # noqa: E402,F401  (the CLI's JSON: numbers or null)
