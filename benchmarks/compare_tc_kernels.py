#!/usr/bin/env python3
"""CPU, no GPU: the kernels ``sparsec.compile`` builds for the committed Tensor Core cases,
compared as code with the hand-written kernels ``check_tc_formats.py`` times them against.

Why: at 3-5 us a kernel, a timing on the GPU says that the compiled kernel is slower, not
why. Here every case of that check's speed part -- ``results/nm_tc_H200.json`` (2:4 through
``mma_sp``, vector-wise 1:8 through ``nm_tc:1:8:v128``, ``spmm_half_out``) and
``results/lowprec_int8_H200.json`` (``srbcrs:vV,int8``, "spmm"), same weights
(``time_tc_pipeline.weights``, ``lowprec.lowprec``), same widths -- is compiled both ways
for sm_90a, and the two are compared on:

* the knobs each used (the compiler's defaults against the committed best set);
* the main kernel's CUDA (for the compiled one: the body sized for the matrix, launched
  when the operands have its size), identical after normalising names (the kernel's
  symbol, the sized views' ``f`` suffix, TVM's numbering of common subexpressions) --
  split into the signature and the body, since an unused size parameter or a pointer's
  declared type changes the first and not the code that runs;
* the kernels in the module and the launches a call makes on the path the matrix takes
  (an extra launch, e.g. a zero fill, costs 1-2 us at these sizes), with their grid, block
  and dynamic shared memory, read from TVM's host function (``T.call_ffi_kernel``);
* where the committed run timed the compiled kernel's knob set too, the ratio it predicts
  (best ms / ms of the compiled knobs; 1.0 when they are the best).

    SPARSEC_DATA_DIR=... python3 benchmarks/compare_tc_kernels.py [--suites nm int8]
        [--cases SUBSTRING ...] [--widths N ...] [--out FILE] [--cache DIR] [--no-cache]

Compiles are cached under ``--cache`` (default ``$TMPDIR/sparsec_tc_compare``) by what they
read: the case's shape, width, format and knobs, and a hash of the sources under
``sparsec/`` and ``schedules/`` (a change there compiles again). A compiled kernel reads of
its matrix only the format, the shape and (``nm_tc``) the gathered row length, so the int8
cases that differ in sparsity alone share one compile. JSON to ``--out`` and ``$OUT``.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import _preamble  # noqa: F401,E402  (the one preamble: checkout root and benchmarks/data on sys.path)

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
ARCH = "sm_90a"
SPEC_OF = {"sp24": "mma_sp", "gather": "nm_tc:1:8:v128"}
STORED = 1  # the version of what a cached build holds (its CUDA, host script, knobs): raise it on a change


# ---------------------------------------------------------------- reading what TVM built


@contextlib.contextmanager
def host_functions():
    """The host IRModules ``tvm.compile`` builds inside the block, in order (TVM splits each
    module into host and device functions; the host one holds the kernel launches)."""
    build = sys.modules["tvm.tirx.build"]
    split = build.split_host_device_mods
    seen = []

    def spy(mod):
        host, devices = split(mod)
        seen.append(host)
        return host, devices

    build.split_host_device_mods = spy
    try:
        yield seen
    finally:
        build.split_host_device_mods = split


def _split_args(text: str):
    """Top-level comma-separated arguments of a call's argument text."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


_LAUNCH = re.compile(r'T\.call_ffi_kernel\("(\w+)", (.*), launch_params=\[([^\]]*)\]')
_BRANCH = re.compile(r"for _ in range\((.*)\):$")


