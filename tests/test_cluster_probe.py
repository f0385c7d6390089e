"""TVM 0.27 builds a thread-block-cluster kernel that reduces across the cluster through
distributed shared memory (``benchmarks/probe_cluster_reduce.py``, correct on the H200 for
clusters of 2, 4 and 8: ``results/cluster_probe_H200.json``): the split-K of issue 24's BSR
design rests on it, so a TVM that stops emitting it fails here, on the CPU."""
from nvcc_tools import nvcc_ptx
from script_modules import ROOT, load_script


def test_cluster_kernel_reads_other_ctas_shared_memory_between_cluster_barriers():
    probe = load_script(ROOT / "benchmarks" / "probe_cluster_reduce.py", "probe_cluster_reduce")
    src = probe.build(clusters=3, size=4).mod.imports[0].inspect_source()
    ptx = nvcc_ptx(src, "sm_90a")
    assert "%cluster_ctarank" in ptx and "mapa.u64" in ptx
    assert ptx.count("barrier.cluster.arrive") == 2 and ptx.count("barrier.cluster.wait") == 2
