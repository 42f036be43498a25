"""A podium teacher where NeMo RL's MOPD trainer holds a ``TeacherWorkerGroup``.

Owns :class:`RemoteTeacherWorkerGroup`, with every attribute and method NeMo RL (7ea279a, and the
top-k MOPD of NVIDIA-NeMo/RL PR #3608) reads from a teacher group, answered for a remote teacher:

=================================================  ==========================================================
NeMo RL reads (where)                              a podium teacher answers
=================================================  ==========================================================
``sharding_annotations.get_axis_size(              the teacher's data-parallel size (record): NeMo RL pads a
"data_parallel")`` (trajectory_collector.py)       call's rows to a multiple by repeating the last row and trims
                                                   the answer; podium shards the rows over its replicas itself
``get_logprobs(data)["reference_logprobs"]``       float32 ``[B, S]`` on CPU, logprob of token ``i`` at ``i``
(trajectory_collector.py)                          (0 at 0 and past the length), at the teacher's temperature
``get_topk_logprobs(data, k)`` (#3608,             ``reference_logprobs`` as above, ``topk_indices`` int64 and
trajectory_collector.py ``teacher_topk``)          ``topk_logprobs`` float32 ``[B, S, k]`` next-token aligned
                                                   (position ``t``: the distribution after ``t``), in one request
``get_logprobs_on_support(data)`` (#3608,          ``support_logprobs`` float32 ``[B, S, K]``: the logprobs of
trajectory_collector.py ``student_topk``)          ``data["topk_indices"]`` (next-token aligned), in one request
``use_sequence_packing`` (opd.py)                  ``False``: podium takes right-padded rows (it cuts them to the
                                                   longest and batches them itself)
``sequence_length_pad_multiple`` (opd.py)          ``1``: podium pads each microbatch to its own TP/CP multiple,
                                                   so any width is served (its internal multiple would make NeMo RL
                                                   refuse policies it does not divide, for nothing)
``worker_group.workers[*].__ray_ready__``          ``[]``: nothing in the trainer's Ray cluster; readiness is waited
(opd.py ``create_teacher_worker_groups``)          for when the facade is made
                                                   (:func:`podium.nemo_rl.teacher_worker_groups`)
``shutdown()`` (and ``__del__`` upstream)          closes this process's connections; the teacher keeps serving
                                                   (there is no ``__del__``: copies are pickled and collected)
=================================================  ==========================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from podium.nemo_rl.remote import NoWorkers, RemoteTeacher, Sharding, as_batched_data_dict
from podium.protocol.batch import BatchError, as_int_array, batch_inputs
from podium.protocol.names import CANDIDATE_LOGPROBS, INPUT_IDS, INPUT_LENGTHS, LOGPROBS, TOPK_INDICES, TOPK_LOGPROBS

SUPPORT_INDICES = "topk_indices"  # #3608's name for the support a caller sends (podium's candidate_ids)


class RemoteTeacherWorkerGroup(RemoteTeacher):
    """NeMo RL ``TeacherWorkerGroup`` for one podium teacher (see the module doc).

    ``top_k``: :meth:`get_logprobs` also answers the teacher's top-k logprobs and their indices.
    The other keywords are :class:`~podium.nemo_rl.remote.RemoteTeacher`'s (``options``, ``model``,
    ``client``); any other raises :class:`TypeError`."""

    use_sequence_packing = False
    use_dynamic_batches = False
    sequence_length_pad_multiple = 1
    worker_group = NoWorkers()

    def __init__(self, rendezvous_path: str | Path, alias: str, *, top_k: int | None = None, **kwargs: Any) -> None:
        super().__init__(rendezvous_path, alias, **kwargs)
        self.top_k = top_k

    @property
    def sharding_annotations(self) -> Sharding:
        """The teacher's layout as NeMo RL's ``NamedSharding`` (axes ``pipeline_parallel``,
        ``data_parallel``, ``context_parallel``, ``tensor_parallel``, read from the teacher's
        model info: waits for the teacher to be ready the first time). NeMo RL pads each call's
        rows to a multiple of ``get_axis_size("data_parallel")``."""
        return Sharding(self.model)

    def get_logprobs(self, data: Any, micro_batch_size: int | None = None) -> Any:
        """``{"reference_logprobs": float32 [B, S]}`` (a ``BatchedDataDict`` where NeMo RL is
        importable; + ``reference_topk_logprobs/indices`` when made with ``top_k``)."""
        result = self.teacher().get_logprobs(data, top_k=self.top_k, micro_batch_size=micro_batch_size)
        out = {"reference_logprobs": result["logprobs"]}
        if self.top_k:
            out["reference_topk_logprobs"] = result["topk_logprobs"]
            out["reference_topk_indices"] = result["topk_indices"]
        return as_batched_data_dict(out)

    def get_topk_logprobs(self, data: Any, k: int, micro_batch_size: int | None = None) -> Any:
        """#3608's teacher-selected support, from one request: ``reference_logprobs`` float32
        ``[B, S]`` (as :meth:`get_logprobs`), ``topk_indices`` int64 and ``topk_logprobs`` float32
        ``[B, S, k]``, position ``t`` holding the ``k`` likeliest tokens after ``t``, descending
        (exact ties by ascending id), normalised over the whole vocabulary at the teacher's
        temperature. podium answers the top-k in :meth:`get_logprobs`' alignment (position
        ``t + 1``); here it is moved back one position, so ``t ≥ length - 1`` holds zeros (ids 0),
        which the loss never reads. ``input_lengths`` defaults to the full width."""
        ids, lengths = _inputs(data)
        out = self.teacher().get_logprobs_arrays(ids, lengths, top_k=int(k), micro_batch_size=micro_batch_size,
                                                 outputs=(LOGPROBS, TOPK_LOGPROBS, TOPK_INDICES))
        return as_batched_data_dict({
            "reference_logprobs": out[LOGPROBS],
            "topk_indices": _one_back(out[TOPK_INDICES].astype(np.int64, copy=False)),
            "topk_logprobs": _one_back(out[TOPK_LOGPROBS].astype(np.float32, copy=False)),
        })

    def get_logprobs_on_support(self, data: Any, micro_batch_size: int | None = None) -> Any:
        """#3608's student-selected support: ``{"support_logprobs": float32 [B, S, K]}``, the
        teacher's logprobs (whole vocabulary, its temperature) of ``data["topk_indices"] [B, S, K]``
        (``K ≥ 1``; position ``t``: ids of the token after ``t``, podium's ``candidate_ids``
        alignment), from one request; zeros at ``t ≥ length - 1``, which the loss never reads.
        ``input_lengths`` defaults to the full width (#3608 sends none when the trainer has none)."""
        if SUPPORT_INDICES not in data:
            raise BatchError(f"get_logprobs_on_support needs data[{SUPPORT_INDICES!r}] [B, S, K]")
        support = as_int_array(data[SUPPORT_INDICES], SUPPORT_INDICES)
        ids, lengths = _inputs(data)
        if support.ndim != 3 or support.shape[:2] != ids.shape or support.shape[2] < 1:
            raise BatchError(f"{SUPPORT_INDICES!r}: shape {list(support.shape)} must be [B, S, K] with "
                             f"[B, S] = {list(ids.shape)} and K >= 1")
        out = self.teacher().get_logprobs_arrays(ids, lengths, micro_batch_size=micro_batch_size,
                                                 outputs=(CANDIDATE_LOGPROBS,), candidate_ids=support)
        return as_batched_data_dict({"support_logprobs": out[CANDIDATE_LOGPROBS].astype(np.float32, copy=False)})


def _inputs(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` and ``input_lengths`` (default: every row full, as NeMo RL's teacher reads a
    batch without lengths); ``topk_indices`` is #3608's support, not refused as an unknown key."""
    inputs = {key: value for key, value in data.items() if key != SUPPORT_INDICES}
    if INPUT_LENGTHS not in inputs and INPUT_IDS in inputs:
        rows, width = np.shape(inputs[INPUT_IDS])
        inputs[INPUT_LENGTHS] = np.full(rows, width, dtype=np.int64)
    return batch_inputs(inputs)


def _one_back(values: np.ndarray) -> np.ndarray:
    """``[B, S, ...]`` moved one position back (``out[:, t] = values[:, t + 1]``, the last column 0):
    from the alignment of the token a distribution produced to that of the position it follows."""
    out = np.zeros_like(values)
    out[:, :-1] = values[:, 1:]
    return out
