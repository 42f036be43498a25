"""``benchmarks/gpu_check.sh``: what runs without a GPU (the argument checks, each model as podium
plans and builds it, the HF models on the meta device, the report). The measurements need a
GPU; without one (hidden on a GPU node) the script says so and exits 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
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


def test_dry_run_describes_a_nemotron_model_at_realistic_widths(capsys):
    """The Nemotron-style model: Nano's widths with a latent MoE, a few layers of each kind."""
    assert _module().main(["--dry-run", "--models", "nemotron", "--seq", "512"]) == 0
    report = json.loads(capsys.readouterr().out)
    (name,) = report["models"]
    nemotron = report["models"][name]
    assert name == "nemotron" and nemotron["architecture"] == "NemotronHForCausalLM"
    assert nemotron["hidden"] == 2688 and nemotron["mamba_heads"] == 64 and nemotron["mamba_groups"] == 8
    assert nemotron["layer_kinds"] == {"M": 4, "*": 2, "E": 4} and nemotron["moe_latent_size"] == 1024
    assert nemotron["experts"] == 64 and nemotron["dispatcher"] == "alltoall"
    assert 1.5e9 < nemotron["parameters"] < 2.5e9
    # 6 of 64 experts per token, each on the 1024-wide latent (up and down, not gated)
    idle = 4 * (64 - 6) * 2 * 1024 * 1856
    assert nemotron["active_parameters"] == nemotron["parameters"] - 131072 * 2688 - idle
    assert nemotron["flops_per_token"] > 2 * nemotron["active_parameters"]  # + attention + the SSD scan


@pytest.mark.parametrize(("args", "message"), [(["--models", "huge"], "--models: unknown ['huge']"),
                                           (["--seq", "0"], "--seq must be >= 1")])
def test_bad_arguments_exit_2_naming_them(args, message):
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_without_a_gpu_the_measurement_says_so(no_cuda, capsys):
    assert _module().main(["--models", "moe"]) == 2
    assert "no CUDA device here" in capsys.readouterr().err


def test_its_ray_uses_a_token_of_its_own(tmp_path):
    """The measurement's ``ray.init()`` starts a local Ray: with its own token in the run's work dir,
    named before Ray is imported, it neither reads nor writes ``~/.ray/auth_token`` (Ray 2.60 would
    write one there, and that file changes every later ``ray start`` of the account)."""
    child = ("import json, os, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import gpu_check; "
             "gpu_check.use_own_ray_token(Path(sys.argv[2])); "
             "print(json.dumps({k: os.environ.get(k) for k in "
             "('RAY_AUTH_MODE', 'RAY_AUTH_TOKEN_PATH', 'RAY_AUTH_TOKEN')}))")
    env = {**os.environ, "HOME": str(tmp_path), "RAY_AUTH_TOKEN": "0" * 64}
    proc = subprocess.run([sys.executable, "-c", child, str(ROOT / "benchmarks"), str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    token = tmp_path / "ray_auth_token"
    assert json.loads(proc.stdout.splitlines()[-1]) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                                                        "RAY_AUTH_TOKEN": None}
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    assert not (tmp_path / ".ray").exists()
    # after Ray is imported it is too late (Ray has read RAY_AUTH_*): it says so instead of a refused driver
    import ray  # noqa: F401

    with pytest.raises(RuntimeError, match="before Ray is imported"):
        _module().use_own_ray_token(tmp_path)
