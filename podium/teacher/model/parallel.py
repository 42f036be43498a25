"""One rank's place in its teacher's parallel groups: ``torch.distributed`` and megatron-core's
``parallel_state`` joined, and left.

:func:`init_parallel`: ``torch.distributed`` (NCCL on GPU, gloo on CPU) from rank 0's address and
port, ``parallel_state`` with TP/PP/CP/EP/ETP, the inference RNG tracker. Rank 0's TCPStore listens
on that address only (:func:`rendezvous_store`), not on every address of its node (torch's
default): the store has no authentication. A teacher's workers join here, and so does the
conversion to torch_dist (:mod:`podium.teacher.model.convert`), which writes a checkpoint from
as many processes as its layout needs.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Mapping
from typing import Any

from podium.net import is_loopback

DEFAULT_SEED = 1234


def init_parallel(
    rank: int,
    world_size: int,
    init_method: str,
    parallel: Mapping[str, int],
    *,
    backend: str | None = None,
    seed: int = DEFAULT_SEED,
    timeout_s: float = 600.0,
) -> None:
    """``torch.distributed`` + Megatron ``parallel_state`` + RNG tracker for this rank.

    ``init_method`` is ``tcp://ADDR:PORT`` (worker 0's address) or ``file://PATH`` (one machine).
    """
    import datetime
    from urllib.parse import urlparse

    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        # A collective that times out (a dead or frozen peer) aborts its communicator and raises,
        # ending this worker, instead of hanging the rank forever; the site may choose otherwise.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    parsed = urlparse(init_method)
    local_only = parsed.scheme == "file" or is_loopback(parsed.hostname or "")
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and local_only:
        # All ranks on one machine (tests, convert): keep gloo on lo. On a real cluster
        # GLOO_SOCKET_IFNAME is left to the site (pass it in the group's env_vars).
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        if parsed.scheme == "tcp" and parsed.hostname and parsed.port:
            store = rendezvous_store(parsed.hostname, parsed.port, rank=rank, world_size=world_size, timeout=timeout)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size,
                                    timeout=timeout)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=int(parallel.get("tensor_model_parallel_size", 1)),
        pipeline_model_parallel_size=int(parallel.get("pipeline_model_parallel_size", 1)),
        context_parallel_size=int(parallel.get("context_parallel_size", 1)),
        expert_model_parallel_size=int(parallel.get("expert_model_parallel_size", 1)),
        expert_tensor_parallel_size=int(parallel.get("expert_tensor_parallel_size", 1)),
        # every group's collectives time out as the world's do (megatron's default: 30 minutes)
        distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)),
    )
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)


def rendezvous_store(host: str, port: int, *, rank: int, world_size: int, timeout: Any) -> Any:
    """torch's ``TCPStore`` of a group: rank 0 serves it on ``host`` only (a socket bound to that
    address, handed to the store), every rank connects to ``host:port``."""
    import torch.distributed as dist

    if rank != 0:
        return dist.TCPStore(host, port, world_size, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(socket.SOMAXCONN)
        fd = listener.detach()  # the store's server owns the socket from here
    try:
        return dist.TCPStore(host, port, world_size, True, timeout, wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def destroy_parallel() -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()
