"""Stand-ins for megatron-core's CUDA-only kernels on a machine without CUDA, each named and each
proven still needed by a test (tests/teacher/test_cuda_shims.py, test_mamba_shims.py)."""
