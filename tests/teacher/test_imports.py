"""Importing podium.teacher and its modules must stay cheap: no torch, ray, megatron, transformers."""

from __future__ import annotations

import pkgutil
import subprocess
import sys


def _teacher_modules() -> list[str]:
    """Every module of podium.teacher (found, not listed: a new module is checked too)."""
    import podium.teacher

    return ["podium.teacher", *(m.name for m in pkgutil.walk_packages(podium.teacher.__path__, "podium.teacher."))]


def test_teacher_modules_import_nothing_heavy():
    modules = _teacher_modules()
    assert len(modules) > 30 and "podium.teacher.compute.worker" in modules, modules  # really found
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in modules)
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
