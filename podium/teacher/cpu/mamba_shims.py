"""CPU shims for megatron-core's hybrid (Mamba-2) model: what it needs to build and run without
CUDA, ``mamba-ssm``'s Triton kernels, Triton itself or TransformerEngine.

This module owns those patches and the PyTorch kernels they put in place (the SSD scan and the gated
group RMSNorm), as :mod:`podium.teacher.cpu.cuda_shims` owns the ones every model needs.
``hybrid_model.build_hybrid_model`` applies them before it imports megatron's Mamba modules; each
applies only when what it stands in for is missing, once per process
(:class:`podium.teacher.cpu.shims.ShimSet`). Each is named; ``tests/teacher/
test_mamba_shims.py`` builds and runs a tiny hybrid model with all shims but one and expects it to
fail, so a megatron-core upgrade that no longer needs a shim, or needs a new one, fails that test.

What megatron-core 0.16.1 needs (the condition in brackets):

``triton_tensor_ops`` [no ``triton``]
    ``ssm.mamba_mixer`` imports ``inference.contexts.attention_context.triton.tensor_ops``, which
    imports ``triton`` at import time (only dynamic batching uses it). The shim registers a module of
    the same name whose functions refuse to run.
``mamba_ssm_required`` [no ``mamba_ssm``]
    ``MambaMixer.__init__`` raises when ``mamba_ssm`` did not import (``HAVE_MAMBA_SSM``); the
    shim says it did, for the two kernels below.
``ssd_scan`` [no ``mamba_ssm``]
    The full-sequence scan ``mamba_chunk_scan_combined`` is Triton only: the shim puts
    :func:`ssd_chunk_scan` (PyTorch, chunked, fp32) in its place.
``gated_rmsnorm`` [no ``mamba_ssm``]
    The mixer's gated group RMSNorm (``ExtendedRMSNorm``) subclasses a ``MagicMock`` without
    ``mamba_ssm``; the shim puts :class:`GatedGroupRMSNorm` there.
``hybrid_final_norm`` [no TransformerEngine]
    ``MambaStack`` builds its final norm with ``TENorm`` whatever the spec says; the shim gives it
    megatron's ``WrappedTorchNorm``.
``moe_latent_proj`` [no TransformerEngine]
    ``MoELayer`` asserts TE for the latent projections (``fc1_latent_proj``/``fc2_latent_proj``,
    ``TELinear`` duplicated on every rank); the shim builds them as :class:`DuplicatedLinear`.

Not needed (checked): ``MambaMixer.__init__`` forks the CUDA RNG tracker, which works on CPU with
the inference tracker podium's workers seed (``model_parallel_cuda_manual_seed(...,
inference_rng_tracker=True)``); podium's SDPA core attention never builds ``DotProductAttention``'s
CUDA mask.

The scan follows megatron-core, not transformers: megatron passes no ``dt_limit`` (``dt`` is not
clamped); transformers clamps ``dt`` at ``time_step_min`` (see ``hybrid_model``).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable
from typing import Any

from podium.teacher.cpu.shims import Shim, ShimSet, cuda_available, mark, module_missing

_TENSOR_OPS = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"


def ssd_chunk_scan(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int, D: Any = None, z: Any = None,
                   dt_bias: Any = None, dt_softplus: bool = False, dt_limit: tuple[float, float] = (0.0, float("inf")),
                   return_final_states: bool = False, seq_idx: Any = None, cu_seqlens: Any = None,
                   return_varlen_states: bool = False, initial_states: Any = None, **_: Any) -> Any:
    """Mamba-2's SSD scan in PyTorch (fp32), with ``mamba_chunk_scan_combined``'s signature.

    ``x [b, l, h, p]``, ``dt [b, l, h]``, ``A [h]``, ``B``/``C [b, l, g, n]``, ``D [h]``: per head,
    ``s_t = exp(dt_t·A)·s_{t-1} + dt_t·x_t⊗B_t`` and ``y_t = s_t·C_t + D·x_t``, computed a chunk
    at a time: within a chunk as a masked product, across chunks by carrying the state. Packed
    sequences, initial states and the fused gate are not supported (megatron's static prefill
    passes none of them).
    """
    import torch
    import torch.nn.functional as F

    if any(v is not None for v in (seq_idx, cu_seqlens, initial_states, z)) or return_varlen_states:
        raise NotImplementedError("ssd_chunk_scan: packed sequences, initial states and z are not supported")
    out_dtype = x.dtype
    b, length, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_limit != (0.0, float("inf")):
        dt = dt.clamp(min=dt_limit[0], max=dt_limit[1])
    x32 = x.float()
    Bh = B.float().repeat_interleave(h // g, dim=2)
    Ch = C.float().repeat_interleave(h // g, dim=2)
    q = int(chunk_size)
    pad = -length % q

    def chunks(t: Any) -> Any:  # [b, l, h, ...] -> [b, c, q, h, ...]
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) if pad else t
        return t.reshape(b, -1, q, *t.shape[2:])

    xc, Bc, Cc, dtc = chunks(x32), chunks(Bh), chunks(Ch), chunks(dt)
    log_decay = torch.cumsum(dtc * A.float(), dim=2)  # [b, c, q, h]: sum of dt·A up to each step
    seg = log_decay[:, :, :, None, :] - log_decay[:, :, None, :, :]  # [b, c, t, s, h]
    causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp(seg.masked_fill(~causal[None, None, :, :, None], float("-inf")))
    weights = torch.einsum("bcthn,bcshn->bctsh", Cc, Bc) * decay * dtc[:, :, None, :, :]
    y = torch.einsum("bctsh,bcshp->bcthp", weights, xc)
    # each chunk's own contribution to the state at its end, then the state carried across chunks
    to_end = torch.exp(log_decay[:, :, -1:, :] - log_decay) * dtc  # [b, c, q, h]
    chunk_states = torch.einsum("bcsh,bcshn,bcshp->bchpn", to_end, Bc, xc)
    state = x32.new_zeros(b, h, p, n)
    entering = []
    for c in range(xc.shape[1]):
        entering.append(state)
        state = state * torch.exp(log_decay[:, c, -1, :])[:, :, None, None] + chunk_states[:, c]
    carried = torch.stack(entering, dim=1)  # [b, c, h, p, n]
    y = y + torch.einsum("bcthn,bchpn->bcthp", Cc, carried) * torch.exp(log_decay)[..., None]
    y = y.reshape(b, -1, h, p)[:, :length]
    if D is not None:
        y = y + x32 * (D.float()[:, None] if D.dim() == 1 else D.float())
    y = y.to(out_dtype)
    return (y, state) if return_final_states else y


def _gated_norm_cls() -> type:
    import torch

    class GatedGroupRMSNorm(torch.nn.Module):
        """``mamba_ssm``'s gated RMSNorm (``norm_before_gate=False``) in PyTorch: ``x · silu(z)``,
        then an RMSNorm over each group of ``group_size`` channels, in fp32, times the weight."""

        def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                     norm_before_gate: bool = False, device: Any = None, dtype: Any = None) -> None:
            super().__init__()
            if norm_before_gate:
                raise NotImplementedError("GatedGroupRMSNorm: norm_before_gate=True")
            self.eps = eps
            self.group_size = group_size or hidden_size
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
            self.register_parameter("bias", None)

        def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
            dtype = x.dtype
            h = x.float()
            if z is not None:
                h = h * torch.nn.functional.silu(z.float())
            grouped = h.reshape(*h.shape[:-1], -1, self.group_size)
            grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
            return (grouped.reshape(h.shape) * self.weight.float()).to(dtype)

        def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: Any = None) -> Any:
            """As megatron's ``ExtendedRMSNorm``: the weight split over TP along its channels."""
            from megatron.core import parallel_state
            from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

            return make_sharded_tensors_for_checkpoint(
                self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0}, sharded_offsets,
                tp_group=parallel_state.get_tensor_model_parallel_group(),
                dp_cp_group=(metadata or {}).get("dp_cp_group"))

    return GatedGroupRMSNorm


