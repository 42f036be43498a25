"""``benchmarks/gpu_check.sh``: what runs without a GPU (the argument checks, both models as podium
plans and builds them, the HF models on the meta device, the report). The measurements need a
GPU; without one (hidden on a GPU node) the script says so and exits 2."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.megatron]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_builds_both_models_and_reports(capsys):
    assert _module().main(["--dry-run", "--seq", "512"]) == 0
    report = json.loads(capsys.readouterr().out)
    dense, moe = report["models"]["dense"], report["models"]["moe"]
    assert 0.9e9 < dense["parameters"] < 1.1e9 and dense["architecture"] == "LlamaForCausalLM"
    assert moe["architecture"] == "Qwen3MoeForCausalLM" and moe["experts"] == 8 and moe["dispatcher"] == "alltoall"
    # a token visits 2 of 8 experts: far fewer active parameters than stored
    assert moe["active_parameters"] < 0.5 * moe["parameters"]
    assert dense["flops_per_token"] > 2 * dense["active_parameters"]  # + attention


@pytest.mark.parametrize(("args", "message"), [(["--models", "huge"], "--models: unknown ['huge']"),
                                           (["--seq", "0"], "--seq must be >= 1")])
def test_bad_arguments_exit_2_naming_them(args, message):
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_without_a_gpu_the_measurement_says_so(no_cuda, capsys):
    assert _module().main(["--models", "moe"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
