"""The ``sparsec`` command: a thin shell over the Python API.

    sparsec run spmm --format csr --feat 64 --target llvm --check      # embedded matrix
    sparsec run sddmm --format bsr:4x4 --random 3000,2000,0.01 --feat 32 --json
    sparsec build spmm --format ell:8 --feat 64 --target cuda:sm_90a --emit-source
    sparsec build spmm --format csr --feat 64 --target cuda:sm_90a --arch sm_80 sm_90a -o spmm.so
    sparsec inspect spmm.so [--json]                  # the module's metadata, checksum verified
    sparsec run spmm --format hyb --col-parts 4 --buckets 1,2,4,8 --random 20000,20000,0.001 --check
    sparsec run spmm --format nm --n 2 --m 4 --random 3000,2000,0.01 --check      # pruned to 2:4
    sparsec run sddmm --format srbcrs --vec 8 --dtype int8 --random 3000,2000,0.01 --check  # quantized
    sparsec ops | sparsec formats
    sparsec formats --describe nm [--n 2 --m 4] [--random 300,200,0.02 [--json]]
    sparsec bench spmm --suite graphs [--quick] [--json FILE --markdown FILE --plot FILE]   # GPU host

nm matrices are pruned by magnitude to N:M first, and srbcrs int8/int4 matrices are
quantized (symmetric, per tensor) unless their values already are integers in range;
the summary and JSON say so (``pruned``, ``quantized``, ``scale``). Integer kernels take
random integer dense inputs in [-8, 7] and ``--check`` wants them exact.

Library errors (ValueError, TypeError) print ``sparsec: error: ...`` and exit 2
(``--debug`` shows the traceback); a failed ``--check`` exits 1.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from . import formats, ops, reference, workload
from . import inspect as sinspect
from .dtypes import dtype_spec


# CLI option (attribute) -> (format knob, families that take it); --block and --dtype are special
KNOB_OPTIONS = {
    "width": ("width", ("ell",)),
    "col_parts": ("col_parts", ("hyb",)),
    "buckets": ("buckets", ("hyb",)),
    "n": ("n", ("nm",)),
    "m": ("m", ("nm",)),
    "vec": ("vec", ("nm", "srbcrs")),
    "block_fill": ("block_fill", ("bsr+csr",)),
}


# ---- shared helpers --------------------------------------------------------------------------
def _format_spec(args, declare_only=False):
    """(spec, params, dtype) from --format plus the knob options and --dtype; params still
    None need a matrix (or are errors the family reports). ``declare_only`` (describing a
    family) leaves unset what describe_format fills with an example."""
    module, params = formats.parse_spec(args.format)
    name = module.NAME
    extra = {}
    if args.block is not None:
        if name not in ("bsr", "bsr+csr"):
            raise ValueError(f"--block does not apply to format {name} (it is for bsr and bsr+csr)")
        extra["block"] = formats.bsr.parse_spec(args.block.lower().replace("/", "x"))["block"]
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
            params["dtype"] = _dtype(args, name, params)
        elif dtype is not None and dtype != "float32":
            _dtype(args, name, params)  # integer dtypes: the srbcrs error
        return args.format, params, dtype
    dtype = _dtype(args, name, params)
    if name == "srbcrs":
        params["dtype"] = dtype
    if name == "nm" and (params.get("n") is None or params.get("m") is None):
        raise ValueError("nm needs --n N and --m M (e.g. --format nm --n 2 --m 4), or a spec like nm:2:4")
    return args.format, params, dtype


def _dtype(args, family, params):
    """The kernel dtype: --dtype, else (srbcrs) the spec's precision, else float32."""
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


def _buckets(text):
    try:
        vals = tuple(int(t) for t in text.replace("/", ",").split(",") if t.strip())
    except ValueError:
        vals = ()
    if not vals or any(v < 1 or v & (v - 1) for v in vals):
        raise argparse.ArgumentTypeError(f"should be powers of two separated by commas, like 1,2,4,8, got {text!r}")
    return vals


def _fraction(text):
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"should be a number >= 0 (e.g. 0.5), got {text!r}")
    return v


def _device_name(target):
    if target.kind == "llvm":
        return "cpu"
    return str(getattr(target.device(), "device_name", None) or "cuda")


def _jsonable(v):
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)


