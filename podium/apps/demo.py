"""``podium demo``: the whole path on one machine, without Slurm, in under a minute.

Makes two tiny teacher checkpoints (random weights, configs built in code, ``save_pretrained``;
nothing downloaded), writes a recipe with three aliases over them (two share one checkpoint, so
they share one teacher), brings the teachers up with ``cluster: local`` (submitit's local
executor runs the same job entry as on Slurm), calls every alias through ``podium.connect``,
compares the logprobs with an in-process transformers forward, prints a table and brings
everything down. Returns the process exit code (0 when every alias matched).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

TOLERANCE = 1e-3
RECIPE = """\
# podium demo: three agent aliases over two tiny teachers (math and code share a checkpoint).
on_policy_distillation:
  teacher_model_by_agent_name:
    math: {llama}
    code: {llama}
    chat: {qwen2}
  default_teacher_alias: chat
  non_colocated_teachers:
    default_teacher_cfg:
      tensor_model_parallel_size: 1
      num_nodes: 1
      gpus_per_node: 1
      precision: fp32
podium:
  cluster: local
  run_dir: {run_dir}
  slurm: {{gpus: false}}
  server: {{heartbeat_s: 2, stale_after_s: 10}}
  ray: {{object_store_memory_mb: 100}}
"""


def make_checkpoints(root: Path) -> dict[str, Path]:
    """Two tiny random checkpoints (Llama with GQA, Qwen2 with q/k/v biases), fixed seeds."""
    from podium.apps.tiny_models import make_tiny_checkpoint

    return {kind: make_tiny_checkpoint(kind, root / f"tiny-{kind}", num_hidden_layers=2)
            for kind in ("llama", "qwen2")}


def run_demo(keep: Path | None = None, timeout_s: float = 240.0) -> int:
    import numpy as np
    import torch
    from rich.console import Console
    from rich.table import Table
    from transformers.utils import logging as hf_logging

    from podium.apps.tiny_models import hf_oracle_logprobs
    from podium.cli_render import WaitView
    from podium.client import connect
    from podium.config.plan import load_plan
    from podium.launcher.login.status import WaitFailed, wait
    from podium.launcher.login.stop import down
    from podium.launcher.login.up import up
    from podium.rendezvous.layout import RunLayout

    console = Console()
    hf_logging.disable_progress_bar()  # the oracle's "Loading weights" bars are not the demo's output
    t0 = time.monotonic()
    root = Path(keep).absolute() if keep else Path(tempfile.mkdtemp(prefix="podium-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    console.print(f"podium demo in {root}")
    checkpoints = make_checkpoints(root / "checkpoints")
    run_dir = root / "run"
    recipe = root / "recipe.yaml"
    recipe.write_text(RECIPE.format(llama=checkpoints["llama"], qwen2=checkpoints["qwen2"], run_dir=run_dir))
    plan = load_plan(recipe)
    console.print(f"{len(plan.routes)} aliases -> {len(plan.teachers)} teachers; `podium up --wait` (cluster: local)")
    code = 1
    try:
        up(plan, run_dir)
        with WaitView(console) as view:
            wait(run_dir, timeout_s, on_update=view.update)
        t_ready = time.monotonic() - t0
        gen = torch.Generator().manual_seed(0)
        lengths = torch.tensor([7, 12, 4])
        ids = torch.randint(1, 256, (3, 12), generator=gen)
        ids[torch.arange(12)[None, :] >= lengths[:, None]] = 0
        table = Table(title="podium demo: every alias through the client vs transformers in-process",
                      title_justify="left")
        for col in ("alias", "teacher", "max |error|", "latency"):
            table.add_column(col)
        ok = True
        with connect(RunLayout(run_dir).rendezvous_path) as client:
            for alias in plan.routes:
                spec = plan.route(alias)
                start = time.perf_counter()
                got = client.get_logprobs(alias, {"input_ids": ids, "input_lengths": lengths})
                latency = time.perf_counter() - start
                expected = hf_oracle_logprobs(spec.model_name, ids, lengths)
                value = got["logprobs"] if isinstance(got, dict) else got
                err = float(np.abs(np.asarray(value, dtype=np.float32) - expected.numpy()).max())
                ok &= err < TOLERANCE
                table.add_row(alias, f"{spec.name} ({spec.key[:8]})", f"{err:.2e}", f"{latency * 1000:.0f} ms")
        console.print(table)
        console.print(f"ready after {t_ready:.1f}s; " + ("all aliases match" if ok else "[red]MISMATCH[/red]"))
        code = 0 if ok else 1
    except WaitFailed as exc:
        console.print(f"[red]podium demo: {exc}[/red]")
    finally:
        down(run_dir)
        console.print(f"brought everything down; total {time.monotonic() - t0:.1f}s")
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return code
