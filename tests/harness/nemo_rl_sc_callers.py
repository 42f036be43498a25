"""What NeMo RL's SingleController MOPD does with its teacher groups, re-stated for the tests.

NVIDIA-NeMo/RL at PR #3768's head (7e7d721; the full-vocabulary pieces at 0054c4e) is not installed
in CI (it is not on PyPI). These classes and functions make the same calls, in the same order,
with the same arguments and the same handling of the results, as the upstream lines each one
cites; they are written from reading that code, not copied from it. They run over the real
``transferqueue`` package on the test session's Ray cluster. ``tests/nemo_rl/test_single_controller.py``
runs them against ``podium.nemo_rl``'s facades on real teachers.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict

TEACHER_LP_FIELDS = ("input_ids", "input_lengths")  # data_plane/schema.py (0054c4e)
SC_ROLLOUT_SCHEMA_FIELDS = (  # data_plane/schema.py:41-46 (7e7d721) + the full-vocabulary columns (0054c4e)
    "input_ids", "input_lengths", "generation_logprobs", "prev_logprobs", "reference_policy_logprobs",
    "advantages", "token_mask", "sample_mask", "prompt_ids_for_adv", "total_reward",
    "teacher_reference_logprobs", "teacher_full_hidden_states", "teacher_full_logits", "opd_full_teacher_index",
)
OPD_FULL_FIELDS = ("teacher_full_hidden_states", "teacher_full_logits")  # data_plane/schema.py (0054c4e)
TOKEN_ALIGNED_FIELDS = frozenset({  # data_plane/column_io.py:37-49 (+ OPD_FULL_FIELDS, 0054c4e)
    "input_ids", "generation_logprobs", "prev_logprobs", "reference_policy_logprobs", "teacher_reference_logprobs",
    *OPD_FULL_FIELDS, "advantages", "token_mask", "sample_mask",
})
DP_CFG = {"enabled": True, "impl": "transfer_queue", "backend": "simple", "storage_capacity": 4096,
          "num_storage_units": 1, "claim_meta_poll_interval_s": 0.05}


# -- data_plane/interfaces.py: KVBatchMeta (the part the coordinator and a teacher use) ----------------

@dataclass
class KVBatchMeta:
    """``interfaces.py:94-235``: sample ids of one partition and their per-row metadata."""

    partition_id: str
    task_name: str | None
    sample_ids: list[str]
    fields: list[str] | None = None
    sequence_lengths: list[int] | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    tags: list[dict[str, Any]] | None = None

    @property
    def size(self) -> int:
        return len(self.sample_ids)

    def slice(self, start: int, stop: int) -> KVBatchMeta:
        lengths = self.sequence_lengths[start:stop] if self.sequence_lengths is not None else None
        return replace(self, sample_ids=self.sample_ids[start:stop], sequence_lengths=lengths)

    def concat(self, *others: KVBatchMeta) -> KVBatchMeta:
        metas = (self, *others)
        lengths = ([n for m in metas for n in (m.sequence_lengths or [])]
                   if all(m.sequence_lengths is not None for m in metas) else None)
        return replace(self, sample_ids=[s for m in metas for s in m.sample_ids], sequence_lengths=lengths)

    def with_fields(self, names: Sequence[str]) -> KVBatchMeta:
        return replace(self, fields=list(dict.fromkeys([*(self.fields or []), *names])))


# -- data_plane/adapters/transfer_queue.py: the client, simple backend -------------------------------

def _from_wire(td: TensorDict) -> dict[str, torch.Tensor]:
    """``transfer_queue.py:359-402``: uniform nested columns densified (TQ gives them back nested)."""
    out: dict[str, torch.Tensor] = {}
    for key in td.keys():  # noqa: SIM118 (iterating a TensorDict walks its batch, not its keys)
        value = td.get(key)
        if isinstance(value, torch.Tensor) and value.is_nested:
            rows = list(value.unbind())
            if rows and all(r.shape == rows[0].shape for r in rows[1:]):
                value = torch.stack(rows)
        out[str(key)] = value
    return out


class TQDataPlaneClient:
    """``transfer_queue.py:405-716`` for the ``simple`` backend. ``bootstrap`` (the driver,
    ``_init_tq:246-343``) starts the controller; else ``tq.init()`` connects (``_connect_existing``).
    ``_patch_tq_actor_runtime_env`` is left out: it pip-installs TQ into TQ's actors from nemo-rl's
    package metadata (not installed here; the test's Ray workers have TQ already)."""

    def __init__(self, cfg: Mapping[str, Any], *, bootstrap: bool = True) -> None:
        if bootstrap:
            base = OmegaConf.load(str(resources.files("transfer_queue") / "config.yaml"))
            overlay = {"controller": {"polling_mode": True},
                       "backend": {"storage_backend": "SimpleStorage",
                                   "SimpleStorage": {"total_storage_size": cfg["storage_capacity"],
                                                     "num_data_storage_units": cfg["num_storage_units"]}}}
            tq.init(conf=OmegaConf.merge(base, overlay))
        else:
            tq.init()
        self.calls: list[tuple[str, list[str]]] = []  # (method, sample ids): what this process's client did
        self.put_fields: list[tuple[list[str], list[str]]] = []  # (sample ids, field names) of each put

    def register_partition(self, partition_id: str, fields: Sequence[str], **_: Any) -> None:
        """``transfer_queue.py:446-490``: one placeholder put of every field name, then cleared."""
        key = f"__schema__:{partition_id}:{os.getpid()}:{id(self)}:{time.time_ns()}"
        tq.kv_batch_put(keys=[key], partition_id=partition_id,
                        fields=TensorDict({f: torch.zeros(1) for f in fields}, batch_size=[1]), tags=[{}])
        tq.kv_clear(keys=[key], partition_id=partition_id)

    def put_samples(self, sample_ids: list[str], partition_id: str, fields: TensorDict | None = None,
                    tags: list[dict[str, Any]] | None = None) -> None:
        self.calls.append(("put_samples", list(sample_ids)))
        self.put_fields.append((list(sample_ids), [] if fields is None else [str(k) for k in fields.keys()]))  # noqa: SIM118 (a TensorDict iterates its batch)
        tq.kv_batch_put(keys=list(sample_ids), partition_id=partition_id,
                        fields=None if fields is None else fields.detach(),
                        tags=[{} for _ in sample_ids] if tags is None else [dict(t) for t in tags])

    def get_samples(self, sample_ids: list[str], partition_id: str, select_fields: list[str]) -> dict[str, Any]:
        self.calls.append(("get_samples", list(sample_ids)))
        if not sample_ids:
            return {}
        return _from_wire(tq.kv_batch_get(keys=list(sample_ids), partition_id=partition_id,
                                          select_fields=select_fields))

    def clear_samples(self, sample_ids: list[str], partition_id: str) -> None:
        self.calls.append(("clear_samples", list(sample_ids)))
        tq.kv_clear(keys=list(sample_ids), partition_id=partition_id)


def build_data_plane_client(cfg: Mapping[str, Any], *, bootstrap: bool = True) -> TQDataPlaneClient:
    """``data_plane/factory.py:21-67`` (no observability wrapper)."""
    if cfg is None or not cfg["enabled"]:
        raise ValueError("build_data_plane_client called with data_plane disabled")
    if cfg["impl"] != "transfer_queue":
        raise ValueError(f"unknown data_plane impl: {cfg['impl']!r}")
    return TQDataPlaneClient(cfg, bootstrap=bootstrap)


def teacher_side_client(cfg: Mapping[str, Any]) -> TQDataPlaneClient:
    """What a teacher group makes in its process: ``build_data_plane_client(cfg, bootstrap=False)``
    (``worker_mixin.py:133-150``); the facades' ``data_plane_client`` in the tests."""
    return build_data_plane_client(cfg, bootstrap=False)


# -- data_plane/column_io.py + codec.py: columns in and out ----------------------------------------

def _pack(fields: Mapping[str, torch.Tensor], lengths: torch.Tensor | None) -> TensorDict:
    """``codec.py:pack_jagged_fields`` + ``pack_per_token_field``: token-aligned columns jagged."""
    packed: dict[str, torch.Tensor] = {}
    for name, value in fields.items():
        if lengths is not None and name in TOKEN_ALIGNED_FIELDS and value.dim() >= 2 \
                and value.shape[1] >= int(lengths.max()):
            packed[name] = torch.nested.as_nested_tensor([value[i, : int(n)] for i, n in enumerate(lengths)],
                                                         layout=torch.jagged)
        else:
            packed[name] = value.detach().contiguous()
    return TensorDict(packed, batch_size=[0 if lengths is None else int(lengths.shape[0])])


def read_columns(client: TQDataPlaneClient, meta: KVBatchMeta, select_fields: Sequence[str],
                 pad_value_dict: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """``column_io.py:60-99`` + ``codec.materialize``: nested columns right-padded."""
    td = client.get_samples(sample_ids=meta.sample_ids, partition_id=meta.partition_id,
                            select_fields=list(select_fields))
    pads = pad_value_dict or {}
    return {k: torch.nested.to_padded_tensor(v, pads.get(k, 0)) if v.is_nested else v for k, v in td.items()}


def write_columns(client: TQDataPlaneClient, meta: KVBatchMeta, fields: Mapping[str, torch.Tensor]) -> None:
    """``column_io.py:102-130``."""
    lengths = torch.tensor(meta.sequence_lengths) if meta.sequence_lengths is not None else None
    client.put_samples(sample_ids=meta.sample_ids, partition_id=meta.partition_id, fields=_pack(fields, lengths))


def kv_first_write(batch: Mapping[str, torch.Tensor], *, sample_ids: Sequence[str], client: TQDataPlaneClient,
                   partition_id: str, task_name: str = "train") -> KVBatchMeta:
    """``column_io.py:133-220``: the rollout's first put of its rows."""
    lengths = batch["input_lengths"]
    client.put_samples(sample_ids=list(sample_ids), partition_id=partition_id, fields=_pack(batch, lengths))
    return KVBatchMeta(partition_id=partition_id, task_name=task_name, sample_ids=list(sample_ids),
                       fields=list(batch), sequence_lengths=[int(n) for n in lengths.tolist()])


# -- single_controller_utils/setup.py: the teacher part of the setup -------------------------------

def setup_teachers(opd: Any, setup: Any, master_config: Mapping[str, Any], tokenizer: Any,
                   dp_cfg: Mapping[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """``setup.py:171-182`` (the trainer's nodes), ``:763-771`` (reserve), ``:911-924`` (create,
    ``setup_data_plane``): ``(policy_nodes, groups, alias_to_group_alias)``."""
    policy_nodes = master_config["cluster"]["num_nodes"] - setup._non_colocated_teacher_node_count(master_config)
    if policy_nodes <= 0:
        raise ValueError("cluster.num_nodes must leave at least one node for the student")
    teacher_clusters: dict[str, Any] = {}
    if opd.is_non_colocated_teachers_enabled(master_config):
        teacher_clusters = opd.reserve_teacher_clusters(master_config, segment_size=None,
                                                        teacher_segment_topology=None)
    groups: dict[str, Any] = {}
    alias_to_group_alias: dict[str, str] = {}
    if teacher_clusters:
        groups, alias_to_group_alias = opd.create_teacher_worker_groups(
            master_config, dict(master_config["policy"]), tokenizer, teacher_clusters=teacher_clusters)
        for group in groups.values():
            group.setup_data_plane(dp_cfg)
    return policy_nodes, groups, alias_to_group_alias


# -- algorithms/opd.py: TQTeacherLogprobCoordinator's _enrich_sync and enrich ------------------------

class Coordinator:
    """``opd.py`` ``TQTeacherLogprobCoordinator`` (7e7d721 :211-421; 0054c4e's asyncio lock per
    group and ``TEACHER_LP_FIELDS``): routing by agent name, each prompt group padded to the
    teacher's DP size with temporary rows (copies of its last row), one call per group in a thread,
    the temporary rows cleared after, on success and on failure."""

    def __init__(self, client: TQDataPlaneClient, groups: Mapping[str, Any], alias_to_group_alias: Mapping[str, str],
                 opd_cfg: Mapping[str, Any]) -> None:
        self.client, self.groups, self.alias_to_group_alias = client, dict(groups), dict(alias_to_group_alias)
        self.opd_cfg = dict(opd_cfg)
        self.locks = {alias: asyncio.Lock() for alias in self.groups}
        # 0054c4e: with full.enabled the teacher also writes its payload (+ the teacher index for hidden
        # states: opd_full_payload_field / opd_full_teacher_index_field), which the training fetch reads
        full = self.opd_cfg.get("full") or {}
        self.enriched = ["teacher_reference_logprobs"]
        if full.get("enabled"):
            hidden = full.get("teacher_payload", "hidden_states") == "hidden_states"
            self.enriched += [OPD_FULL_FIELDS[0], "opd_full_teacher_index"] if hidden else [OPD_FULL_FIELDS[1]]
        self.calls: list[tuple[str, list[str]]] = []  # (group, sample ids it was given)

    def resolve(self, agent_name: str) -> str:
        """``_resolve_teacher`` + ``resolve_reference_aliases`` (non-strict)."""
        mapping = self.opd_cfg["teacher_model_by_agent_name"]
        alias = agent_name if agent_name in mapping else self.opd_cfg["default_teacher_alias"]
        return self.alias_to_group_alias.get(alias, alias)

    def enrich_sync(self, meta: KVBatchMeta, group_alias: str) -> None:
        if not meta.sequence_lengths:
            raise ValueError("MOPD teacher enrichment requires sequence_lengths")
        teacher = self.groups[group_alias]
        dp = teacher.sharding_annotations.get_axis_size("data_parallel")
        remainder = meta.size % dp
        padded, temporary = meta, []
        try:
            if remainder:
                pad = dp - remainder
                source = read_columns(self.client, meta.slice(meta.size - 1, meta.size), TEACHER_LP_FIELDS,
                                      pad_value_dict={"input_ids": 0})
                prefix = uuid.uuid4().hex
                temporary = [f"{meta.sample_ids[-1]}__teacher_pad_{prefix}_{i}" for i in range(pad)]
                pad_meta = KVBatchMeta(meta.partition_id, meta.task_name, temporary, list(TEACHER_LP_FIELDS),
                                       [meta.sequence_lengths[-1]] * pad)
                write_columns(self.client, pad_meta, {
                    "input_ids": source["input_ids"].expand(pad, *source["input_ids"].shape[1:]),
                    "input_lengths": source["input_lengths"].expand(pad, *source["input_lengths"].shape[1:])})
                padded = meta.concat(pad_meta)
            self.calls.append((group_alias, list(padded.sample_ids)))
            teacher.get_logprobs_from_meta(padded)
        except BaseException:
            if temporary:
                self.client.clear_samples(sample_ids=temporary, partition_id=meta.partition_id)
            raise
        if temporary:
            self.client.clear_samples(sample_ids=temporary, partition_id=meta.partition_id)

    async def enrich(self, meta: KVBatchMeta, agent_name: str) -> KVBatchMeta:
        group_alias = self.resolve(agent_name)
        async with self.locks[group_alias]:
            await asyncio.to_thread(self.enrich_sync, meta, group_alias)
        return meta.with_fields(self.enriched)


class SingleControllerActor:
    """The teacher half of NeMo RL's SingleController actor (``single_controller.py:150-190``): it is
    given the groups (pickled into it), connects its own data-plane client and enriches prompt
    groups concurrently through the coordinator. Wrap it with ``ray.remote`` in a test."""

    def __init__(self, groups: Mapping[str, Any], alias_to_group_alias: Mapping[str, str],
                 opd_cfg: Mapping[str, Any], dp_cfg: Mapping[str, Any]) -> None:
        self.client = build_data_plane_client(dp_cfg, bootstrap=False)
        self.coordinator = Coordinator(self.client, groups, alias_to_group_alias, opd_cfg)

    def enrich(self, prompt_groups: Sequence[tuple[KVBatchMeta, str]]) -> list[tuple[str, list[str]]]:
        """Every prompt group at once (as rollouts finish together); the calls the groups got."""
        async def all_groups() -> None:
            await asyncio.gather(*(self.coordinator.enrich(meta, agent) for meta, agent in prompt_groups))

        asyncio.run(all_groups())
        return self.coordinator.calls

    def written_by_groups(self) -> dict[str, list[str]]:
        """The sample ids each group put into the data plane from this process."""
        return {alias: [s for method, ids in group.data_plane().calls if method == "put_samples" for s in ids]
                for alias, group in self.coordinator.groups.items()}
