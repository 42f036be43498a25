"""A stand-in teacher group: an HF ``transformers`` forward inside one Ray actor on the job's head.

Not the product's group (that is ``podium.teacher.group.TeacherWorkerGroup``, Megatron-core): this
one exists so that the launcher's plumbing (Slurm, Ray bootstrap, endpoint, records, client) can be
exercised where the Megatron group is unavailable. Select it with
``PODIUM_GROUP_FACTORY=podium.launcher.reference_group:HFReferenceGroup``. Same output convention
as the real group (NeMo RL): float32 ``[B, S]``, position 0 and positions at or past the length 0.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from podium.config.spec import TeacherSpec

logger = logging.getLogger(__name__)


def _forward(model: Any, input_ids: Any, input_lengths: Any, top_k: Optional[int]) -> dict[str, Any]:
    import torch

    ids = torch.as_tensor(input_ids).long()
    lengths = torch.as_tensor(input_lengths).long()
    batch, seq = ids.shape
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    out = torch.zeros(batch, seq, dtype=torch.float32)
    out[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    out = out * mask
    out[:, 0] = 0
    result: dict[str, Any] = {"logprobs": out}
    if top_k:
        shifted = torch.zeros_like(logp)
        shifted[:, 1:] = logp[:, :-1]
        values, indices = torch.topk(shifted, top_k, dim=-1)
        keep = mask.clone()
        keep[:, 0] = 0
        result["topk_logprobs"] = values * keep[..., None]
        result["topk_indices"] = indices * keep[..., None]
    return result


class _Worker:
    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()

    def info(self) -> dict[str, Any]:
        cfg = self.model.config
        return {"vocab_size": int(cfg.vocab_size),
                "max_sequence_length": int(getattr(cfg, "max_position_embeddings", 0) or 0) or None}

    def get_logprobs(self, input_ids: Any, input_lengths: Any, top_k: Optional[int]) -> dict[str, Any]:
        return _forward(self.model, input_ids, input_lengths, top_k)


class HFReferenceGroup:
    """``TeacherWorkerGroup``'s interface over one Ray actor running transformers."""

    sequence_length_multiple = 1

    def __init__(self, spec: TeacherSpec) -> None:
        import ray

        self.spec = spec
        self.checkpoint_path = spec.model_name
        actor = ray.remote(num_cpus=1)(_Worker)
        self._actor = actor.remote(spec.model_name)
        info = ray.get(self._actor.info.remote())
        self.vocab_size: int = info["vocab_size"]
        self.max_sequence_length: Optional[int] = info["max_sequence_length"]
        logger.info("reference group for %r loaded %s", spec.name, spec.model_name)

    def validate(self, data: Mapping[str, Any]) -> None:
        ids = data["input_ids"]
        if int(ids.max()) >= self.vocab_size or int(ids.min()) < 0:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")

    def get_logprobs(self, data: Mapping[str, Any], micro_batch_size: Optional[int] = None,
                     top_k: Optional[int] = None) -> dict[str, Any]:
        import ray

        return ray.get(self._actor.get_logprobs.remote(data["input_ids"], data["input_lengths"], top_k))

    def shutdown(self) -> None:
        import ray

        ray.kill(self._actor)