# ---- subcommands -----------------------------------------------------------------------------
def cmd_run(args):
    spec, params, dtype = _format_spec(args)
    matrix, seed, source = workload.load_matrix(args)
    A, info = workload.convert(matrix, spec, params, dtype)
    desc = sinspect.describe(A)
    from . import build  # the compiler: not needed by 'inspect' on a runtime-only host

    kernel = build.compile(args.op, A, target=args.target, dtype=dtype, feat=args.feat)
    exact = kernel.dtypes.exact
    ran = kernel.target.can_run()
    err = abs_err = run_ms = None
    if ran:
        dense = workload.dense_inputs(kernel, A, seed)
        t0 = time.perf_counter()
        out = kernel(A, *dense, poison=True)
        once = time.perf_counter() - t0
        if args.check:
            err, abs_err = workload.errors(out, reference.REFERENCES[kernel.op_name](A, *dense), exact)
        del out
        n = 5 if kernel.target.kind == "llvm" else 20
        n = max(1, min(n, int(0.2 / max(once, 1e-9))))  # slow kernels (large padded formats): fewer runs
        run_ms = kernel.time(A, *dense, number=n, repeat=5 if once < 0.5 else 3)["median_ms"]
    tol = reference.TOLERANCE[dtype]
    result = {
        "op": kernel.op_name, "format": A.format.spec, "target": kernel.target.name, "dtype": dtype,
        "matrix": source, "rows": desc["shape"][0], "cols": desc["shape"][1], "nnz": desc["nnz"],
        "stored": desc["stored"], "padding_ratio": desc["padding_ratio"], "bytes": desc["bytes"],
        "parts": len(desc["parts"]), "feat": args.feat,
        "ran": ran, "max_rel_err": err, "max_abs_err": abs_err, "tolerance": tol if args.check else None,
        "exact": exact,
        "compile_s": kernel.compile_s, "conversion_s": A.conversion_s, "run_ms": run_ms,
        "knobs": kernel.knobs, "device": _device_name(kernel.target) if ran else None, **info,
    }
    if args.json:
        print(json.dumps({k: _jsonable(v) for k, v in result.items()}, default=str))
    else:
        _print_summary(result, args.check)
    if err is not None and not (abs_err == 0.0 if exact else err <= tol):
        what = f"max_abs_err {abs_err:g} (integer kernels must be exact)" if exact else \
            f"max_rel_err {err:.3g} > {tol:g}"
        print(f"sparsec: check failed: {what}", file=sys.stderr)
        return 1
    return 0


def _print_summary(r, check):
    fmt = (f"{r['format']}: stored {r['stored']}, padding {r['padding_ratio']:.2f}x, {r['bytes']} bytes"
           + (f", {r['parts']} parts" if r["parts"] > 1 else "")
           + f", converted in {r['conversion_s'] * 1e3:.1f} ms")
    matrix = f"{r['matrix']}: {r['rows']} x {r['cols']}, nnz {r['nnz']}"
    if r["pruned"]:
        matrix += f" (pruned by magnitude from {r['source_nnz']} entries)"
    if r["quantized"]:
        matrix += f" (quantized to {r['dtype']}, scale {r['scale']:.4g})"
    lines = [
        ("op", f"{r['op']} ({r['dtype']}, feat {r['feat']})"),
        ("matrix", matrix),
        ("format", fmt),
        ("target", f"{r['target']}" + (f" on {r['device']}" if r["ran"] else " (compiled only: cannot run here)")),
        ("compile", f"{r['compile_s']:.2f} s, knobs {r['knobs']}"),
    ]
    if r["ran"]:
        lines.append(("run", f"{r['run_ms']:.4f} ms (median)"))
    if check and r["ran"]:
        if r["exact"]:
            ok = r["max_abs_err"] == 0.0
            lines.append(("check", f"max_abs_err {r['max_abs_err']:g}, max_rel_err {r['max_rel_err']:.3g} "
                                   f"(exact) {'ok' if ok else 'FAILED'}"))
        else:
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
    spec, params, dtype = _format_spec(args)
    if args.matrix is None and args.random is None and None not in params.values():
        fmt = formats.make_format(spec, **params)  # fully given: no matrix needed
    else:
        fmt = workload.convert(workload.load_matrix(args)[0], spec, params, dtype)[0]
    from . import build

    kernel = build.compile(args.op, fmt, target=args.target, dtype=dtype, feat=args.feat)
    if args.emit_source:
        print(kernel.source())
    if args.arch and args.output is None:
        raise ValueError("--arch applies to the exported module: give -o FILE")
    if args.output is not None:
        meta = kernel.export(args.output, archs=args.arch)
        archs = f" archs={','.join(meta['archs'])}" if meta["archs"] else ""
        print(f"{kernel.op_name} {kernel.format_spec} {kernel.target.name} {kernel.dtype} feat={args.feat} "
              f"knobs=default {kernel.knobs} compile_s={kernel.compile_s:.2f}{archs} -> {args.output} "
              f"({os.path.getsize(args.output)} bytes)", file=sys.stderr if args.emit_source else sys.stdout)
    return 0


