"""Negative controls: the scaffold the weight maps' controls scripts share.

A control loads a model wrongly on purpose (a slice, a route, a gate gone wrong) and measures how far
its logits are from HF transformers': the right map must match and every wrong one must not, or the
oracle tests could not catch that mistake. Each family's script (``moe_controls.py``,
``kv_groups_controls.py``, ``nemotron_controls.py``) holds only its variants, a function
``diffs(checkpoint, parallel) -> {variant: largest logit difference, or the loader's error}`` run on
every rank, and ends with ``sys.exit(controls.main(diffs, PARALLEL))``.

- ``run(script, tmp, checkpoints)`` (the test's side): runs ``python SCRIPT OUT.json CHECKPOINT...``
  and returns ``{checkpoint: {variant: ...}}``;
- ``main(diffs, parallel)`` (the script's side): two ranks (spawn) with CUDA's shims, parallel state
  at ``parallel``, ``diffs`` for each checkpoint in one pair of processes (the imports are most of
  the cost); rank 0 writes the JSON;
- ``reference(checkpoint)``: its description, the batch every control runs and HF's logits for it;
- ``logit_diff(model, ids, expected, vocab)``: the model's forward, gathered over TP, against them;
- ``loaded(desc, checkpoint, parallel, layout)``: a variant's model built and loaded as podium does;
  ``expert_layout(padded, parallel)``: the layout of a TP1 control whose experts are split over EP.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

WORLD = 2
Diffs = dict[str, Any]  # variant -> largest logit difference from HF (float), or why it was refused (str)


def run(script: str, tmp: Path, checkpoints: Sequence[Path]) -> dict[str, Diffs]:
    """Run the controls script ``script`` (beside this file) on ``checkpoints``; its ``{checkpoint: diffs}``."""
    out = tmp / "diffs.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name(script)), str(out), *map(str, checkpoints)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def main(diffs: Callable[[str, dict[str, int]], Diffs], parallel: dict[str, int]) -> int:
    """A controls script's entry point: ``argv`` is ``OUT.json CHECKPOINT...``."""
    import torch.multiprocessing as mp

    out, checkpoints = sys.argv[1], sys.argv[2:]
    tmp = tempfile.mkdtemp(prefix="controls-")
    mp.start_processes(_rank, args=(WORLD, f"file://{tmp}/store", diffs, parallel, checkpoints, out), nprocs=WORLD,
                       join=True, start_method="spawn")
    return 0


def _rank(rank: int, world: int, store: str, diffs: Callable[[str, dict[str, int]], Diffs],
          parallel: dict[str, int], checkpoints: list[str], out: str) -> None:
    from podium.teacher.cpu.cuda_shims import apply_cuda_shims
    from podium.teacher.model.parallel import destroy_parallel, init_parallel

    apply_cuda_shims()
    init_parallel(rank, world, store, parallel)
    try:
        result = {checkpoint: diffs(checkpoint, parallel) for checkpoint in checkpoints}
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(result, fh)
    finally:
        destroy_parallel()


def reference(checkpoint: str) -> tuple[Any, Any, Any]:
    """(its description, token ids [2, 12], HF's logits for them): the batch every control runs."""
    import torch

    from podium.apps.tiny_models import hf_oracle_logits, random_batch
    from podium.teacher.model.checkpoint_loader import describe_model

    desc = describe_model(checkpoint)
    ids = random_batch(desc.vocab_size, [12, 12], seed=7)["input_ids"]
    expected = hf_oracle_logits(checkpoint, ids, torch.full((2,), 13))  # every position valid
    return desc, ids, expected


def logit_diff(model: Any, ids: Any, expected: Any, vocab: int) -> float:
    """The largest difference between the model's logits (its forward, gathered over TP, the padded
    vocabulary cut off) and ``expected``."""
    import torch
    from megatron.core import parallel_state

    with torch.no_grad():
        local = model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), None)
    pieces = [torch.empty_like(local) for _ in range(parallel_state.get_tensor_model_parallel_world_size())]
    torch.distributed.all_gather(pieces, local.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    logits = torch.cat(pieces, dim=-1)[..., :vocab]
    return float((logits.float() - expected).abs().max())


def loaded(desc: Any, checkpoint: str, parallel: dict[str, int], layout: Any, *,
           window_on_every_layer: bool = False) -> Any:
    """``desc``'s model built as podium builds it at ``parallel`` and ``checkpoint`` loaded into it with
    ``layout`` (the loader's refusals raise); ``window_on_every_layer``: megatron's default for a
    sliding window, what podium's attention did before per-layer windows."""
    from podium.teacher.model.hf import load_hf_weights
    from podium.teacher.model.megatron_config import build_transformer_config
    from podium.teacher.model.megatron_model import build_gpt_model

    config = build_transformer_config(desc, parallel, "fp32")
    if window_on_every_layer:
        config.window_attn_skip_freq = None
    model = build_gpt_model(desc, config, layout.padded_vocab_size)
    load_hf_weights(model, checkpoint, desc, layout)
    return model


def expert_layout(padded: int, parallel: dict[str, int]) -> Any:
    """A TP1 control's layout: the whole vocabulary, this rank's share of the experts over EP."""
    from megatron.core import parallel_state

    from podium.teacher.model.hf import RankLayout

    return RankLayout(tp_rank=0, tp_size=1, padded_vocab_size=padded,
                      ep_rank=parallel_state.get_expert_model_parallel_rank(),
                      ep_size=parallel["expert_model_parallel_size"])
