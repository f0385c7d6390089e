"""``sparsec bench``: sparsec's kernels timed against the vendor and framework peers on
the same inputs, in one process, with one timer.

    cases.py       what to run: (op, matrix, format, dtype, feat, knobs) from a file or a suite
    peers.py       cuSPARSE CSR SpMM / SDDMM, torch BSR, dense cuBLAS, CuPy: setup + call
    timing.py      the timer, re-exported from sparsec.measure (shared with the tuner), which
                   also holds the prepared calls it times (sparsec's or a peer's)
    roofline.py    compulsory bytes and flops per case; ceilings measured in the same run
    run.py         compile (cached), check against float64, time, record
    report.py      JSON records, a markdown summary, a speedup plot

Nothing here imports torch, CuPy or matplotlib at import time: ``sparsec`` stays usable
without them, and each is asked for only by the step that needs it.
"""
