"""How a trainer's client behaves: how patient it is, and what its answers are.

Owns :class:`ClientOptions` (timeouts, polling, keepalive, retries, the wire's encoding, the type of
the results) and :func:`convert_outputs`, which turns an answer's numpy arrays into torch tensors where
torch is importable (a trainer's install) and leaves them numpy arrays where it is not (podium's
light install), unless ``return_type`` says which.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ClientOptions:
    """How patient and how fast the client is (all times in seconds)."""

    call_timeout_s: float = 1800.0  # one call, all retries and waits included (per-call override: timeout_s)
    ready_timeout_s: float = 3600.0  # one wait for a (re)started teacher to be ready (within the call's)
    connect_timeout_s: float = 10.0
    request_timeout_s: float | None = 3600.0  # one exchange, queueing + compute included (within the call's)
    keepalive_idle_s: float = 30.0  # TCP keepalive: first probe after this much silence on a connection,
    keepalive_interval_s: float = 10.0  # then one every this often,
    keepalive_count: int = 3  # and the connection is dropped after this many unanswered
    poll_interval_s: float = 0.2  # first record re-read interval, doubling up to max_poll_interval_s
    max_poll_interval_s: float = 2.0
    stale_after_s: float | None = None  # default: what the teacher's record says (server.stale_after_s)
    # How often the client looks again at what may change under it: rendezvous.json (replicas added
    # or removed by `podium scale`) and the records of replicas it does not use (one come back).
    refresh_s: float = 2.0
    binary: bool = True  # binary tensor extension (False: JSON tensors)
    # A call whose binary answer is at least this many MB (10^6 bytes) is sent as up to four requests
    # of consecutive rows at once: the first answers cross the wire while the teacher computes the
    # later ones (podium.client.pipeline). None: always one request.
    pipeline_mb: float | None = 32.0
    # A request whose generation died under it (the connection dropped after it was sent, or the
    # group answered broken) is sent again at most this many times, to other replicas or later
    # generations: a request that kills every generation fails instead of crash-looping them.
    max_retries_after_crash: int = 2
    # A full queue (503 + Retry-After) is tried again no sooner than its Retry-After, doubling (with
    # jitter) on each full answer of the call, up to this (other replicas are tried meanwhile).
    max_backoff_s: float = 60.0
    # A replica whose answers take over this many times the other replicas' median (this client's
    # measurements) is drained: no request goes there while another is not slow, but one probe every
    # slow_probe_s, until a probe answers at the others' pace (podium.client.routing). None: never.
    slow_factor: float | None = 4.0
    slow_probe_s: float = 10.0
    # A request unanswered max(hedge_factor x its replica's usual time, hedge_min_s) after it was
    # sent is sent once more to another replica, the first answer winning; at most hedge_fraction of
    # the requests are (podium.client.routing). hedge_factor None: never.
    hedge_factor: float | None = 3.0
    hedge_min_s: float = 1.0
    hedge_fraction: float = 0.1
    # "auto": torch tensors where torch is importable (a trainer's), else numpy arrays (the light
    # install's); "torch" or "numpy": always that.
    return_type: str = "auto"


@functools.cache
def _torch() -> Any:
    """The torch module, or None where it is not installed (looked for once)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def convert_outputs(outputs: Mapping[str, np.ndarray], return_type: str) -> dict[str, Any]:
    """The arrays of an answer as ``return_type`` says (see :class:`ClientOptions`)."""
    if return_type == "numpy" or (return_type == "auto" and _torch() is None):
        return dict(outputs)
    import torch

    return {name: torch.from_numpy(array) for name, array in outputs.items()}
