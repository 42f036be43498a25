"""A remote teacher behind NeMo RL's ``TeacherWorkerGroup`` interface.

Owns :class:`RemoteTeacherWorkerGroup`: ``get_logprobs(data, micro_batch_size)`` returning
``{"reference_logprobs": float32 [B, S]}`` and ``shutdown()``, so a NeMo RL trainer that held a
local teacher group can hold this instead and reach a podium teacher over the network.
``shutdown()`` closes this trainer's connections only; the teacher keeps serving other trainers
(``podium down`` stops teachers).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from podium.client.teacher import TeacherClient

logger = logging.getLogger(__name__)


class RemoteTeacherWorkerGroup:
    """NeMo RL ``TeacherWorkerGroup`` look-alike for one podium teacher."""

    def __init__(self, teacher: TeacherClient, alias_or_agent_name: str, *, top_k: Optional[int] = None) -> None:
        self.alias = alias_or_agent_name
        self.top_k = top_k
        self._teacher = teacher
        self._closed = False

    def __repr__(self) -> str:
        return f"RemoteTeacherWorkerGroup({self.alias!r} -> {self._teacher.label})"

    def get_logprobs(self, data: Mapping[str, Any], micro_batch_size: Optional[int] = None) -> dict[str, Any]:
        """``{"reference_logprobs": [B, S]}`` (+ ``reference_topk_logprobs/indices`` with ``top_k``)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is shut down")
        result = self._teacher.get_logprobs(data, top_k=self.top_k, micro_batch_size=micro_batch_size)
        out = {"reference_logprobs": result["logprobs"]}
        if self.top_k:
            out["reference_topk_logprobs"] = result["topk_logprobs"]
            out["reference_topk_indices"] = result["topk_indices"]
        return out

    def shutdown(self) -> bool:
        """Close this trainer's connections to the teacher (the teacher keeps running)."""
        if not self._closed:
            self._teacher.close()
            self._closed = True
        return True