def cmd_inspect(args):
    from .module_file import read_metadata

    meta, lib_len = read_metadata(args.file)
    if args.json:
        print(json.dumps(meta, indent=1, sort_keys=True))
        return 0
    rows = [("operator", meta["op"]), ("format", meta["format"]), ("dtype", meta["dtype"]),
            ("target", meta["target"]), ("archs", ", ".join(meta["archs"]) or "-"),
            ("knobs", json.dumps(meta["knobs"], sort_keys=True)),
            ("parameters", ", ".join(f"{p['name']}:{p['role']}:{p['dtype']}" for p in meta["params"])),
            ("sparsec", meta["sparsec_version"]), ("TVM", meta["tvm_version"]),
            ("module format", meta["format_version"]), ("library", f"{lib_len} bytes, sha256 {meta['library_sha256']}")]
    for k, v in rows:
        print(f"{k:<14} {v}")
    return 0


def cmd_ops(args):
    for name in sorted(ops.LIBRARY):
        print(f"{name:<8} {ops.get(name).doc}")
    return 0


def cmd_formats(args):
    if args.describe is None:
        given = [o for o in ("matrix", "random", "block", "dtype", *KNOB_OPTIONS) if getattr(args, o) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --describe FMT")
        if args.json:
            print(json.dumps([{"name": n, "description": d} for n, d in formats.families()]))
            return 0
        for name, desc in formats.families():
            print(f"{name:<8} {desc}")
        return 0
    args.format = args.describe
    if args.matrix is None and args.random is None:
        _, params, _ = _format_spec(args, declare_only=True)
        d = sinspect.describe_format(args.describe, **{k: v for k, v in params.items() if v is not None})
        print(json.dumps(d) if args.json else sinspect.format_text(d))
        return 0
    spec, params, dtype = _format_spec(args)
    matrix, _, source = workload.load_matrix(args)
    A, info = workload.convert(matrix, spec, params, dtype)
    d = sinspect.describe(A)
    d.update(matrix=source, **info)
    if args.json:
        print(json.dumps({k: _jsonable(v) for k, v in d.items()}))
        return 0
    print(sinspect.instance_text(d))
    notes = []
    if info["pruned"]:
        notes.append(f"pruned by magnitude from {info['source_nnz']} entries")
    if info["quantized"]:
        notes.append(f"quantized to {dtype}, scale {info['scale']:.4g}")
    print(f"{'source':<9} {source}" + (f" ({'; '.join(notes)})" if notes else ""))
    return 0


def cmd_bench(args):
    from .bench.command import bench_command  # torch and the peers load only for this command

    return bench_command(args)


# ---- parser ----------------------------------------------------------------------------------
def _positive_int(text):
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"should be a positive integer, got {text!r}")
    return v


def _format_options(p):
    g = p.add_argument_group("format knobs")
    g.add_argument("--block", metavar="RxC", help="bsr / bsr+csr block shape, e.g. 4x4")
    g.add_argument("--width", type=_positive_int, metavar="W", help="ELL width (slots per row)")
    g.add_argument("--col-parts", type=_positive_int, metavar="P", help="hyb column ranges (default automatic)")
    g.add_argument("--buckets", type=_buckets, metavar="1,2,4,...", help="hyb bucket widths (default automatic)")
    g.add_argument("--n", type=_positive_int, metavar="N", help="nm: slots kept per window")
    g.add_argument("--m", type=_positive_int, metavar="M", help="nm: window width in columns")
    g.add_argument("--vec", type=_positive_int, metavar="V", help="nm (1..32) / srbcrs (2, 4, 8) row vector size")
    g.add_argument("--block-fill", type=_fraction, metavar="F", help="bsr+csr: fill at which a block goes to BSR")
    g.add_argument("--dtype", default=None, help="value dtype: float32 (default), float64, float16; "
                                                 "srbcrs also int8, int4")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--matrix", metavar="FILE.npz", help="scipy.sparse.save_npz file (default: embedded matrix)")
    src.add_argument("--random", metavar="ROWS,COLS,DENSITY[,SEED]", help="scipy.sparse.random matrix, seed 0")


