"""What NeMo RL (NVIDIA-NeMo/RL at 7ea279a) does with a teacher object, re-stated for the tests.

NeMo RL itself is not installed in CI (it needs CUDA builds and vLLM); these functions make the
same calls on the teacher objects, in the same order, with the same arguments and the same
handling of the results, as the upstream lines each one cites. They are written from reading that
code, not copied from it. ``tests/nemo_rl/test_dropin.py`` runs them against podium's
facades on real teachers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch


def teacher_seq_pad_multiple(groups: Mapping[str, Any], policy_make_seq_div_by: int) -> int:
    """``nemo_rl/algorithms/opd.py:208-230``: one packing mode for all teachers; unpacked, the
    policy's multiple must be divisible by every teacher's ``sequence_length_pad_multiple``."""
    modes = {group.use_sequence_packing for group in groups.values()}
    if len(modes) > 1:
        raise ValueError("All teachers must use the same sequence-packing mode.")
    if modes != {False}:
        return 1
    for alias, group in groups.items():
        if policy_make_seq_div_by % group.sequence_length_pad_multiple:
            raise ValueError(f"teacher {alias}: pad multiple {group.sequence_length_pad_multiple} does not divide "
                             f"{policy_make_seq_div_by}")
    return policy_make_seq_div_by


def readiness_refs(groups: Mapping[str, Any]) -> list[Any]:
    """``opd.py:416``: one ``__ray_ready__`` ref per worker of every group (then ``ray.get``)."""
    return [w.__ray_ready__.remote() for group in groups.values() for w in group.worker_group.workers]


def resolve_alias(agent_name: str, mapping: Mapping[str, str], default_alias: str | None) -> str:
    """``opd.py`` ``resolve_reference_aliases`` for a non-strict recipe: the agent's own name when
    it is an alias, else the default alias."""
    if agent_name in mapping:
        return agent_name
    if default_alias is None:
        raise KeyError(agent_name)
    return default_alias


class TrajectoryCollector:
    """The teacher half of ``AsyncTrajectoryCollector`` (``trajectory_collector.py:79-142, 770-899``):
    one lock per teacher group, a thread per group used by a prompt group, rows padded to the
    group's data-parallel size by repeating the last row and trimmed after."""

    def __init__(self, groups: Mapping[str, Any], alias_to_group_alias: Mapping[str, str],
                 opd_cfg: Mapping[str, Any], policy_make_seq_div_by: int) -> None:
        self.groups = dict(groups)
        self.alias_to_group_alias = dict(alias_to_group_alias)
        self.opd_cfg = opd_cfg
        self.pad_multiple = teacher_seq_pad_multiple(self.groups, policy_make_seq_div_by)
        self.locks = {key: threading.Lock() for key in self.groups}
        self.calls: list[tuple[str, int]] = []  # (group, rows sent) in call order

    def compute_teacher_logprobs(self, input_ids: torch.Tensor, agent_names: Sequence[str],
                                 input_lengths: torch.Tensor) -> torch.Tensor:
        mapping = self.opd_cfg["teacher_model_by_agent_name"]
        aliases = [resolve_alias(a, mapping, self.opd_cfg.get("default_teacher_alias")) for a in agent_names]
        keys = [self.alias_to_group_alias.get(a, a) for a in aliases]
        by_group: dict[str, list[int]] = {}
        for row, key in enumerate(keys):
            by_group.setdefault(key, []).append(row)
        batch, seq = input_ids.shape
        result = torch.zeros(batch, seq, dtype=torch.float32)

        def for_group(key: str, rows: list[int]) -> tuple[list[int], torch.Tensor]:
            group = self.groups[key]
            sub_ids, sub_lengths = input_ids[rows], input_lengths[rows]
            actual = len(rows)
            dp = group.sharding_annotations.get_axis_size("data_parallel")
            if actual % dp:
                pad = dp - actual % dp
                sub_ids = torch.cat([sub_ids, sub_ids[-1:].expand(pad, -1)], dim=0)
                sub_lengths = torch.cat([sub_lengths, sub_lengths[-1:].expand(pad)], dim=0)
            sub_data = {"input_ids": sub_ids, "input_lengths": sub_lengths}
            with self.locks[key]:
                self.calls.append((key, int(sub_ids.shape[0])))
                out = group.get_logprobs(sub_data)  # positional data, no micro_batch_size
            return rows, out["reference_logprobs"][:actual]

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(by_group)) as pool:
            futures = [pool.submit(for_group, key, rows) for key, rows in by_group.items()]
            for future in concurrent.futures.as_completed(futures):
                rows, logprobs = future.result()
                result[rows] = logprobs
        return result


def pad_to_multiple(ids: torch.Tensor, multiple: int, pad_id: int = 0) -> torch.Tensor:
    """``batched_message_log_to_flat_message(make_sequence_length_divisible_by=...)``: right-pad
    the width to a multiple."""
    width = -(-ids.shape[1] // multiple) * multiple
    return torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=pad_id)


class Timer:
    """The part of ``nemo_rl.utils.timer.Timer`` a teacher call uses: ``time(label)``."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    @contextlib.contextmanager
    def time(self, label: str) -> Iterator[None]:
        self.labels.append(label)
        yield


def distillation_step(teacher: Any, train_data: dict[str, Any], k: int, timer: Timer) -> None:
    """``nemo_rl/algorithms/distillation.py:903-917``: the teacher's part of one training step."""
    teacher.prepare_for_lp_inference()
    topk = teacher.get_topk_logits(train_data, k=k, timer=timer)
    train_data["teacher_topk_logits"] = topk["topk_logits"]
    train_data["teacher_topk_indices"] = topk["topk_indices"]
    teacher.offload_after_refit()
