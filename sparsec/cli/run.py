"""``sparsec run``: compile an operator for a matrix, run it, optionally check it."""
from __future__ import annotations

import sys
import time

from .common import CHECK_FAILED, CHECK_NOT_RUN, KNOB_OPTIONS, OK, add_kernel_options, dumps, format_spec


def add_parser(sub, common):
    p = sub.add_parser("run", parents=[common], help="compile, run and optionally check an operator")
    add_kernel_options(p)
    p.add_argument("--check", action="store_true",
                   help="compare with the float64 reference on the matrix's logical pattern (its coordinates, "
                        "never a format's padding; exit 1 when it fails, 3 when it cannot run: a CUDA target "
                        "without a GPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object (non-finite numbers as null)")
    p.set_defaults(func=cmd_run)
    return p


def cmd_run(args):
    from .. import api, reference, workload  # the compiler: only the commands that compile load it
    from .. import inspect as sinspect

    matrix, seed, source = workload.load_matrix(args)
    if args.format == AUTO:
        spec, params, dtype, knobs, chosen = auto_format(args, matrix)
    else:
        (spec, params, dtype), knobs, chosen = format_spec(args), None, None
    A, info = workload.convert(matrix, spec, params, dtype)
    desc = sinspect.describe(A)
    kernel = api.compile(args.op, A, target=args.target, dtype=dtype, feat=args.feat, knobs=knobs)
    if chosen is not None and isinstance(knobs, dict):
        kernel.extra["knobs_source"] = chosen  # the pick's own knobs
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
        "ran": ran, "checked": bool(args.check and ran), "max_rel_err": err, "max_abs_err": abs_err,
        "tolerance": tol if args.check else None, "exact": exact,
        "compile_s": kernel.compile_s, "conversion_s": A.conversion_s, "run_ms": run_ms,
        "knobs": kernel.knobs, "knobs_source": kernel.extra.get("knobs_source"), "format_source": chosen,
        "device": device_name(kernel.target) if ran else None, **info,
    }
    if args.json:
        print(dumps(result))
    else:
        print_summary(result, args.check)
    if args.check and not ran:
        print(f"sparsec: check not run: {kernel.target.name} kernels cannot run here (no GPU); the kernel was "
              "compiled only", file=sys.stderr)
        return CHECK_NOT_RUN
    if err is not None and not (abs_err == 0.0 if exact else err <= tol):
        what = f"max_abs_err {abs_err:g} (integer kernels must be exact)" if exact else \
            f"max_rel_err {err:.3g} > {tol:g}"
        print(f"sparsec: check failed: {what}", file=sys.stderr)
        return CHECK_FAILED
    return OK


AUTO = "auto"
AUTO_OPS = ("spmm", "sddmm")  # what the tuner's spaces cover
AUTO_DTYPES = ("float32", "float64", "float16")
PICKED_BY = {"record": "the best tuning record for this matrix", "model": "the cost model's pick",
             "default": "the rule-based default: no tuning log or model for this target"}


def auto_format(args, matrix):
    """(spec, params, dtype, knobs, source) for ``--format auto``: the tuning logs' pick for
    this matrix, width and target (``tune.apply.tuned_config``: the best record for the
    matrix, else the cost model's zero-shot pick among the configurations that won on the
    logged matrices, else sparsec's rule-based default format), its format knobs and schedule
    knobs. Format knob options do not apply: the pick sets them."""
    from ..dtypes import dtype_spec
    from ..targets import parse_target
    from ..tune.apply import tuned_config

    given = [o for o in ("block", "tile", *KNOB_OPTIONS) if getattr(args, o, None) is not None]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} does not apply to --format auto (the pick sets the "
                         "format's knobs); name a format to set it")
    dtype = "float32" if args.dtype is None else dtype_spec(args.dtype).name
    if args.op not in AUTO_OPS:
        raise ValueError(f"--format auto picks formats for {' and '.join(AUTO_OPS)} (the operators the tuner "
                         f"measures); name a format for {args.op}")
    if dtype not in AUTO_DTYPES:
        raise ValueError(f"--format auto picks among float formats ({', '.join(AUTO_DTYPES)}); for --dtype {dtype} "
                         f"name a format (e.g. srbcrs for int8)")
    cand, source = tuned_config(args.op, matrix, args.feat, parse_target(args.target).name, dtype)
    knobs = dict(cand["schedule_knobs"]) or "default"
    return cand["format"], dict(cand["format_knobs"]), dtype, knobs, source


def device_name(target):
    if target.kind == "llvm":
        return "cpu"
    return str(getattr(target.device(), "device_name", None) or "cuda")


def print_summary(r, check):
    fmt = ((f"auto ({PICKED_BY[r['format_source']]}): " if r.get("format_source") else "")
           + f"{r['format']}: stored {r['stored']}, padding {r['padding_ratio']:.2f}x, {r['bytes']} bytes"
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
        ("compile", f"{r['compile_s']:.2f} s, knobs {r['knobs']}"
                    + (f" ({r['knobs_source']})" if r.get("knobs_source") else "")),
    ]
    if r["ran"]:
        lines.append(("run", f"{r['run_ms']:.4f} ms (median)"))
    if check and not r["ran"]:
        lines.append(("check", "NOT RUN (no GPU here)"))
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