def _kernel_options(p):
    p.add_argument("op", help="library operator (see 'sparsec ops')")
    p.add_argument("--format", required=True, metavar="FMT",
                   help="family or spec: csr, bsr:4x4, ell, ell:8, hyb, nm, srbcrs, bsr+csr (see 'sparsec formats')")
    _format_options(p)
    p.add_argument("--feat", type=_positive_int, default=64, metavar="N", help="dense feature width (default 64)")
    p.add_argument("--target", default="llvm", help="llvm, cuda, cuda:sm_80 or cuda:sm_90a (default llvm)")


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
    p.add_argument("-o", "--output", metavar="FILE", help="write the module: loads with TVM's runtime alone "
                                                           "(sparsec.load), CUDA compiled ahead of time")
    p.add_argument("--arch", nargs="+", metavar="SM", help="CUDA: GPU archs whose SASS the module carries "
                                                         "(default: the target's), e.g. sm_80 sm_90a")
    p.add_argument("--emit-source", action="store_true", help="print the CUDA / LLVM IR source")
    p.set_defaults(func=cmd_build)
    p = sub.add_parser("inspect", parents=[common], help="print an exported module's metadata (checksum verified)")
    p.add_argument("file", help="a module written by 'sparsec build -o' or Kernel.export")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p.set_defaults(func=cmd_inspect)
    sub.add_parser("ops", parents=[common], help="list library operators").set_defaults(func=cmd_ops)
    p = sub.add_parser("formats", parents=[common], help="list format families, or describe one")
    p.add_argument("--describe", metavar="FMT", help="a family or spec: its axis chain and knobs; with --matrix "
                                                     "or --random, the converted matrix")
    _format_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_formats)
    _bench_parser(sub, common)
    from .tune.cli import add_parser as add_tune_parser

    add_tune_parser(sub, common, _positive_int, _count)
    return parser


def _bench_parser(sub, common):
    p = sub.add_parser("bench", parents=[common], help="time sparsec against cuSPARSE, torch BSR, cuBLAS and CuPy "
                                                       "on a GPU")
    p.add_argument("op", help="library operator: spmm or sddmm")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--matrix", metavar="FILE.npz", help="scipy.sparse.save_npz file")
    src.add_argument("--suite", choices=("graphs", "blocks"), help="benchmarks/data/suites.py suite")
    p.add_argument("--feat", type=_positive_int, nargs="+", metavar="N",
                   help="dense widths (default: graphs 32..512, blocks 512..8192, --matrix 64)")
    p.add_argument("--format", metavar="SPEC", help="sparsec format (default: csr; blocks: bsr:BxB)")
    p.add_argument("--dtype", help="float32 (default), float16 (default for blocks) or float64")
    p.add_argument("--sparsity", type=_fraction, nargs="+", metavar="S", help="blocks: block sparsities to keep")
    p.add_argument("--block", type=_positive_int, nargs="+", metavar="B",
                   help="blocks: block sizes to keep; --matrix: BSR with BxB blocks")
    p.add_argument("--knobs", metavar="JSON", help='schedule knobs, e.g. \'{"rows_per_block": 4}\'')
    p.add_argument("--json", metavar="FILE", help="write the records")
    p.add_argument("--markdown", metavar="FILE", help="write the summary table")
    p.add_argument("--plot", metavar="FILE", help="write the speedup plot (PNG, needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="a few cases per suite (smoke run)")
    p.add_argument("--repeat", type=_positive_int, default=50, metavar="N", help="most timed calls per contestant")
    p.add_argument("--max-rmat", type=_count, metavar="NNZ", help="leave out R-MAT graphs with more non-zeros (4M, 0)")
    p.add_argument("--target", default="cuda", help=argparse.SUPPRESS)  # llvm: CPU dry run (tests)
    p.set_defaults(func=cmd_bench)


def _count(text):
    from .bench.cases import parse_count

    try:
        return parse_count(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        if getattr(args, "debug", False):  # given before or after the subcommand
            raise
        print(f"sparsec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