def launches(host_script: str):
    """The kernel launches of a host function: per ``T.call_ffi_kernel``, the kernel, its
    launch dimensions by name (``blockIdx.x``, ``threadIdx.y``, ..., ``smem`` bytes) and the
    dispatch branch it sits in: a sized body and the any-size one are launched under
    ``for _ in range(same)`` / ``for _ in range(1 - same)`` (``"sized"`` / ``"any"``),
    anything else on every call (``"always"``)."""
    out, stack = [], []  # stack: (indent, branch) of the enclosing dispatch loops
    for line in host_script.splitlines():
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        body = line.strip()
        m = _BRANCH.match(body)
        if m:
            stack.append((indent, "any" if m.group(1).replace(" ", "").startswith("1-") else "sized"))
            continue
        m = _LAUNCH.search(body)
        if not m:
            continue
        names = [n.strip().strip('"') for n in m.group(3).split(",")]
        args = _split_args(m.group(2))
        dims = dict(zip(names, args[len(args) - len(names):]))
        if "tirx.use_dyn_shared_memory" in dims:
            dims["smem"] = re.sub(r"T\.int64\((\d+)\)", r"\1", dims.pop("tirx.use_dyn_shared_memory"))
        out.append({"kernel": m.group(1), "dims": dims, "branch": stack[-1][1] if stack else "always"})
    return out


def on_path(calls, path: str):
    """The launches a call makes when the operands take ``path`` ("sized": the matrix the
    kernel was compiled for; "any": another one)."""
    other = "any" if path == "sized" else "sized"
    return [c for c in calls if c["branch"] != other]


_GLOBAL = re.compile(r'extern "C" __global__ void[^;{]*\{')


def kernel_sources(src: str):
    """{kernel name: its definition} of a CUDA source TVM generated."""
    starts = [m.start() for m in _GLOBAL.finditer(src)]
    out = {}
    for i, s in enumerate(starts):
        text = src[s:starts[i + 1] if i + 1 < len(starts) else len(src)]
        out[re.search(r"void (?:__launch_bounds__\(\d+\) )?(\w+)\(", text).group(1)] = text
    return out


def normalise(text: str, name: str):
    """(signature, body) of a kernel definition with what differs between two builds of the
    same code made alike: the symbol; a sized view's ``f`` suffix (``Af`` views ``A``); a
    pointer every use of which casts it to one type is declared that type (an any-size
    kernel takes int8 values that a sized body reads as words, a hand-written one takes the
    words); scalar parameters the body never reads are dropped; TVM's ``cse_vN`` numbering
    is renumbered by first use, in the signature and the body separately."""
    text = text.replace(name, "KERNEL")
    text = re.sub(r"\b([A-Z][A-Za-z]*?)f_ptr\b", r"\1_ptr", text)
    signature, _, body = text.partition("{")
    head, _, params = signature.partition("KERNEL(")
    kept = []
    for param in _split_args(params.rstrip().rstrip(")")):
        pointer = re.fullmatch(r"(.+?)\* __restrict__ (\w+)", param)
        if pointer:
            ptr = pointer.group(2)
            casts = re.findall(rf"\(\(([\w ]+)\*\){ptr}\)", body)
            if casts and len(set(casts)) == 1 and len(casts) == len(re.findall(rf"\b{ptr}\b", body)):
                body = body.replace(f"(({casts[0]}*){ptr})", ptr)
                param = f"{casts[0]}* __restrict__ {ptr}"
            kept.append(param)
        elif re.search(rf"\b{param.split()[-1]}\b", body):
            kept.append(param)
    signature = f"{head}KERNEL({', '.join(kept)})"

    def renumber(s):
        seen = {}
        return re.sub(r"\bcse_v\d+\b", lambda m: f"cse_v{seen.setdefault(m.group(0), len(seen))}", s)

    return renumber(signature).strip(), renumber(body).strip()


def _diff_lines(a: str, b: str, limit: int = 6):
    import difflib

    out = [ln for ln in difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm="", n=0)
           if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return len(out), out[:limit]


def _helpers_used(src: str, body: str):
    """The ``__device__`` helpers a kernel body calls, with their definitions (TVM emits the
    PTX wrappers a module needs once, before its kernels)."""
    defs = dict(re.findall(r"__device__ [^\n(]*? (\w+)\(([^\n]*\n(?:.*\n)*?)\}\n", src))
    return {n: d for n, d in defs.items() if re.search(rf"\b{n}\(", body)}


