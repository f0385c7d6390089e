"""``sparsec bench``: parsed arguments -> cases -> one benchmark session -> files.

The markdown summary goes to stdout (and to ``--markdown FILE``); ``--json FILE`` writes
the records, ``--plot FILE`` the speedup plot. Exit status 1 when any case failed its
check or could not compile, 0 otherwise; bad arguments and a missing GPU or missing suite
data are ValueErrors (``sparsec: error: ...``, exit 2).
"""
from __future__ import annotations

import sys

from . import report
from .cases import build_cases, parse_knobs
from .run import Bench


def bench_command(args) -> int:
    knobs = parse_knobs(args.knobs)
    bench = Bench(args.target, max_reps=args.repeat)  # first: no GPU is the clearest error
    groups = build_cases(args.op, matrix=args.matrix, suite=args.suite, feats=args.feat, spec=args.format,
                         dtype=args.dtype, sparsities=args.sparsity, blocks=args.block, knobs=knobs,
                         quick=args.quick, max_rmat=args.max_rmat, target=args.target)
    bench.run(groups)
    return write_outputs(bench, json_path=args.json, markdown_path=args.markdown, plot_path=args.plot)


def write_outputs(bench: Bench, *, json_path=None, markdown_path=None, plot_path=None, echo=True) -> int:
    """Write the requested files, print the summary, and return the exit status."""
    result = bench.result()
    if json_path:
        report.write_json(result, json_path)
    if markdown_path:
        report.write_markdown(result, markdown_path)
    if plot_path and not report.plot_speedups(result, plot_path):
        print(f"sparsec bench: no plot written to {plot_path} (matplotlib is not importable, or no case has a "
              "speedup)", file=sys.stderr)
    if echo:
        print(report.markdown(result))
    failed = bench.failed()
    if failed:
        print(f"sparsec bench: {len(failed)} of {len(bench.records)} cases failed (see 'Failed cases')",
              file=sys.stderr)
        return 1
    return 0
