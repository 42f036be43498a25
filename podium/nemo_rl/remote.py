"""What both NeMo RL facades share: one podium teacher, reached lazily and picklably.

NeMo RL hands its teacher objects to other processes (the MOPD trajectory collector is a Ray actor
in its own virtualenv: the dict of teachers is pickled into it), and garbage-collects every copy.
So a facade holds only what names its teacher (the rendezvous path, the alias, the client
options, the teacher's model info) and connects on first use in each process; pickling drops the
connection, and no facade ever stops its teacher (``podium down`` does; a teacher serves many
trainers). A facade is made from a rendezvous path, or on a client a trainer already holds
(:meth:`RemoteTeacher.from_client`). :class:`Sharding` is the piece of NeMo RL's ``NamedSharding``
that its call sites read. Importing this module needs no torch; :func:`as_batched_data_dict`
(every facade's answer) does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from podium.client.client import PodiumClient
from podium.client.options import ClientOptions
from podium.client.teacher import TeacherClient
from podium.rendezvous.records import ModelInfo

T = TypeVar("T", bound="RemoteTeacher")

# NeMo RL's axis names (TeacherWorkerGroup.sharding_annotations), by podium's Megatron size names.
AXES = {
    "pipeline_parallel": "pipeline_model_parallel_size",
    "data_parallel": None,  # from the model info's data_parallel_size
    "context_parallel": "context_parallel_size",
    "tensor_parallel": "tensor_model_parallel_size",
}


class Sharding:
    """The teacher's layout as NeMo RL's ``NamedSharding`` answers it: ``get_axis_size(name)``,
    ``shape``, ``names``, ``size``, ``ndim`` (read by NeMo RL's MOPD fan-out, which pads each
    call's rows to a multiple of ``get_axis_size("data_parallel")``)."""

    def __init__(self, model: ModelInfo) -> None:
        sizes = model.parallel_sizes
        self.shape: dict[str, int] = {
            axis: int(model.data_parallel_size) if key is None else int(sizes.get(key, 1)) for axis, key in AXES.items()
        }

    @property
    def names(self) -> list[str]:
        return list(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        total = 1
        for value in self.shape.values():
            total *= value
        return total

    def get_axis_size(self, name: str) -> int:
        try:
            return self.shape[name]
        except KeyError:
            raise KeyError(f"no axis {name!r}; the teacher's axes are {self.names}") from None

    def __repr__(self) -> str:
        return f"Sharding({self.shape})"


class NoWorkers:
    """``worker_group`` of a remote teacher: NeMo RL's readiness check (``ray.get`` of every
    worker's ``__ray_ready__``) has nothing to wait for in the trainer's Ray cluster; readiness
    was waited for when the facade was made."""

    workers: ClassVar[list[Any]] = []


def as_batched_data_dict(values: dict[str, Any]) -> Any:
    """NeMo RL's ``BatchedDataDict`` of ``values`` as CPU torch tensors (whatever the client's
    ``return_type``) where NeMo RL is importable, else a dict (its call sites only index it)."""
    import torch

    values = {name: torch.as_tensor(value) for name, value in values.items()}
    try:
        from nemo_rl.distributed.batched_data_dict import BatchedDataDict
    except ImportError:
        return values
    return BatchedDataDict(values)


class RemoteTeacher:
    """One podium teacher for a NeMo RL facade (see the module doc).

    ``rendezvous_path``: the run's ``rendezvous.json`` (or run dir); ``alias``: the teacher's alias
    or an agent name it serves. ``options``: the client's :class:`ClientOptions` (default: those of
    ``client``, else the defaults); ``model``: the teacher's model info when already known (else
    read when first needed, waiting for the teacher to be ready); ``client``: a client to reach the
    teacher through (its owner closes it; default: one made in each process on first use)."""

    def __init__(self, rendezvous_path: str | Path, alias: str, *, options: ClientOptions | None = None,
                 model: ModelInfo | None = None, client: PodiumClient | None = None) -> None:
        self.rendezvous_path = str(rendezvous_path)
        self.alias = alias
        self._options = options if options is not None else (client.options if client is not None else None)
        self._model = model
        self._client = client
        self._owns_client = client is None
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def from_client(cls: type[T], client: PodiumClient, alias: str, **kwargs: Any) -> T:
        """The facade of ``client``'s teacher for ``alias``, on that client's connections (which
        stay its owner's to close); ``kwargs``: the facade's own (``top_k=...``)."""
        client.teacher(alias)  # an unknown alias fails here
        return cls(client.layout.rendezvous_path, alias, client=client, **kwargs)

    # -- pickling: names travel, connections do not ---------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_client=None, _owns_client=True, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- the teacher ------------------------------------------------------------------------------------

    def teacher(self) -> TeacherClient:
        """The teacher's client in this process (connecting on first use)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is shut down")
        with self._lock:
            if self._client is None:
                self._client = PodiumClient(self.rendezvous_path, options=self._options)
                self._owns_client = True
            return self._client.teacher(self.alias)

    @property
    def model(self) -> ModelInfo:
        """The teacher's model info (waits for it to be ready the first time, if it was not)."""
        if self._model is None:
            record = self.teacher().wait_ready()
            if record.model is None:
                raise RuntimeError(f"teacher {self.alias!r}: its ready record carries no model info")
            self._model = record.model
        return self._model

    @property
    def model_name(self) -> str:
        """The checkpoint the teacher serves (NeMo RL's ``model_name``)."""
        return self.model.model_name or self.model.checkpoint_path or self.model.served_name

    def close(self) -> None:
        """Close this process's connections to the teacher (those of a client it was given stay
        open: that client's owner closes them); the teacher keeps serving."""
        with self._lock:
            if self._client is not None and self._owns_client:
                self._client.close()
            self._client = None
            self._closed = True

    def shutdown(self) -> bool:
        """NeMo RL's ``shutdown()`` of a teacher: :meth:`close` (the teacher keeps running)."""
        self.close()
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.alias!r} at {self.rendezvous_path})"

