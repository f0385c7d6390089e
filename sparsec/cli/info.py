"""The commands that describe without compiling: ``sparsec ops``, ``sparsec formats`` and
``sparsec inspect`` (a module file's metadata, read without TVM)."""
from __future__ import annotations

import json

from .common import KNOB_OPTIONS, OK, add_format_options, dumps, format_spec


def add_parsers(sub, common):
    p = sub.add_parser("inspect", parents=[common], help="print an exported module's metadata (checksum verified)")
    p.add_argument("file", help="a module written by 'sparsec build -o' or Kernel.export")
    p.add_argument("--json", action="store_true", help="print the metadata as JSON")
    p.set_defaults(func=cmd_inspect)
    sub.add_parser("ops", parents=[common], help="list library operators").set_defaults(func=cmd_ops)
    p = sub.add_parser("formats", parents=[common], help="list format families, or describe one")
    p.add_argument("--describe", metavar="FMT", help="a family or spec: its axis chain and knobs; with --matrix "
                                                     "or --random, the converted matrix")
    add_format_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_formats)


def cmd_inspect(args):
    from ..module_file import read_metadata

    meta, lib_len = read_metadata(args.file)
    if args.json:
        print(json.dumps(meta, indent=1, sort_keys=True))
        return OK
    rows = [("operator", meta["op"]), ("format", meta["format"]), ("dtype", meta["dtype"]),
            ("target", meta["target"]), ("archs", ", ".join(meta["archs"]) or "-"),
            ("knobs", json.dumps(meta["knobs"], sort_keys=True)),
            ("parameters", ", ".join(f"{p['name']}:{p['role']}:{p['dtype']}" for p in meta["params"])),
            ("sparsec", meta["sparsec_version"]), ("TVM", meta["tvm_version"]),
            ("module format", meta["format_version"]), ("library", f"{lib_len} bytes, sha256 {meta['library_sha256']}")]
    for k, v in rows:
        print(f"{k:<14} {v}")
    return OK


def cmd_ops(args):
    from .. import ops

    for name in sorted(ops.LIBRARY):
        print(f"{name:<8} {ops.get(name).doc}")
    return OK


def cmd_formats(args):
    from .. import formats, workload
    from .. import inspect as sinspect

    if args.describe is None:
        given = [o for o in ("matrix", "random", "block", "tile", "dtype", *KNOB_OPTIONS) if getattr(args, o) is not None]
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --describe FMT")
        if args.json:
            print(json.dumps([{"name": n, "description": d} for n, d in formats.families()]))
            return OK
        for name, desc in formats.families():
            print(f"{name:<8} {desc}")
        return OK
    args.format = args.describe
    if args.matrix is None and args.random is None:
        _, params, _ = format_spec(args, declare_only=True)
        d = sinspect.describe_format(args.describe, **{k: v for k, v in params.items() if v is not None})
        print(dumps(d) if args.json else sinspect.format_text(d))
        return OK
    spec, params, dtype = format_spec(args)
    matrix, _, source = workload.load_matrix(args)
    A, info = workload.convert(matrix, spec, params, dtype)
    d = sinspect.describe(A)
    d.update(matrix=source, **info)
    if args.json:
        print(dumps(d))
        return OK
    print(sinspect.instance_text(d))
    notes = []
    if info["pruned"]:
        notes.append(f"pruned by magnitude from {info['source_nnz']} entries")
    if info["quantized"]:
        notes.append(f"quantized to {dtype}, scale {info['scale']:.4g}")
    print(f"{'source':<9} {source}" + (f" ({'; '.join(notes)})" if notes else ""))
    return OK
