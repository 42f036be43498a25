"""A podium teacher where NeMo RL's MOPD trainer holds a ``TeacherWorkerGroup``.

Owns :class:`RemoteTeacherWorkerGroup`, with every attribute and method NeMo RL (7ea279a) reads
from a teacher group, answered for a remote teacher:

=================================================  ==========================================================
NeMo RL reads (where)                              a podium teacher answers
=================================================  ==========================================================
``sharding_annotations.get_axis_size(              the teacher's data-parallel size (record): NeMo RL pads a
"data_parallel")`` (trajectory_collector.py)       call's rows to a multiple by repeating the last row and trims
                                                   the answer; podium shards the rows over its replicas itself
``get_logprobs(data)["reference_logprobs"]``       float32 ``[B, S]`` on CPU, logprob of token ``i`` at ``i``
(trajectory_collector.py)                          (0 at 0 and past the length), at the teacher's temperature
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

from podium.nemo_rl.remote import NoWorkers, RemoteTeacher, Sharding, as_batched_data_dict


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
