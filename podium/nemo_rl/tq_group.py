"""A podium teacher where NeMo RL's SingleController holds a ``TeacherWorkerGroup`` (MOPD over
TransferQueue, NVIDIA-NeMo/RL #3768 and the full-vocabulary payloads of #3978/#4045).

Owns :class:`RemoteTQTeacherGroup`: what the SingleController's ``TQTeacherLogprobCoordinator``
(``nemo_rl/algorithms/opd.py``) and its setup read from a teacher group, answered for a remote one:

=================================================  ==========================================================
NeMo RL reads                                      a podium teacher answers
=================================================  ==========================================================
``setup_data_plane(dp_cfg)`` (setup, driver)       keeps ``dp_cfg``; connects nowhere (the group is then
                                                   pickled into the SingleController actor)
``get_logprobs_from_meta(meta)`` (coordinator,     reads ``input_ids``/``input_lengths`` of every row of
in a thread, one call at a time per group)         ``meta`` (pad rows included) from the data plane, asks the
                                                   teacher, writes ``teacher_reference_logprobs`` (float32,
                                                   0 at 0, cut to each row's length) and, with
                                                   ``full.enabled``, from the same request, the payload
                                                   (``teacher_full_hidden_states`` [N,S,H] |
                                                   ``teacher_full_logits`` [N,S,V] in ``payload_dtype``, cut
                                                   likewise) + for hidden states ``opd_full_teacher_index``
                                                   (int64 [N], per sample: ``teacher_index``);
                                                   returns None; raises on any failure (a teacher stopped for
                                                   good at once: :class:`~podium.client.TeacherStoppedError`)
``sharding_annotations.get_axis_size(...)``        the teacher's layout (its data-parallel size: the
                                                   coordinator pads each prompt group to a multiple of it)
``alias``, ``model_name``, ``teacher_index``,      the primary alias; the recipe's checkpoint (the student
``cfg["model_name"]``                              loads the teacher's LM head from it); the rank of that
                                                   checkpoint among the run's sorted (checkpoint, alias)
``shutdown()``                                     closes this process's connections; the teacher keeps serving
=================================================  ==========================================================

The data-plane client is made in the process that first calls the group, by ``data_plane_client``
(default :func:`nemo_rl_data_plane_client`: NeMo RL's ``build_data_plane_client(dp_cfg,
bootstrap=False)``, as its own teacher workers connect); any picklable callable of ``dp_cfg``
stands in for it. Pickling drops every connection.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from podium.nemo_rl import tq_wire
from podium.nemo_rl.worker_group import RemoteTeacherWorkerGroup
from podium.protocol.names import LOGPROBS

TEACHER_LOGPROBS_FIELD = "teacher_reference_logprobs"  # TQTeacherLogprobCoordinator.teacher_logprobs_field
FULL_CONFIG_KEY = "on_policy_distillation_full"  # what NeMo RL's setup puts on the policy config a teacher reads
PAYLOAD_FIELDS = {"hidden_states": "teacher_full_hidden_states", "logits": "teacher_full_logits"}
TEACHER_INDEX_FIELD = "opd_full_teacher_index"  # hidden-state payloads only: which LM head projects a row
PAYLOAD_DATATYPES = {"bfloat16": "BF16", "float16": "FP16", "float32": "FP32"}  # NeMo RL's -> the wire's


def nemo_rl_data_plane_client(dp_cfg: Any) -> Any:
    """NeMo RL's data-plane client in this process, connected to the running controller (never
    bootstrapping one: the SingleController's driver did)."""
    from nemo_rl.data_plane import build_data_plane_client

    return build_data_plane_client(dp_cfg, bootstrap=False)


@dataclass(frozen=True)
class FullPayload:
    """Full-vocabulary MOPD's teacher payload: ``payload`` (``hidden_states`` | ``logits``) in
    ``dtype`` (NeMo RL's name) into column ``field``, + the teacher index into ``index_field``."""

    payload: str
    dtype: str
    field: str
    index_field: str | None

    @property
    def datatype(self) -> str:
        """The wire's name of :attr:`dtype` (``payload_datatype``)."""
        return PAYLOAD_DATATYPES[self.dtype]

    @classmethod
    def of(cls, policy_config: Mapping[str, Any], opd_cfg: Mapping[str, Any]) -> FullPayload | None:
        """From what NeMo RL's teacher reads (``policy_config["on_policy_distillation_full"]``, which
        its setup resolves from the recipe), else the recipe's ``on_policy_distillation.full`` with
        NeMo RL's defaults (``OnPolicyDistillationFullConfig``); None when off."""
        resolved = policy_config.get(FULL_CONFIG_KEY) or {}
        full = resolved or opd_cfg.get("full") or {}
        if not resolved and not full.get("enabled"):
            return None
        payload = full.get("teacher_payload", "hidden_states")
        if payload not in PAYLOAD_FIELDS:
            raise ValueError(f"on_policy_distillation.full.teacher_payload: {payload!r} is not one of "
                             f"{sorted(PAYLOAD_FIELDS)}")
        dtype = full.get("payload_dtype", "bfloat16")
        if dtype not in PAYLOAD_DATATYPES:
            raise ValueError(f"on_policy_distillation.full.payload_dtype: {dtype!r} is not one of "
                             f"{sorted(PAYLOAD_DATATYPES)}")
        # NeMo RL's opd_full_payload_field / opd_full_teacher_index_field: only hidden states need the
        # teacher's index (the student picks the LM head that projects the row by it)
        index_field = TEACHER_INDEX_FIELD if payload == "hidden_states" else None
        return cls(payload, dtype, resolved.get("payload_field", PAYLOAD_FIELDS[payload]),
                   resolved.get("teacher_index_field", index_field))


