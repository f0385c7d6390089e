"""The ``sparsec`` command: a thin shell over the Python API.

    sparsec run spmm --format csr --feat 64 --target llvm --check      # embedded matrix
    sparsec run sddmm --format bsr:4x4 --random 3000,2000,0.01 --feat 32 --json
    sparsec build spmm --format ell:8 --feat 64 --target cuda:sm_90a --emit-source
    sparsec ops | sparsec formats

Library errors (ValueError, TypeError) print ``sparsec: error: ...`` and exit 2
(``--debug`` shows the traceback); a failed ``--check`` exits 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np
import scipy.sparse as sp

from . import build, datasets, formats, ops, reference
from .dtypes import dtype_spec

TOLERANCE = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-5}


# ---- shared helpers --------------------------------------------------------------------------
def _format_spec(args):
    """(spec, params) from --format plus --block/--width; params still None need a matrix."""
    module, params = formats.parse_spec(args.format)
    extra = {}
    if args.block is not None:
        extra["block"] = formats.bsr.parse_spec(args.block)["block"]
    if args.width is not None:
        extra["width"] = args.width
    for name in extra:
        if name not in params:
            raise ValueError(f"--{name} does not apply to format {module.NAME}")
    params.update(extra)
    return args.format, params


def _random_matrix(text):
    parts = text.split(",")
    try:
        if len(parts) not in (3, 4):
            raise ValueError
        rows, cols, density = int(parts[0]), int(parts[1]), float(parts[2])
        seed = int(parts[3]) if len(parts) == 4 else 0
        if rows < 1 or cols < 1 or not 0.0 <= density <= 1.0 or seed < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"--random should be ROWS,COLS,DENSITY[,SEED] with positive sizes and a density "
                         f"in [0, 1] (e.g. 3000,2000,0.01), got {text!r}") from None
    # a Generator samples positions directly; an int seed makes scipy permute all rows*cols slots
    m = sp.random(rows, cols, density, format="csr", dtype=np.float32, random_state=np.random.default_rng(seed))
    return m, seed


def _matrix(args):
    """(scipy matrix, seed, source description) from --matrix, --random or the embedded default."""
    if args.matrix is not None:
        return datasets.load_npz(args.matrix), 0, args.matrix
    if args.random is not None:
        m, seed = _random_matrix(args.random)
        return m, seed, f"random {args.random}"
    return datasets.default_matrix(), 0, f"embedded {datasets.DEFAULT_MATRIX}"


def _dense_inputs(kernel, A, seed):
    rng = np.random.default_rng(seed + 1)
    sizes = {"rows": A.shape[0], "cols": A.shape[1], "n0": A.root_extent()}
    return [rng.standard_normal(tuple(sizes[d] if isinstance(d, str) else d for d in p.shape)).astype(kernel.dtype)
            for p in kernel.inputs]


def _device_name(target):
    if target.kind == "llvm":
        return "cpu"
    return str(getattr(target.device(), "device_name", None) or "cuda")


def _jsonable(v):
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)


# ---- subcommands -----------------------------------------------------------------------------
def cmd_run(args):
    dtype = dtype_spec(args.dtype).name
    spec, params = _format_spec(args)
    matrix, seed, source = _matrix(args)
    A = formats.convert(matrix, spec, dtype=dtype, **params)
    stats = formats.module_for(A.format).stats(A)
    kernel = build.compile(args.op, A, target=args.target, feat=args.feat)
    ran = kernel.target.can_run()
    err = run_ms = None
    if ran:
        dense = _dense_inputs(kernel, A, seed)
        if args.check:
            out = kernel(A, *dense, poison=True)
            err = reference.max_rel_err(out, reference.REFERENCES[kernel.op_name](A, *dense))
        n = 5 if kernel.target.kind == "llvm" else 20
        run_ms = kernel.time(A, *dense, number=n, repeat=5)["median_ms"]
    tol = TOLERANCE[dtype]
    result = {
        "op": kernel.op_name, "format": A.format.spec, "target": kernel.target.name, "dtype": dtype,
        "matrix": source, "rows": stats["rows"], "cols": stats["cols"], "nnz": stats["nnz"],
        "stored": stats["stored"], "padding_ratio": stats["padding_ratio"], "feat": args.feat,
        "ran": ran, "max_rel_err": err, "tolerance": tol if args.check else None,
        "compile_s": kernel.compile_s, "conversion_s": A.conversion_s, "run_ms": run_ms,
        "knobs": kernel.knobs, "device": _device_name(kernel.target) if ran else None,
    }
    if args.json:
        print(json.dumps({k: _jsonable(v) for k, v in result.items()}, default=str))
    else:
        _print_summary(result, args.check)
    if err is not None and not err <= tol:
        print(f"sparsec: check failed: max_rel_err {err:.3g} > {tol:g}", file=sys.stderr)
        return 1
    return 0


def _print_summary(r, check):
    lines = [
        ("op", f"{r['op']} ({r['dtype']}, feat {r['feat']})"),
        ("matrix", f"{r['matrix']}: {r['rows']} x {r['cols']}, nnz {r['nnz']}"),
        ("format", f"{r['format']}: stored {r['stored']}, padding {r['padding_ratio']:.2f}x, "
                   f"converted in {r['conversion_s'] * 1e3:.1f} ms"),
        ("target", f"{r['target']}" + (f" on {r['device']}" if r["ran"] else " (compiled only: cannot run here)")),
        ("compile", f"{r['compile_s']:.2f} s, knobs {r['knobs']}"),
    ]
    if r["ran"]:
        lines.append(("run", f"{r['run_ms']:.4f} ms (median)"))
    if check and r["ran"]:
        ok = r["max_rel_err"] <= r["tolerance"]
        lines.append(("check", f"max_rel_err {r['max_rel_err']:.3g} (tol {r['tolerance']:g}) "
                               f"{'ok' if ok else 'FAILED'}"))
    for k, v in lines:
        print(f"{k:<8} {v}")


def cmd_build(args):
    if args.output is None and not args.emit_source:
        raise ValueError("build needs -o FILE or --emit-source")
    if args.output is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise ValueError(f"the directory of -o {args.output!r} does not exist")
    dtype = dtype_spec(args.dtype).name
    spec, params = _format_spec(args)
    if args.matrix is None and args.random is None and None not in params.values():
        fmt = formats.make_format(spec, **params)  # fully given: no matrix needed
    else:
        fmt = formats.convert(_matrix(args)[0], spec, dtype=dtype, **params)
    kernel = build.compile(args.op, fmt, target=args.target, dtype=dtype, feat=args.feat)
    if args.emit_source:
        print(kernel.source())
    if args.output is not None:
        kernel.export(args.output)
        print(f"{kernel.op_name} {kernel.format_spec} {kernel.target.name} {kernel.dtype} feat={args.feat} "
              f"knobs=default {kernel.knobs} compile_s={kernel.compile_s:.2f} -> {args.output} "
              f"({os.path.getsize(args.output)} bytes)", file=sys.stderr if args.emit_source else sys.stdout)
    return 0


def cmd_ops(args):
    for name in sorted(ops.LIBRARY):
        print(f"{name:<8} {ops.get(name).doc}")
    return 0


def cmd_formats(args):
    for name, desc in formats.families():
        print(f"{name:<8} {desc}")
    return 0


# ---- parser ----------------------------------------------------------------------------------
def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"should be a positive integer, got {text!r}")
    return v


def _kernel_options(p):
    p.add_argument("op", help="library operator (see 'sparsec ops')")
    p.add_argument("--format", required=True, metavar="FMT", help="family or spec: csr, bsr:4x4, ell, ell:8")
    p.add_argument("--block", metavar="RxC", help="BSR block shape, e.g. 4x4")
    p.add_argument("--width", type=_positive_int, metavar="W", help="ELL width (slots per row)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--matrix", metavar="FILE.npz", help="scipy.sparse.save_npz file (default: embedded matrix)")
    src.add_argument("--random", metavar="ROWS,COLS,DENSITY[,SEED]", help="scipy.sparse.random matrix, seed 0")
    p.add_argument("--feat", type=_positive_int, default=64, metavar="N", help="dense feature width (default 64)")
    p.add_argument("--target", default="llvm", help="llvm, cuda, cuda:sm_80 or cuda:sm_90a (default llvm)")
    p.add_argument("--dtype", default="float32", help="value dtype: float32, float64, float16 (default float32)")


def make_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = argparse.ArgumentParser(prog="sparsec", description="Sparse tensor compiler on Apache TVM.",
                                     parents=[common])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("run", parents=[common], help="compile, run and optionally check an operator")
    _kernel_options(p)
    p.add_argument("--check", action="store_true", help="compare with the float64 scipy reference")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("build", parents=[common], help="compile an operator to a module or source")
    _kernel_options(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the compiled module (export_library)")
    p.add_argument("--emit-source", action="store_true", help="print the CUDA / LLVM IR source")
    p.set_defaults(func=cmd_build)
    sub.add_parser("ops", parents=[common], help="list library operators").set_defaults(func=cmd_ops)
    sub.add_parser("formats", parents=[common], help="list format families").set_defaults(func=cmd_formats)
    return parser


def main(argv=None) -> int:
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as e:  # usage errors (2) and --help (0) return rather than exit
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 2
    try:
        return args.func(args)
    except BrokenPipeError:  # stdout closed early (sparsec build --emit-source | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError) as e:
        if getattr(args, "debug", False):  # given before or after the subcommand
            raise
        print(f"sparsec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
