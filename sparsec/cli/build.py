"""``sparsec build``: compile an operator to an exported module or print its source."""
from __future__ import annotations

import os
import sys

from .common import OK, add_kernel_options, format_spec


def add_parser(sub, common):
    p = sub.add_parser("build", parents=[common], help="compile an operator to a module or source")
    add_kernel_options(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the module: loads with TVM's runtime alone "
                                                           "(sparsec.load), CUDA compiled ahead of time")
    p.add_argument("--arch", nargs="+", metavar="SM", help="CUDA: GPU archs whose SASS the module carries "
                                                         "(default: the target's), e.g. sm_80 sm_90a")
    p.add_argument("--emit-source", action="store_true", help="print the CUDA / LLVM IR source")
    p.set_defaults(func=cmd_build)
    return p


def cmd_build(args):
    from .. import build, formats, workload  # the compiler: only the commands that compile load it

    if args.output is None and not args.emit_source:
        raise ValueError("build needs -o FILE or --emit-source")
    if args.output is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        raise ValueError(f"the directory of -o {args.output!r} does not exist")
    if args.arch and args.output is None:
        raise ValueError("--arch applies to the exported module: give -o FILE")
    spec, params, dtype = format_spec(args)
    if args.matrix is None and args.random is None and None not in params.values():
        fmt = formats.make_format(spec, **params)  # fully given: no matrix needed
    else:
        fmt = workload.convert(workload.load_matrix(args)[0], spec, params, dtype)[0]
    kernel = build.compile(args.op, fmt, target=args.target, dtype=dtype, feat=args.feat)
    if args.emit_source:
        print(kernel.source())
    if args.output is not None:
        meta = kernel.export(args.output, archs=args.arch)
        archs = f" archs={','.join(meta['archs'])}" if meta["archs"] else ""
        print(f"{kernel.op_name} {kernel.format_spec} {kernel.target.name} {kernel.dtype} feat={args.feat} "
              f"knobs=default {kernel.knobs} compile_s={kernel.compile_s:.2f}{archs} -> {args.output} "
              f"({os.path.getsize(args.output)} bytes)", file=sys.stderr if args.emit_source else sys.stdout)
    return OK
