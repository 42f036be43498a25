"""The Mamba CPU shims are exactly what megatron-core's hybrid model needs: each is required.

``mamba_shim_scenarios.py`` builds a tiny hybrid model (every layer kind, latent MoE) as podium
builds it and runs a forward, with all shims (must work) and with all shims but one, for each one
(must fail, with the error megatron raises without it). A megatron-core upgrade that drops a need
fails the second check (remove the shim from ``podium/teacher/cpu/mamba_shims.py``); one that adds a
need fails the first. The scenarios run with CUDA hidden (and TransformerEngine): a CPU-only
machine, also on a GPU node.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import forked_cases
import pytest
from fixtures.devices import cpu_only_env

from podium.teacher.cpu.mamba_shims import MAMBA_SHIM_NAMES
from podium.teacher.megatron_compat import MEGATRON_VERSION

pytestmark = [pytest.mark.megatron]

SCRIPT = Path(__file__).with_name("mamba_shim_scenarios.py")
# What the failure without each shim says.
FAILS_WITH = {
    "triton_tensor_ops": "No module named 'triton'",
    "mamba_ssm_required": "MambaSSM is not installed",
    # megatron-core 0.19 sets the missing kernel to None where 0.16 leaves the name undefined
    "ssd_scan": ("'NoneType' object is not callable" if MEGATRON_VERSION >= (0, 19)
                 else "name 'mamba_chunk_scan_combined' is not defined"),
    "gated_rmsnorm": "StopIteration",  # the MagicMock "norm" has no parameters
    "hybrid_final_norm": "Transformer Engine is not installed",
    "moe_latent_proj": "TransformerEngine is required for MoE latent projections",
}
# Where triton is installed (the CUDA torch wheel, the only one for Python 3.12, brings it) megatron's
# tensor ops import: that shim does not apply, and the scenario without it must work.
NOT_APPLICABLE = {"triton_tensor_ops"} if importlib.util.find_spec("triton") else set()


def test_every_shim_has_its_failure():
    assert set(FAILS_WITH) == set(MAMBA_SHIM_NAMES)


@pytest.fixture(scope="module")
def scenario_results() -> Mapping[str, subprocess.CompletedProcess]:
    """The scenario with every shim (``""``) and without each one, forked from one process (``forked_cases.py``)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--each", "", *MAMBA_SHIM_NAMES], capture_output=True,
                          text=True, env=cpu_only_env(), timeout=600)
    return forked_cases.results(proc)


@pytest.mark.parametrize("shim", MAMBA_SHIM_NAMES)
def test_mamba_shim_is_needed_and_sufficient(scenario_results, shim):
    ok = scenario_results[""]
    assert ok.returncode == 0, f"the hybrid scenario fails even with every shim:\n{ok.stdout[-3000:]}"
    without = scenario_results[shim]
    if shim in NOT_APPLICABLE:
        assert without.returncode == 0, without.stdout[-2000:]
        return
    assert without.returncode == 3, (
        f"the hybrid scenario works without shim {shim!r}: megatron-core no longer needs it "
        f"(remove it from podium/teacher/cpu/mamba_shims.py)\n{without.stdout[-2000:]}"
    )
    assert FAILS_WITH[shim] in without.stdout, without.stdout[-2000:]


def test_ssd_scan_equals_the_recurrence():
    """The PyTorch SSD scan, chunked, equals Mamba-2's recurrence step by step (and any chunk size)."""
    import torch

    from podium.teacher.cpu.mamba_shims import ssd_chunk_scan

    gen = torch.Generator().manual_seed(0)
    b, length, h, p, g, n = 2, 11, 4, 3, 2, 5
    x, dt = torch.randn(b, length, h, p, generator=gen), torch.randn(b, length, h, generator=gen)
    B, C = torch.randn(b, length, g, n, generator=gen), torch.randn(b, length, g, n, generator=gen)
    A, D, dt_bias = -torch.rand(h, generator=gen) * 2, torch.randn(h, generator=gen), torch.randn(h, generator=gen)
    step = torch.nn.functional.softplus(dt + dt_bias)
    Bh, Ch = B.repeat_interleave(h // g, 2), C.repeat_interleave(h // g, 2)
    state, expected = torch.zeros(b, h, p, n), []
    for t in range(length):
        kick = step[:, t, :, None, None] * x[:, t, ..., None] * Bh[:, t, :, None]
        state = state * torch.exp(step[:, t] * A)[..., None, None] + kick
        expected.append(torch.einsum("bhpn,bhn->bhp", state, Ch[:, t]) + D[:, None] * x[:, t])
    for chunk in (1, 4, 64):
        y, final = ssd_chunk_scan(x, dt, A, B, C, chunk, D=D, dt_bias=dt_bias, dt_softplus=True,
                                  return_final_states=True)
        assert (y - torch.stack(expected, 1)).abs().max() < 1e-4 and (final - state).abs().max() < 1e-4
