"""``sparsec bench``: the parser; the command itself is ``sparsec.bench.command`` (torch and
the peers load only when it runs)."""
from __future__ import annotations

import argparse

from .common import count, fraction, positive_int


def add_parser(sub, common):
    p = sub.add_parser("bench", parents=[common], help="time sparsec against cuSPARSE, torch BSR, cuBLAS and CuPy "
                                                       "on a GPU")
    p.add_argument("op", help="library operator: spmm or sddmm")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--matrix", metavar="FILE.npz", help="scipy.sparse.save_npz file")
    src.add_argument("--suite", choices=("graphs", "blocks"),
                     help="a suite of sparsec.bench.suites (data in $SPARSEC_DATA_DIR, default ~/.cache/sparsec)")
    p.add_argument("--feat", type=positive_int, nargs="+", metavar="N",
                   help="dense widths (default: graphs 32..512, blocks 512..8192, --matrix 64)")
    p.add_argument("--format", metavar="SPEC", help="sparsec format (default: the rule's per matrix and width; blocks: bsr:BxB); "
                                                  "'auto': the tuning logs' pick for the matrix, width and target, "
                                                  "as convert(m, 'auto') makes it")
    p.add_argument("--dtype", help="float32 (default), float16 (default for blocks) or float64")
    p.add_argument("--sparsity", type=fraction, nargs="+", metavar="S", help="blocks: block sparsities to keep")
    p.add_argument("--block", type=positive_int, nargs="+", metavar="B",
                   help="blocks: block sizes to keep; --matrix: BSR with BxB blocks")
    p.add_argument("--knobs", metavar="JSON", help='schedule knobs, e.g. \'{"rows_per_block": 4}\'')
    p.add_argument("--json", metavar="FILE", help="write the records")
    p.add_argument("--markdown", metavar="FILE", help="write the summary table")
    p.add_argument("--plot", metavar="FILE", help="write the speedup plot (PNG, needs matplotlib)")
    p.add_argument("--quick", action="store_true", help="a few cases per suite (smoke run)")
    p.add_argument("--repeat", type=positive_int, default=50, metavar="N", help="most timed calls per contestant")
    p.add_argument("--max-rmat", type=count, metavar="NNZ", help="leave out R-MAT graphs with more non-zeros (4M, 0)")
    p.add_argument("--target", default="cuda", help=argparse.SUPPRESS)  # llvm: CPU dry run (tests)
    p.set_defaults(func=cmd_bench)
    return p


def cmd_bench(args):
    from ..bench.command import bench_command

    return bench_command(args)
