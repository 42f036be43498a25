"""CPU-only shims for megatron-core: the few CUDA calls it makes even when running on CPU/gloo.

This module owns every patch podium needs for megatron-core to run at all without CUDA, so that an
upgrade has one place to look (the exact speed-ups of the local layer spec are
:mod:`podium.teacher.model.megatron_patches`). They are applied only when CUDA is absent
(``torch.cuda.is_available()`` is False; ``te_general_gemm``: when TransformerEngine is), by the
worker process before it builds a model, and by ``convert`` before it saves a checkpoint; once per
process (:class:`podium.teacher.cpu.shims.ShimSet`).

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
``te_general_gemm``
    The MoE router's forward tests ``te_general_gemm is not None``, a name ``moe_utils`` defines
    only when TransformerEngine imports: ``NameError`` without TE, *also on a GPU*. The shim defines
    it as ``None`` (the router then uses torch). Applied wherever TE is absent, before megatron-core
    0.17 (which defines it as ``None`` itself; :mod:`podium.teacher.megatron_compat`).
``mla_have_te``
    ``multi_latent_attention`` sets ``HAVE_TE`` when it can import megatron's TransformerEngine
    extension, which imports without TE (its classes are then mocks), and ``MLASelfAttention``'s
    constructor calls ``isinstance(self.linear_proj, TELinear)`` on such a mock: ``TypeError``, *also
    on a GPU without TE*. The shim sets the module's ``HAVE_TE`` False where TE is absent, before
    megatron-core 0.17 (which takes TE's own flag; :mod:`podium.teacher.megatron_compat`).
``moe_dtoh_stream``
    Building the ``alltoall`` token dispatcher creates a class-wide ``torch.cuda.Stream()`` for its
    device-to-host copies. The shim sets a placeholder, so none is created.
``moe_dtoh_sync``
    The ``alltoall`` dispatcher's forward copies the split sizes to the host on that stream
    (``torch.cuda.current_stream``, ``torch.cuda.stream``, an event) and hands them to
    ``all_to_all_single``, which on gloo takes Python lists only. The shim does the same step with
    no stream work: split sizes become lists (``output_splits_tp`` a numpy array, as megatron reads
    it with ``.tolist()``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from podium.teacher.cpu.shims import Shim, ShimSet, cuda_available, mark, module_missing
from podium.teacher.megatron_compat import shims_not_needed

NO_TE_SHIMS: tuple[str, ...] = ("te_general_gemm", "mla_have_te")  # needed wherever TransformerEngine is absent


def _shim_current_device() -> None:
    import torch

    def current_device() -> str:
        return "cpu"

    torch.cuda.current_device = mark(current_device)  # type: ignore[assignment]


def _shim_synchronize() -> None:
    import torch

    def synchronize(device: Any = None) -> None:
        return None

    torch.cuda.synchronize = mark(synchronize)


def _shim_tied_embedding_cuda() -> None:
    import torch
    from megatron.core.models.common.language_module.language_module import LanguageModule

    original: Callable[..., Any] = LanguageModule.setup_embeddings_and_output_layer

    @functools.wraps(original)
    def setup_embeddings_and_output_layer(module: Any, *args: Any, **kwargs: Any) -> Any:
        saved = torch.Tensor.cuda

        def cuda_identity(self: Any, *a: Any, **k: Any) -> torch.Tensor:  # Tensor.cuda's parameter names
            return self

        torch.Tensor.cuda = cuda_identity  # type: ignore[method-assign]
        try:
            return original(module, *args, **kwargs)
        finally:
            torch.Tensor.cuda = saved  # type: ignore[method-assign]

    LanguageModule.setup_embeddings_and_output_layer = mark(setup_embeddings_and_output_layer)


def _shim_te_general_gemm() -> None:
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _shim_mla_have_te() -> None:
    import megatron.core.transformer.multi_latent_attention as mla

    mla.HAVE_TE = False


@mark
class _NoStream:
    """Stands where the ``alltoall`` dispatcher keeps its device-to-host CUDA stream."""


def _shim_moe_dtoh_stream() -> None:
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    if MoEAlltoAllTokenDispatcher.cuda_dtoh_stream is None:
        MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _NoStream()


def _shim_moe_dtoh_sync() -> None:
    import numpy as np
    import torch
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    def as_list(value: Any) -> Any:
        return value.tolist() if isinstance(value, (torch.Tensor, np.ndarray)) else value

    def _maybe_dtoh_and_synchronize(self: Any, point: str, tokens_per_expert: Any = None) -> Any:
        if not self.drop_and_pad and point == self.cuda_dtoh_point:
            self.input_splits = as_list(self.input_splits)
            self.output_splits = as_list(self.output_splits)
            if isinstance(self.output_splits_tp, torch.Tensor):
                self.output_splits_tp = self.output_splits_tp.numpy()
        return tokens_per_expert

    MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize = mark(_maybe_dtoh_and_synchronize)


def _needed(name: str) -> Callable[[], bool]:
    """Without CUDA (and, for :data:`NO_TE_SHIMS`, without TransformerEngine), unless this
    megatron-core release no longer needs it (``megatron_compat.shims_not_needed``)."""
    def needed() -> bool:
        if name in shims_not_needed():
            return False
        return not cuda_available() or (name in NO_TE_SHIMS and module_missing("transformer_engine"))

    return needed


CUDA_SHIMS = ShimSet("CUDA", [Shim(name, apply, _needed(name)) for name, apply in (
    ("current_device", _shim_current_device),
    ("synchronize", _shim_synchronize),
    ("tied_embedding_cuda", _shim_tied_embedding_cuda),
    ("te_general_gemm", _shim_te_general_gemm),
    ("mla_have_te", _shim_mla_have_te),
    ("moe_dtoh_stream", _shim_moe_dtoh_stream),
    ("moe_dtoh_sync", _shim_moe_dtoh_sync),
)])
SHIM_NAMES: tuple[str, ...] = CUDA_SHIMS.names


def apply_cuda_shims(skip: Iterable[str] = ()) -> tuple[str, ...]:
    """Apply every shim (except ``skip``) once per process when CUDA is absent; return those active.

    With CUDA present only the shims for a missing TransformerEngine apply. ``skip`` exists for the
    test that checks each shim is still needed (left out for the rest of the process).
    """
    return CUDA_SHIMS.apply(skip)


def applied_shims() -> tuple[str, ...]:
    """Names of the shims active in this process."""
    return CUDA_SHIMS.applied()

