"""How many CUDA devices this machine lets a process use, without importing torch or Ray.

``cluster: local`` asks it twice, with the same answer: ``up`` (to say at once that a teacher will
run on CPU) and the node task (to start Ray with ``--num-gpus=0`` rather than the recipe's
``gpus_per_node``, which Ray refuses where ``CUDA_VISIBLE_DEVICES`` lists fewer devices, and
fakes where it is unset). The driver's own count comes from NVML (``libnvidia-ml.so.1``, loaded
with ctypes: the library Ray and ``nvidia-smi`` ask); ``CUDA_VISIBLE_DEVICES``, when set, cuts it
as CUDA does (an empty value, or the first invalid entry, ends the list).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

NVML_LIBRARY = "libnvidia-ml.so.1"


def driver_device_count() -> int:
    """GPUs the NVIDIA driver reports (0 without a driver or without the NVML library)."""
    try:
        nvml = ctypes.CDLL(NVML_LIBRARY)
    except OSError:
        return 0
    count = ctypes.c_uint(0)
    try:
        if nvml.nvmlInit_v2() != 0:
            return 0
        try:
            return int(count.value) if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
        finally:
            nvml.nvmlShutdown()
    except AttributeError:  # a library without these symbols is not a usable NVML
        return 0


def visible_limit(environ: Mapping[str, str]) -> int | None:
    """How many devices ``CUDA_VISIBLE_DEVICES`` admits (None when unset: no limit). CUDA reads the
    list up to its first invalid entry (``-1``, a word): ``""`` and ``"-1"`` admit none."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    admitted = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-") or not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        admitted += 1
    return admitted


def cuda_device_count(environ: Mapping[str, str] | None = None) -> int:
    """CUDA devices a process started with ``environ`` (default: this one's) can use."""
    found = driver_device_count()
    limit = visible_limit(os.environ if environ is None else environ)
    return found if limit is None else min(found, limit)