def _duplicated_linear_cls() -> type:
    import torch

    class DuplicatedLinear(torch.nn.Module):
        """``TELinear(parallel_mode="duplicated")`` in PyTorch: the whole weight on every rank,
        returning ``(output, None)`` (the bias, if any, added)."""

        def __init__(self, input_size: int, output_size: int, *, config: Any, bias: bool = False, **_: Any) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=config.params_dtype))
            self.bias = torch.nn.Parameter(torch.zeros(output_size, dtype=config.params_dtype)) if bias else None

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
            return torch.nn.functional.linear(x, self.weight, self.bias), None

    return DuplicatedLinear


def _refuse(*_: Any, **__: Any) -> None:
    raise NotImplementedError("dynamic-batching tensor ops need triton (not installed)")


def _shim_triton_tensor_ops() -> None:
    if _TENSOR_OPS in sys.modules:
        return
    module = types.ModuleType(_TENSOR_OPS, "podium's stand-in: triton is not installed")
    for name in ("tensor_get_slice_after", "tensor_masked_update", "tensor_merge"):
        setattr(module, name, _refuse)
    sys.modules[_TENSOR_OPS] = mark(module)


def _shim_mamba_ssm_required() -> None:
    import megatron.core.ssm.mamba_mixer as mixer

    mixer.HAVE_MAMBA_SSM = True


def _shim_ssd_scan() -> None:
    import megatron.core.ssm.mamba_mixer as mixer

    mixer.mamba_chunk_scan_combined = ssd_chunk_scan


def _shim_gated_rmsnorm() -> None:
    import megatron.core.ssm.mamba_mixer as mixer

    mixer.ExtendedRMSNorm = _gated_norm_cls()


def _shim_hybrid_final_norm() -> None:
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from podium.teacher.megatron_compat import hybrid_block_module

    hybrid_block_module().TENorm = WrappedTorchNorm


def _shim_moe_latent_proj() -> None:
    import megatron.core.transformer.moe.moe_layer as moe_layer

    moe_layer.HAVE_TE = True  # read only by the latent projections' assertion
    moe_layer.TELinear = _duplicated_linear_cls()


def _no_ssm() -> bool:
    return not cuda_available() or module_missing("mamba_ssm")


def _no_te() -> bool:
    return not cuda_available() or module_missing("transformer_engine")


MAMBA_SHIMS = ShimSet("Mamba", [
    Shim("triton_tensor_ops", _shim_triton_tensor_ops, lambda: module_missing("triton")),
    Shim("mamba_ssm_required", _shim_mamba_ssm_required, _no_ssm),
    Shim("ssd_scan", _shim_ssd_scan, _no_ssm),
    Shim("gated_rmsnorm", _shim_gated_rmsnorm, _no_ssm),
    Shim("hybrid_final_norm", _shim_hybrid_final_norm, _no_te),
    Shim("moe_latent_proj", _shim_moe_latent_proj, _no_te),
])
MAMBA_SHIM_NAMES: tuple[str, ...] = MAMBA_SHIMS.names


def apply_mamba_shims(skip: Iterable[str] = ()) -> tuple[str, ...]:
    """Apply every needed shim once per process, in order (``triton_tensor_ops`` before megatron's
    Mamba modules are imported); return the names active. ``skip`` (for the test that proves each
    is needed) leaves those out for the rest of the process, later calls included."""
    return MAMBA_SHIMS.apply(skip)
