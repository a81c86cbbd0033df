"""What runs on a serving node, with no part of the build imported: the JIT-free check
(check.py), the numerical checks on the GPU (verify.py) and the GPU benchmark
(bench_gpu.py)."""