class RemoteTQTeacherGroup(RemoteTeacherWorkerGroup):
    """NeMo RL's SingleController ``TeacherWorkerGroup`` for one podium teacher (see the module doc).

    ``model_name``: the recipe's checkpoint for it; ``teacher_index``: its rank (see the module doc);
    ``cfg``: the student's policy config with ``model_name`` set, as NeMo RL builds a teacher's;
    ``full``: the payload to write besides the logprobs; ``data_plane_client``: makes the
    data-plane client from ``dp_cfg`` in the calling process. The other keywords are
    :class:`~podium.nemo_rl.remote.RemoteTeacher`'s (``options``, ``model``, ``client``). It also
    answers the legacy ``get_logprobs`` (:class:`RemoteTeacherWorkerGroup`)."""

    def __init__(self, rendezvous_path: str | Path, alias: str, *, model_name: str, teacher_index: int,
                 cfg: Mapping[str, Any] | None = None, full: FullPayload | None = None,
                 data_plane_client: Callable[[Any], Any] = nemo_rl_data_plane_client, **kwargs: Any) -> None:
        super().__init__(rendezvous_path, alias, **kwargs)
        self.recipe_model_name = str(model_name)
        self.teacher_index = int(teacher_index)
        self.cfg: dict[str, Any] = {**copy.deepcopy(dict(cfg or {})), "model_name": self.recipe_model_name}
        self.full = full
        self._make_data_plane_client = data_plane_client
        self._dp_cfg: Any = None
        self._dp_client: Any = None
        self._dp_lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The recipe's checkpoint (NeMo RL's ``TeacherWorkerGroup.model_name``)."""
        return self.recipe_model_name

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_dp_client=None, _dp_lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._dp_lock = threading.Lock()

    def setup_data_plane(self, dp_cfg: Any) -> None:
        """Keep the data-plane config; the client is made where the group is first called."""
        self._dp_cfg = dp_cfg

    def data_plane(self) -> Any:
        """This process's data-plane client (made on first use)."""
        with self._dp_lock:
            if self._dp_client is None:
                if self._dp_cfg is None:
                    raise RuntimeError(f"teacher {self.alias!r}: setup_data_plane(dp_cfg) was not called "
                                       "before get_logprobs_from_meta")
                self._dp_client = self._make_data_plane_client(self._dp_cfg)
            return self._dp_client

    def get_logprobs_from_meta(self, meta: Any) -> None:
        """Answer every row of ``meta`` into the data plane (see the module doc)."""
        if not meta.sample_ids:
            return
        client = self.data_plane()
        ids, lengths = tq_wire.read_inputs(client, meta)
        per_token: dict[str, Any] = {}
        per_sample: dict[str, Any] = {}
        if self.full is None:
            out = self.teacher().get_logprobs_arrays(ids, lengths, outputs=(LOGPROBS,))
        else:
            out = self._with_payload(ids, lengths, per_token)
            if self.full.index_field is not None:  # one teacher per group: its index on every row
                per_sample[self.full.index_field] = np.full(len(lengths), self.teacher_index, dtype=np.int64)
        per_token[TEACHER_LOGPROBS_FIELD] = out[LOGPROBS]
        tq_wire.write_columns(client, meta, lengths.tolist(), per_token, per_sample)

    def _with_payload(self, ids: np.ndarray, lengths: np.ndarray, per_token: dict[str, Any]) -> dict[str, Any]:
        """One request for the logprobs and the payload (the teacher computes both from one
        forward); the payload goes into ``per_token`` as the torch tensor of the asked dtype the
        client hands over (``[N, S, D]``, 0 past each length: cut to the lengths on the way out)."""
        import torch

        from podium.protocol.query import ask

        assert self.full is not None
        out = self.teacher().infer(ids, lengths, ask(outputs=[LOGPROBS, self.full.payload],
                                                     payload_datatype=self.full.datatype))
        payload = torch.as_tensor(out[self.full.payload])
        want = getattr(torch, self.full.dtype)
        if payload.dtype != want or tuple(payload.shape[:2]) != ids.shape:
            raise RuntimeError(f"teacher {self.alias!r}: {self.full.payload} came back {payload.dtype} "
                               f"{list(payload.shape)}; asked {want} for input_ids {list(ids.shape)}")
        per_token[self.full.field] = payload
        return out
