"""What a NeMo RL teacher block may hold and what podium does with each key.

A teacher block is ``on_policy_distillation.non_colocated_teachers.default_teacher_cfg`` or
``teacher_overrides.<alias>`` (or a teachers file's ``teachers.<alias>``, which names its checkpoint
too: :mod:`podium.config.sources`): NeMo RL's ``TeacherResourceConfig`` (``nemo_rl/algorithms/opd.py``),
whose unknown keys NeMo RL folds into ``megatron_cfg_overrides`` (``extra="allow"``), which its
teacher worker then lays over the student's ``policy.megatron_cfg``.

==============================================  ===================================================
key                                             podium
==============================================  ===================================================
the parallel sizes, ``num_nodes``,              honoured: the teacher's layout
``gpus_per_node``
``precision``                                   honoured
``micro_batch_size``,                           honoured: how the teacher batches
``max_tokens_per_microbatch``
``megatron_cfg_overrides``                      each key by :mod:`podium.config.megatron_keys`
``fp32_lm_head`` (false | true | ``"tf32"``)    honoured: the output layer's logits in fp32
                                                (:mod:`podium.teacher.model.output_gemm`); part of
                                                the teacher's identity (its key, and a conflict
                                                between aliases of one checkpoint)
``cross_tokenizer``                             refused when set: a cross-tokenizer teacher is not
                                                served yet
any other key                                   folded into ``megatron_cfg_overrides`` (as NeMo RL
                                                does) and checked there, named as the user wrote it
==============================================  ===================================================
"""

from __future__ import annotations

import functools
import re
from typing import Any, Literal

from podium.config.layout import NODE_SIZES, PARALLEL_SIZES
from podium.config.megatron_keys import FP32_LM_HEAD, valid_names
from podium.config.sources import CHECKPOINT_KEYS, DEFAULT_CFG, OVERRIDES, TEACHERS_FILE

SIZE_KEYS: tuple[str, ...] = (*NODE_SIZES, *PARALLEL_SIZES, "micro_batch_size", "max_tokens_per_microbatch")
TEACHER_KEYS: tuple[str, ...] = (*SIZE_KEYS, "precision", "megatron_cfg_overrides")
CROSS_TOKENIZER = "cross_tokenizer"
BLOCK_KEYS: tuple[str, ...] = (*TEACHER_KEYS, FP32_LM_HEAD, CROSS_TOKENIZER)

# NeMo RL's Fp32LmHeadSetting (nemo_rl/utils/fp32_lm_head.py): off, or on ("tf32" is an alias of true
# there, and its numbers are true's: podium.teacher.model.output_gemm).
Fp32LmHead = bool | Literal["tf32"]
FP32_LM_HEAD_TF32: Literal["tf32"] = "tf32"


@functools.cache
def _nemo_rl_field() -> Any:
    """The field as NeMo RL's ``TeacherResourceConfig`` validates it: pydantic's (lax) bool or
    "tf32", so a quoted "true", "off", "1" or 0 reads as NeMo RL reads it."""
    from pydantic import TypeAdapter

    return TypeAdapter(Fp32LmHead)


def fp32_lm_head_setting(value: Any) -> Fp32LmHead:
    """A teacher's ``fp32_lm_head`` as NeMo RL reads it (None: off): ``False``, ``True`` or
    ``"tf32"``; ``ValueError`` for anything NeMo RL refuses. The one check of the value: the plan
    names the recipe key in front of the message, the spec validates by it too."""
    if value is None or isinstance(value, bool):
        return bool(value)
    try:
        setting: Fp32LmHead = _nemo_rl_field().validate_python(value)
    except ValueError:  # pydantic's ValidationError is one
        raise ValueError(f'must be false, true or "{FP32_LM_HEAD_TF32}", got {value!r}') from None
    return setting


def fp32_lm_head_note(path: str, value: Fp32LmHead, precision: str) -> str | None:
    """What the plan says of a teacher asking for an fp32 LM head: only that it changes nothing
    for a teacher whose logits are fp32 already (None otherwise)."""
    if precision != "fp32":
        return None
    return (f"{path}: {value!r} changes nothing for this teacher: its precision is fp32, so its logits are fp32 "
            "already")


def cross_tokenizer_problem(path: str, value: Any) -> str | None:
    """Why a teacher block's ``cross_tokenizer`` is refused (None when it is unset or false)."""
    if value in (None, False, "", {}, []):
        return None
    return (f"{path}: a cross-tokenizer teacher is not served yet: podium serves teachers that share the "
            "student's tokenizer (it answers for the student's token ids); serve this teacher with NeMo RL's own "
            f"cross-tokenizer distillation, or remove {CROSS_TOKENIZER}")


_ALIAS_BLOCK = re.compile(rf"^{re.escape(OVERRIDES)}\.[^.]+$")
_FILE_BLOCK = re.compile(rf"^{re.escape(TEACHERS_FILE)}\.[^.]+$")


def is_teacher_block(path: str) -> bool:
    """Whether ``path`` is a teacher block (``default_teacher_cfg``, ``teacher_overrides.<alias>``,
    a teachers file's ``teachers.<alias>``)."""
    return path == DEFAULT_CFG or bool(_ALIAS_BLOCK.match(path)) or bool(_FILE_BLOCK.match(path))


def known_keys(parent: str) -> frozenset[str]:
    """The keys a recipe may give under ``parent`` by these rules (for "did you mean" on an override
    of a key the recipe lacks): a teacher block's, its ``megatron_cfg_overrides``'; else none."""
    if is_teacher_block(parent):
        return frozenset({*BLOCK_KEYS, *valid_names(), *(CHECKPOINT_KEYS if _FILE_BLOCK.match(parent) else ())})
    head, _, leaf = parent.rpartition(".")
    if leaf == "megatron_cfg_overrides" and is_teacher_block(head):
        return valid_names()
    return frozenset()
