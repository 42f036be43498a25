"""Importing podium.teacher and its modules must stay cheap: no torch, ray, megatron, transformers."""

from __future__ import annotations

import subprocess
import sys

MODULES = ["podium.teacher", "podium.teacher.compute.group", "podium.teacher.compute.worker",
           "podium.teacher.model.convert",
           "podium.teacher.model.hf", "podium.teacher.model.megatron_config", "podium.teacher.model.megatron_patches",
           "podium.teacher.model.megatron_model", "podium.teacher.compute.logprobs",
           "podium.teacher.model.torch_dist", "podium.teacher.model.checkpoint_loader", "podium.teacher.cpu.cuda_shims",
           "podium.teacher.cpu.mamba_shims"]


def test_teacher_modules_import_nothing_heavy():
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in MODULES)
        + "print(sorted(m for m in ('torch', 'ray', 'megatron', 'transformers', 'safetensors') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_client_and_teacher_never_import_each_other():
    """A trainer that imports the client loads no teacher module, and the teacher side loads no
    client module: both sides share only ``podium.protocol``."""
    code = (
        "import sys, importlib\n"
        "side, other = sys.argv[1], sys.argv[2]\n"
        "for m in sys.argv[3:]: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m == other or m.startswith(other + '.')))\n"
    )
    teacher_side = ["podium.teacher.endpoint", "podium.teacher.compute.group", "podium.teacher.compute.worker"]
    for side, other, modules in (("client", "podium.teacher", ["podium.client", "podium.nemo_rl"]),
                                 ("teacher", "podium.client", teacher_side)):
        out = subprocess.run([sys.executable, "-c", code, side, other, *modules], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[]", f"importing the {side} side loaded {out.stdout.strip()}"
