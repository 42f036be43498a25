"""The CPU shims are exactly what megatron-core needs: each is required by its code path.

For every shim, the scenario that needs it (``shim_scenarios.py``) runs with all shims (must work)
and with all shims but that one (must fail). A megatron-core upgrade that drops a need fails the
second check (remove the shim); one that adds a need fails the first (add a shim, and a scenario).
The scenarios run with CUDA hidden (and TransformerEngine, ``shim_scenarios.py``): a CPU-only
machine, also on a GPU node.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import forked_cases
import pytest
from fixtures.devices import cpu_only_env

from podium.teacher.cpu.cuda_shims import SHIM_NAMES
from podium.teacher.megatron_compat import shims_not_needed

pytestmark = [pytest.mark.megatron]

SCRIPT = Path(__file__).with_name("shim_scenarios.py")
NEEDED_BY = {"current_device": "forward", "synchronize": "save", "tied_embedding_cuda": "tied_pp2",
             "te_general_gemm": "moe_ep2", "moe_dtoh_stream": "moe_ep2", "moe_dtoh_sync": "moe_ep2",
             "mla_have_te": "mla"}
# What the failure without the shim says (all but two are about CUDA).
FAILS_WITH = {"te_general_gemm": "te_general_gemm", "mla_have_te": "isinstance() arg 2 must be a type"}


def test_every_shim_has_a_scenario():
    assert set(NEEDED_BY) == set(SHIM_NAMES)


def test_scenarios_see_no_cuda():
    """The scenarios run as on a CPU-only machine wherever the suite runs (a GPU node too)."""
    probe = "import torch; print(torch.cuda.is_available(), torch.cuda.device_count())"
    proc = subprocess.run([sys.executable, "-c", probe], env=cpu_only_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.split() == ["False", "0"], proc.stdout + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def scenario_results() -> Mapping[tuple[str, str], subprocess.CompletedProcess]:
    """Each scenario with every shim, and without each shim, forked from one process (``forked_cases.py``)."""
    runs = [*((scenario, "") for scenario in dict.fromkeys(NEEDED_BY.values())),
            *((scenario, shim) for shim, scenario in NEEDED_BY.items())]
    proc = subprocess.run([sys.executable, str(SCRIPT), "--each", *(f"{s}:{k}" for s, k in runs)],
                          capture_output=True, text=True, env=cpu_only_env(), timeout=600)
    by_key = forked_cases.results(proc)
    return {key: by_key[f"{key[0]}:{key[1]}"] for key in runs}


@pytest.mark.parametrize("shim", SHIM_NAMES)
def test_shim_is_needed_and_sufficient(scenario_results, shim):
    scenario = NEEDED_BY[shim]
    ok = scenario_results[(scenario, "")]
    assert ok.returncode == 0, f"scenario {scenario!r} fails even with every shim:\n{ok.stdout[-3000:]}"
    without = scenario_results[(scenario, shim)]
    if shim in shims_not_needed():  # this megatron-core release no longer needs it: the scenario works
        assert without.returncode == 0, without.stdout[-2000:]
        return
    assert without.returncode == 3, (
        f"scenario {scenario!r} works without shim {shim!r}: megatron-core no longer needs it "
        f"(remove it from podium/teacher/cpu/cuda_shims.py)\n{without.stdout[-2000:]}"
    )
    expected = FAILS_WITH.get(shim)
    if expected:
        assert expected in without.stdout, without.stdout[-2000:]
    else:
        assert "CUDA" in without.stdout or "cuda" in without.stdout, without.stdout[-2000:]
