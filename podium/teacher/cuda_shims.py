"""CPU-only shims for megatron-core: the few CUDA calls it makes even when running on CPU/gloo.

This module owns every monkeypatch podium applies to torch/megatron, so that an upgrade has one
place to look. They are applied only when CUDA is absent (``torch.cuda.is_available()`` is False),
by the worker process before it builds a model, and by ``convert`` before it saves a checkpoint.

What megatron-core 0.16.1 needs on a CPU-only torch build (each shim is named; the test
``tests/teacher/test_cuda_shims.py`` runs, for each one, the megatron code path with all shims but
that one and expects it to fail, so a megatron-core upgrade that no longer needs a shim, or needs a
new one, fails that test instead of hiding):

``current_device``
    ``torch.cuda.current_device()`` is used as a device argument (global memory buffer, tensor
    parallel gathers, rotary embeddings, output buffers). On a CPU build it raises; the shim makes it
    return ``"cpu"``.
``synchronize``
    ``torch.cuda.synchronize()`` in ``dist_checkpointing.save`` (and a few other places); a no-op.
``tied_embedding_cuda``
    With PP > 1 and tied embeddings, ``LanguageModule.setup_embeddings_and_output_layer`` moves the
    shared weight with ``tensor.cuda()`` before its all-reduce. The shim makes ``Tensor.cuda`` return
    the tensor unchanged *only during that call*.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Callable, Iterable

logger = logging.getLogger(__name__)

SHIM_NAMES: tuple[str, ...] = ("current_device", "synchronize", "tied_embedding_cuda")

_applied: set[str] = set()
_lock = threading.Lock()


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _shim_current_device() -> None:
    import torch

    def current_device() -> str:
        return "cpu"

    current_device.__podium_shim__ = True  # type: ignore[attr-defined]
    torch.cuda.current_device = current_device  # type: ignore[assignment]


def _shim_synchronize() -> None:
    import torch

    def synchronize(device: Any = None) -> None:
        return None

    synchronize.__podium_shim__ = True  # type: ignore[attr-defined]
    torch.cuda.synchronize = synchronize  # type: ignore[assignment]


def _shim_tied_embedding_cuda() -> None:
    import torch
    from megatron.core.models.common.language_module.language_module import LanguageModule

    original: Callable[..., Any] = LanguageModule.setup_embeddings_and_output_layer

    @functools.wraps(original)
    def setup_embeddings_and_output_layer(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = torch.Tensor.cuda

        def cuda_identity(tensor: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
            return tensor

        torch.Tensor.cuda = cuda_identity  # type: ignore[method-assign]
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.Tensor.cuda = saved  # type: ignore[method-assign]

    setup_embeddings_and_output_layer.__podium_shim__ = True  # type: ignore[attr-defined]
    LanguageModule.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer  # type: ignore[method-assign]


_SHIMS: dict[str, Callable[[], None]] = {
    "current_device": _shim_current_device,
    "synchronize": _shim_synchronize,
    "tied_embedding_cuda": _shim_tied_embedding_cuda,
}
assert tuple(_SHIMS) == SHIM_NAMES


def apply_cuda_shims(skip: Iterable[str] = ()) -> tuple[str, ...]:
    """Apply every shim (except ``skip``) once per process when CUDA is absent; return those active.

    With CUDA present this does nothing and returns ``()``. ``skip`` exists for the test that checks
    each shim is still needed.
    """
    skip = set(skip)
    unknown = skip - set(SHIM_NAMES)
    if unknown:
        raise ValueError(f"unknown CUDA shim(s) {sorted(unknown)}; known: {list(SHIM_NAMES)}")
    if cuda_available():
        return ()
    with _lock:
        for name in SHIM_NAMES:
            if name in skip or name in _applied:
                continue
            _SHIMS[name]()
            _applied.add(name)
            logger.debug("applied CPU shim %s", name)
        return tuple(n for n in SHIM_NAMES if n in _applied)


def applied_shims() -> tuple[str, ...]:
    """Names of the shims active in this process."""
    return tuple(n for n in SHIM_NAMES if n in _applied)