def describe_build(build: dict):
    """What a compare needs of one built module (``{"source", "host", "path"}``: its CUDA,
    its host function's script, the dispatch path the matrix takes): its kernels, the
    launches on that path, the main kernel's normalised signature / body and helpers."""
    src, host_script, path = build["source"], build["host"], build["path"]
    kernels = kernel_sources(src)
    calls = launches(host_script)
    taken = on_path(calls, path)
    main = taken[-1]["kernel"] if taken else next(iter(kernels))
    signature, body = normalise(kernels[main], main)
    return {**build, "kernels": sorted(kernels), "launch_sites": len(calls), "launches": taken, "main": main,
            "signature": signature, "body": body, "helpers": _helpers_used(src, body)}


def main_ptx(build) -> str:
    """The PTX nvcc makes of a build's main kernel (``-O3``, the arch compiled for), with its
    name and parameter list normalised: parameters are renumbered by first use in the body,
    so an unused size parameter, or a pointer declared ``uint*`` rather than cast to it,
    leaves it unchanged."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="sparsec-tc-compare-") as d:
        cu, out = os.path.join(d, "k.cu"), os.path.join(d, "k.ptx")
        Path(cu).write_text(build["source"])
        p = subprocess.run(["nvcc", "--ptx", f"-arch={ARCH}", "-O3", "-diag-suppress=177", cu, "-o", out],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"nvcc failed on {build['main']}: {p.stderr[-2000:]}")
        ptx = Path(out).read_text()
    start = ptx.index(f".entry {build['main']}(")
    entry = ptx[start:ptx.index("\n}\n", start)]
    entry = entry.replace(build["main"], "KERNEL")
    _, _, body = entry.partition(")")  # drop the parameter list
    seen = {}
    return re.sub(r"KERNEL_param_\d+", lambda m: f"KERNEL_param_{seen.setdefault(m.group(0), len(seen))}", body)


# ---------------------------------------------------------------- the cases and their builds


def source_hash() -> str:
    """A hash of the compiler's sources (sparsec/, schedules/) and of what this script
    stores (:data:`STORED`): the cache's key part that makes a changed compiler build again."""
    h = hashlib.sha256(f"stored v{STORED}".encode())
    for top in ("sparsec", "schedules"):
        for p in sorted((ROOT / top).rglob("*.py")):
            h.update(str(p.relative_to(ROOT)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


class Cache:
    """JSON files by key, or nothing (``directory`` None)."""

    def __init__(self, directory, salt: str):
        self.dir = Path(directory) if directory else None
        self.salt = salt
        if self.dir:
            self.dir.mkdir(parents=True, exist_ok=True)

    def get_or_make(self, key, make):
        if self.dir is None:
            return make()
        digest = hashlib.sha256(json.dumps([self.salt, key], sort_keys=True).encode()).hexdigest()[:24]
        path = self.dir / f"{digest}.json"
        if path.exists():
            return json.loads(path.read_text())
        value = make()
        path.write_text(json.dumps(value))
        return value


def compiled_build(op, A, feat: int):
    """(knobs, described build) of ``sparsec.compile(op, A, feat=feat)`` for sm_90a."""
    import sparsec

    with host_functions() as hosts:
        k = sparsec.compile(op, A, target=f"cuda:{ARCH}", feat=feat)
    return {"knobs": k.knobs, "source": k.source(), "host": hosts[-1].script(), "path": "sized"}


def hand_build(make_func):
    """Described build of a hand-written kernel's PrimFunc (``make_func()``) for sm_90a."""
    from sparsec.schedules.warp_mma import compile_for, cuda_source

    with host_functions() as hosts:
        ex = compile_for(make_func(), ARCH)
    return {"source": cuda_source(ex), "host": hosts[-1].script(), "path": "always"}


def _wanted(name, N, cases, widths):
    return (not cases or any(c in name for c in cases)) and (not widths or N in widths)


def nm_cases(cases=(), widths=()):
    """(suite, mode, case, M, K, N, best knobs, knob sets timed, compile(), hand()) of the nm
    suite's committed cases, as ``check_tc_formats.speed_nm`` loops them."""
    import sparsec
    from sparsec.formats import nm_tc
    from sparsec.schedules import tc_pipeline as tp
    from check_tc_formats import spmm_half_out
    from time_tc_pipeline import GATHER, weights

    committed = json.load(open(RESULTS / "nm_tc_H200.json"))["cases"]
    half = spmm_half_out()
    for mode in ("sp24", "gather"):
        layers = None
        for c in committed:
            if c["mode"] != mode or not c.get("best") or not _wanted(c["case"], c["N"], cases, widths):
                continue
            layers = layers if layers is not None else dict(weights(mode))
            if c["case"] not in layers:
                continue
            w = layers[c["case"]]
            kc = nm_tc.pack(w, **GATHER)[0].shape[1] if mode == "gather" else 0
            M, K, N = c["M"], c["K"], int(c["N"])

            def make_compiled(w=w, N=N, mode=mode):
                return compiled_build(half, sparsec.formats.convert(w, SPEC_OF[mode], dtype=np.float16), N)

            def make_hand(M=M, K=K, N=N, mode=mode, kc=kc, best=c["best"]["knobs"]):
                return hand_build(lambda: tp.spmm(mode, M, K, N, out_dtype="float16", vec=GATHER["vec"], kc=kc,
                                                  **best))

            timed = [(e["knobs"], e["ms"]) for e in c["kernels"] if e.get("ms")]
            yield dict(suite="nm_tc_H200", mode=mode, case=c["case"], M=M, K=K, N=N, best=c["best"]["knobs"],
                       timed=timed, key=[SPEC_OF[mode], M, K, N, kc], compile=make_compiled, hand=make_hand)


def int8_cases(cases=(), widths=()):
    """The same for the lowprec int8 suite's committed cases (``check_tc_formats.speed_int8``)."""
    import sparsec
    from lowprec import SPARSITIES, VECS, lowprec
    from sparsec.schedules import srbcrs_tensorcore as stc

    committed = json.load(open(RESULTS / "lowprec_int8_H200.json"))["cases"]
    wanted = [c for c in committed if _wanted(c["case"], int(c["N"]), cases, widths)]
    if not wanted:
        return
    layers = {name: (w, vec) for name, w, vec, _ in lowprec(vecs=VECS, sparsities=SPARSITIES)}
    for c in wanted:
        if c["case"] not in layers:
            continue
        w, vec = layers[c["case"]]
        M, K, N = c["M"], c["K"], int(c["N"])
        timed = [(e["knobs"], e["ms"]) for e in c["kernels"] if e.get("ms")]
        best = min(timed, key=lambda t: t[1])[0]

        def make_compiled(w=w, vec=vec, N=N):
            scale = float(np.abs(w).max()) / 127 or 1.0
            q = np.clip(np.round(w / scale), -127, 127)
            return compiled_build("spmm", sparsec.formats.convert(q, f"srbcrs:v{vec},int8"), N)

        def make_hand(M=M, K=K, N=N, vec=vec, best=best):
            return hand_build(lambda: stc.spmm_srbcrs_int8(M, K, N, vec, **best))

        yield dict(suite="lowprec_int8_H200", mode=f"int8-v{vec}", case=c["case"], M=M, K=K, N=N, best=best,
                   timed=timed, key=[f"srbcrs:v{vec},int8", M, K, N], compile=make_compiled, hand=make_hand)


def full_knobs(suite: str, knobs: dict) -> dict:
    """``knobs`` with what a build takes when a knob is not given (its first choice)."""
    from sparsec.schedules import srbcrs_tensorcore as stc
    from sparsec.schedules import tc_pipeline as tp

    table = tp.KNOBS if suite == "nm_tc_H200" else stc.KNOBS
    return {**{k: v[0] for k, v in table.items()}, **knobs}


def ptx_same(comp, hand, cache: Cache):
    """"same" when the two main kernels compile to the same PTX (normalised, :func:`main_ptx`),
    "reordered" when to the same instructions in another order (ptxas schedules them
    again), else "differs"."""
    key = ["ptx"] + [hashlib.sha256((b["main"] + b["source"]).encode()).hexdigest() for b in (comp, hand)]

    def compare():
        a, b = main_ptx(comp), main_ptx(hand)
        return "same" if a == b else "reordered" if sorted(a.splitlines()) == sorted(b.splitlines()) else "differs"

    return cache.get_or_make(key, compare)


def compare_case(case, cache: Cache, ptx: bool = True):
    """The row of one case: both builds described and compared (and, where their CUDA
    differs and ``ptx``, compiled to PTX by nvcc and compared again)."""
    comp = describe_build(cache.get_or_make(["compiled"] + case["key"], case["compile"]))
    best = full_knobs(case["suite"], case["best"])
    hand = describe_build(cache.get_or_make(["hand", case["suite"], case["key"], best], case["hand"]))
    knobs = full_knobs(case["suite"], comp["knobs"])
    sig_n, sig_diff = _diff_lines(comp["signature"], hand["signature"])
    body_n, body_diff = _diff_lines(comp["body"], hand["body"])
    helpers_same = comp["helpers"] == hand["helpers"]
    dims = lambda b: [c["dims"] for c in b["launches"]]  # noqa: E731
    timed = {json.dumps(full_knobs(case["suite"], k), sort_keys=True): ms for k, ms in case["timed"]}
    best_ms = min(ms for _, ms in case["timed"])
    compiled_ms = timed.get(json.dumps(knobs, sort_keys=True))
    return {
        "suite": case["suite"], "mode": case["mode"], "case": case["case"], "M": case["M"], "K": case["K"],
        "N": case["N"], "compiled_knobs": knobs, "hand_knobs": best, "knobs_same": knobs == best,
        "knobs_differ": {k: [knobs[k], best[k]] for k in knobs if knobs[k] != best.get(k)},
        "body_same": body_n == 0 and helpers_same, "body_diff_lines": body_n, "body_diff": body_diff,
        "helpers_same": helpers_same, "signature_same": sig_n == 0, "signature_diff": sig_diff,
        "ptx": "same" if body_n == 0 and helpers_same and sig_n == 0 else
        ptx_same(comp, hand, cache) if ptx and knobs == best else None,
        "compiled_kernels": len(comp["kernels"]), "hand_kernels": len(hand["kernels"]),
        "compiled_launches": len(comp["launches"]), "hand_launches": len(hand["launches"]),
        "compiled_launch_sites": comp["launch_sites"],
        "compiled_dims": dims(comp), "hand_dims": dims(hand), "dims_same": dims(comp) == dims(hand),
        # the ratio the committed run's own times predict (hand best / compiled knob set), when it timed that set
        "committed_ratio": None if compiled_ms is None else best_ms / compiled_ms,
    }


def short(knobs: dict, suite: str) -> str:
    if suite == "lowprec_int8_H200":
        return f"{knobs['n_bytes']}/{knobs['warps']}"
    return (f"{knobs['warps_m']}x{knobs['warps_n']}w {knobs['warp_m_tiles']}x{knobs['warp_n_tiles']}t "
            f"k{knobs['k_steps']} s{knobs['stages']} g{knobs['group_m']} f{knobs['frag_sets']}")


def dims_text(d: dict) -> str:
    grid = "x".join(d.get(k, "1") for k in ("blockIdx.x", "blockIdx.y") if k in d)
    block = "x".join(d[k] for k in ("threadIdx.x", "threadIdx.y") if k in d)
    return f"{grid}/{block}" + (f"/{d['smem']}B" if "smem" in d else "")


def print_row(r):
    same = r["knobs_same"]
    knobs = short(r["compiled_knobs"], r["suite"]) + ("" if same else " | hand " + short(r["hand_knobs"], r["suite"]))
    code = "same" if r["body_same"] else f"body±{r['body_diff_lines']}"
    if not r["signature_same"]:
        code += " sig"
    if not (r["body_same"] and r["signature_same"]) and r["ptx"] is not None:
        code += {"same": " ptx=", "reordered": " ptx~"}.get(r["ptx"], " ptx≠")
    launches = f"{r['compiled_launches']}/{r['hand_launches']}"
    dims = dims_text(r["compiled_dims"][0]) if r["compiled_dims"] else "-"
    if not r["dims_same"]:
        dims += " | hand " + (dims_text(r["hand_dims"][0]) if r["hand_dims"] else "-")
    pred = "" if r["committed_ratio"] is None else f"{r['committed_ratio']:.2f}"
    print(f"{r['mode']:<8} {r['case']:<28} N={r['N']:<5} {'=' if same else '≠'} {knobs:<44} {code:<12} "
          f"{launches:<4} {dims:<28} {pred}", flush=True)


def summary(rows):
    out = {}
    for suite in sorted({r["suite"] for r in rows}):
        rs = [r for r in rows if r["suite"] == suite]
        pred = [r["committed_ratio"] for r in rs if r["committed_ratio"] is not None]
        from sparsec.bench.report import geomean

        out[suite] = {
            "cases": len(rs), "knobs_differ": sum(not r["knobs_same"] for r in rs),
            "body_differs": sum(not r["body_same"] for r in rs),
            "signature_differs": sum(not r["signature_same"] for r in rs),
            "ptx_differs": sum(r["ptx"] == "differs" for r in rs),
            "launches_differ": sum(r["compiled_launches"] != r["hand_launches"] for r in rs),
            "dims_differ": sum(not r["dims_same"] for r in rs),
            "committed_ratio_cases": len(pred),
            "committed_ratio_geomean": geomean(pred) if pred else None,
            "committed_ratio_min": min(pred) if pred else None,
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suites", nargs="+", choices=("nm", "int8"), default=["nm", "int8"])
    ap.add_argument("--cases", nargs="+", default=[], help="only cases whose name contains one of these")
    ap.add_argument("--widths", nargs="+", type=int, default=[], help="only these widths N")
    ap.add_argument("--out")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "sparsec_tc_compare"))
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--no-ptx", action="store_true", help="skip nvcc (the PTX compare of kernels whose CUDA differs)")
    args = ap.parse_args(argv)
    import tvm  # noqa: F401  (tvm.tirx.build is where the host functions are read)

    cache = Cache(None if args.no_cache else args.cache, source_hash())
    rows, t0 = [], time.perf_counter()
    print(f"{'mode':<8} {'case':<28} {'N':<7} k  {'knobs (compiled | hand best)':<44} {'CUDA':<12} "
          f"{'l c/h':<4} {'grid/block/smem':<28} pred")
    for suite in args.suites:
        for case in (nm_cases if suite == "nm" else int8_cases)(args.cases, args.widths):
            rows.append(compare_case(case, cache, ptx=not args.no_ptx and shutil.which("nvcc") is not None))
            print_row(rows[-1])
    result = {"arch": ARCH, "source_hash": cache.salt, "rows": rows, "summary": summary(rows),
              "seconds": time.perf_counter() - t0}
    for suite, s in result["summary"].items():
        print(f"{suite}: {s}")
    for path in filter(None, (args.out, os.environ.get("OUT") and os.path.join(os.environ["OUT"],
                                                                                "compare_tc_kernels.json"))):
        Path(path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
