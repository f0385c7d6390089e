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
    sparsec tune spmm --random 3000,2000,0.01 --target llvm --trials 16

nm matrices are pruned by magnitude to N:M first, and srbcrs int8/int4 matrices are
quantized (symmetric, per tensor) unless their values already are integers in range;
the summary and JSON say so (``pruned``, ``quantized``, ``scale``). Integer kernels take
random integer dense inputs in [-8, 7] and ``--check`` wants them exact. A matrix file is
read with the checks of ``sparsec.formats.convert``: what the API refuses, the CLI refuses.

Exit status: 0 ok; 1 a ``--check`` failed; 2 bad input (usage, a bad matrix file, library
errors: ``sparsec: error: ...``, ``--debug`` shows the traceback); 3 a ``--check`` that could
not run (a CUDA target without a GPU: the kernel was compiled only).

Each subcommand lives in its own module and imports the compiler (TVM) only when it runs,
so ``sparsec --help``, ``ops``, ``formats`` and ``inspect`` start without it.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import bench, build, info, run, tune
from .common import BAD_INPUT, OK

EPILOG = ("exit status: 0 ok, 1 a --check failed, 2 bad input (usage, matrix file, library error), "
          "3 a --check that could not run (CUDA target without a GPU)")


def make_parser():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = argparse.ArgumentParser(prog="sparsec", description="Sparse tensor compiler on Apache TVM.",
                                     parents=[common], epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.add_parser(sub, common)
    build.add_parser(sub, common)
    info.add_parsers(sub, common)
    bench.add_parser(sub, common)
    tune.add_parser(sub, common)
    return parser


def main(argv=None) -> int:
    try:
        args = make_parser().parse_args(argv)
    except SystemExit as e:  # usage errors (2) and --help (0) return rather than exit
        return OK if e.code is None else e.code if isinstance(e.code, int) else BAD_INPUT
    try:
        return args.func(args)
    except BrokenPipeError:  # stdout closed early (sparsec build --emit-source | head)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as e:
        if getattr(args, "debug", False):  # given before or after the subcommand
            raise
        print(f"sparsec: error: {e}", file=sys.stderr)
        return BAD_INPUT
