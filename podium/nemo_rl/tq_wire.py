"""The rows of NeMo RL's data plane (TransferQueue) as a podium teacher reads and writes them.

NeMo RL's SingleController keeps a rollout's rows in TransferQueue under sample ids; a teacher
group is handed a ``KVBatchMeta`` (``sample_ids``, ``partition_id``, ``sequence_lengths``) and reads
and writes columns through a ``DataPlaneClient`` (``get_samples`` / ``put_samples``: NeMo RL's
``nemo_rl/data_plane/interfaces.py``). The wire layout is NeMo RL's ``data_plane/codec.py``:
per-token columns travel jagged (a ``torch.jagged`` nested tensor, row ``i`` cut to its length),
per-sample ones dense; TransferQueue may give any non-scalar column back nested.

Owns :func:`read_inputs` (``input_ids`` right-padded with 0 and ``input_lengths``) and
:func:`write_columns` (what NeMo RL's ``column_io.write_columns`` puts: per-token columns cut to
each row's length). Imports torch and tensordict when called (NeMo RL's process has both).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from podium.protocol.names import INPUT_IDS, INPUT_LENGTHS

INPUT_FIELDS = (INPUT_IDS, INPUT_LENGTHS)  # NeMo RL's TEACHER_LP_FIELDS: what a teacher reads


def _dense(value: Any, name: str) -> Any:
    """A dense tensor of a column TransferQueue gave back (a nested one right-padded with 0)."""
    import torch

    if not isinstance(value, torch.Tensor):
        raise TypeError(f"data plane column {name!r}: expected a tensor, got {type(value).__name__}")
    if not value.is_nested:
        return value
    rows = list(value.unbind())
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=0) if rows else value


def read_inputs(client: Any, meta: Any) -> tuple[np.ndarray, np.ndarray]:
    """``input_ids`` int64 ``[N, S]`` (right-padded with 0 to the longest row) and
    ``input_lengths`` int64 ``[N]`` of ``meta``'s rows, in its order. Lengths that disagree with
    ``meta.sequence_lengths`` are an error naming the first such row (the write-back is cut by
    those)."""
    td = client.get_samples(sample_ids=list(meta.sample_ids), partition_id=meta.partition_id,
                            select_fields=list(INPUT_FIELDS))
    ids = _dense(td[INPUT_IDS], INPUT_IDS).to("cpu").numpy().astype(np.int64, copy=False)
    lengths = _dense(td[INPUT_LENGTHS], INPUT_LENGTHS).to("cpu").numpy().astype(np.int64, copy=False).reshape(-1)
    rows = len(meta.sample_ids)
    if ids.ndim != 2 or ids.shape[0] != rows or lengths.shape != (rows,):
        raise ValueError(f"data plane rows of partition {meta.partition_id!r}: input_ids {list(ids.shape)} and "
                         f"input_lengths {list(lengths.shape)} do not hold {rows} rows")
    expected = meta.sequence_lengths
    if expected:
        for sample, have, want in zip(meta.sample_ids, lengths.tolist(), expected, strict=True):
            if int(have) != int(want):
                raise ValueError(f"sample {sample!r}: input_lengths {have} but the meta's sequence_lengths "
                                 f"says {want}")
    return ids, lengths


def write_columns(client: Any, meta: Any, lengths: Sequence[int], per_token: Mapping[str, Any],
                  per_sample: Mapping[str, Any] | None = None) -> None:
    """Put ``per_token`` columns (``[N, S, ...]``, row ``i`` cut to ``lengths[i]``, jagged) and
    ``per_sample`` ones (``[N, ...]``, dense) under ``meta``'s sample ids."""
    import torch
    from tensordict import TensorDict

    fields: dict[str, Any] = {}
    for name, value in per_token.items():
        tensor = torch.as_tensor(value)
        rows = [tensor[i, : int(n)] for i, n in enumerate(lengths)]
        fields[name] = torch.nested.as_nested_tensor(rows, layout=torch.jagged)
    for name, value in (per_sample or {}).items():
        fields[name] = torch.as_tensor(value).contiguous()
    client.put_samples(sample_ids=list(meta.sample_ids), partition_id=meta.partition_id,
                       fields=TensorDict(fields, batch_size=[len(meta.sample_ids)]))
