"""``TeacherWorkerGroup``: one teacher's Ray actors, placed, set up once, serving ``get_logprobs``.

This module owns the driver side of a teacher:

- the teacher config (a ``TeacherSpec``, or a mapping with its field names, NeMo RL style) and the
  group options (``cluster`` hints and keyword arguments, see :class:`GroupOptions`);
- placement: ``num_nodes × gpus_per_node`` workers, one per GPU (one per CPU slot without GPUs),
  in **one placement group with one bundle per node** (``{"CPU": k·c, "GPU": k}`` for ``k`` workers
  per node) and strategy ``STRICT_SPREAD``: each bundle lives on one node, so a node's workers stay
  together, and no two bundles share a node, so nodes are spread. Worker ``r`` goes into bundle
  ``r // gpus_per_node``; with TP ≤ ``gpus_per_node`` the TP groups never cross nodes. (Ray has no
  "PACK within a bundle group, SPREAD across groups" strategy; per-node bundles give exactly that.)
- rendezvous: worker 0 reports its node IP and picks ``MASTER_PORT`` by a bind test on that IP;
  every worker joins ``torch.distributed`` there (NCCL on GPU, gloo on CPU);
- ``get_logprobs``: validation before anything is sent (bad input is a ``ValueError``, the group
  stays usable), padding the batch to a multiple of DP by repeating the last row, one shard per
  data-parallel replica (``ray.put`` once, shared by the replica's ranks), the output rank's
  result per replica concatenated and trimmed. One call at a time (a lock: a second caller waits);
- ``shutdown`` (idempotent) and a ``__del__`` safety net.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from podium.config.spec import PRECISIONS, TeacherSpec

logger = logging.getLogger(__name__)

_NEMO_PRECISIONS = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16", "32": "fp32", "16": "fp16"}
_PARALLEL_FIELDS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def coerce_teacher_spec(teacher_cfg: TeacherSpec | Mapping[str, Any]) -> TeacherSpec:
    """A ``TeacherSpec`` from itself or from a mapping with its field names.

    NeMo RL-style mappings are accepted too: parallel sizes inside ``megatron_cfg``, ``precision``
    spelt ``bfloat16``/``float32``/``float16``, ``num_nodes``/``gpus_per_node`` under ``cluster``.
    """
    if isinstance(teacher_cfg, TeacherSpec):
        return teacher_cfg
    if not isinstance(teacher_cfg, Mapping):
        raise ValueError(f"teacher_cfg must be a TeacherSpec or a mapping, got {type(teacher_cfg).__name__}")
    cfg = dict(teacher_cfg)
    if not cfg.get("model_name"):
        raise ValueError("teacher_cfg: 'model_name' (the checkpoint) is required")
    megatron_cfg = dict(cfg.get("megatron_cfg") or {})
    cluster = dict(cfg.get("cluster") or {})
    for key in _PARALLEL_FIELDS:
        if key not in cfg and key in megatron_cfg:
            cfg[key] = megatron_cfg[key]
    for key in ("num_nodes", "gpus_per_node"):
        cfg.setdefault(key, cluster.get(key, 1))
    precision = str(cfg.get("precision", "bf16"))
    cfg["precision"] = _NEMO_PRECISIONS.get(precision, precision)
    name = str(cfg.get("name") or os.path.basename(str(cfg["model_name"]).rstrip("/")) or "teacher")
    cfg.setdefault("name", name)
    cfg.setdefault("key", "adhoc")
    cfg["aliases"] = tuple(cfg.get("aliases") or (name,))
    if "megatron_cfg_overrides" not in cfg and "megatron_cfg" in cfg:
        overrides = {k: v for k, v in megatron_cfg.items() if k not in _PARALLEL_FIELDS}
        cfg["megatron_cfg_overrides"] = overrides
    for key in ("num_nodes", "gpus_per_node", "micro_batch_size", *_PARALLEL_FIELDS):
        if key in cfg and cfg[key] is not None:
            cfg[key] = int(cfg[key])
    try:
        return TeacherSpec.from_dict(cfg)
    except TypeError as exc:
        raise ValueError(f"teacher_cfg: {exc}") from exc


@dataclass(frozen=True)
class GroupOptions:
    """How the group is placed and run (from ``cluster`` hints and keyword arguments)."""

    use_gpu: bool | None = None  # None: GPUs if the Ray cluster has any
    num_cpus_per_worker: float = 1.0
    torch_threads: int | None = None  # None: the node's CPUs / workers on the node (CPU only)
    placement_strategy: str = "STRICT_SPREAD"
    placement_timeout_s: float = 600.0
    setup_timeout_s: float | None = None
    dist_timeout_s: float = 600.0
    master_port_range: tuple[int, int] | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)  # e.g. NCCL_*, GLOO_SOCKET_IFNAME
    hf_config: str | None = None  # config.json for a torch_dist checkpoint that lacks one
    seed: int = 1234
    name_prefix: str = "podium-teacher"

    @classmethod
    def from_sources(cls, cluster: Any, kw: Mapping[str, Any]) -> "GroupOptions":
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        if cluster is not None:
            source = cluster if isinstance(cluster, Mapping) else {k: getattr(cluster, k) for k in known if hasattr(cluster, k)}
            values.update({k: v for k, v in source.items() if k in known})
            ignored = [k for k in source if k not in known] if isinstance(cluster, Mapping) else []
            if ignored:
                logger.info("cluster hints not used by the teacher group: %s", sorted(ignored))
        unknown = sorted(k for k in kw if k not in known)
        if unknown:
            raise ValueError(f"TeacherWorkerGroup: unknown option(s) {unknown}; known: {sorted(known)}")
        values.update(kw)
        if values.get("master_port_range") is not None:
            lo, hi = values["master_port_range"]
            values["master_port_range"] = (int(lo), int(hi))
        if "env_vars" in values:
            values["env_vars"] = {str(k): str(v) for k, v in dict(values["env_vars"] or {}).items()}
        return cls(**values)


class TeacherWorkerGroup:
    """One teacher: ``num_nodes × gpus_per_node`` Ray workers holding one Megatron model.

    Assumes ``ray.init`` was called by the caller. See the module docstring for placement and the
    call protocol. Attributes after construction: ``vocab_size`` (the HF config's, not padded),
    ``max_sequence_length``, ``sequence_length_multiple`` (what TP/CP require; padding is internal),
    ``checkpoint_path``, ``spec``, ``worker_info``.
    """

    def __init__(
        self,
        teacher_cfg: TeacherSpec | Mapping[str, Any],
        cluster: Any = None,
        policy_config: Mapping[str, Any] | None = None,
        tokenizer: Any = None,
        **kw: Any,
    ) -> None:
        self._shutdown_done = True  # until actors exist, nothing to release
        self._lock = threading.Lock()
        self._broken: str | None = None
        self.spec = coerce_teacher_spec(teacher_cfg)
        self.options = GroupOptions.from_sources(cluster, kw)
        self.policy_config = policy_config
        self.tokenizer = tokenizer
        self._check_layout()
        self._preflight()
        self.checkpoint_path: str = str(self.spec.model_name)
        self._actors: list[Any] = []
        self._placement_group: Any = None
        started = time.perf_counter()
        self._shutdown_done = False
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise
        self.setup_seconds = time.perf_counter() - started
        info0 = self.worker_info[0]
        self.vocab_size: int = int(info0["vocab_size"])
        self.padded_vocab_size: int = int(info0["padded_vocab_size"])
        self.max_sequence_length: int = int(info0["max_position_embeddings"])
        self.sequence_length_multiple: int = int(info0["sequence_length_multiple"])
        self.data_parallel_size: int = int(info0["dp_size"])
        self.loaded_checkpoint_path: str = str(info0.get("checkpoint_path", self.checkpoint_path))
        logger.info(
            "teacher %r ready in %.1fs: %d workers, TP%d PP%d CP%d DP%d, vocab %d, checkpoint %s",
            self.spec.name, self.setup_seconds, len(self._actors), self.spec.tensor_model_parallel_size,
            self.spec.pipeline_model_parallel_size, self.spec.context_parallel_size, self.data_parallel_size,
            self.vocab_size, self.checkpoint_path,
        )

    # -- construction -------------------------------------------------------------------------------

    def _check_layout(self) -> None:
        s = self.spec
        if s.num_nodes < 1 or s.gpus_per_node < 1:
            raise ValueError(f"teacher {s.name!r}: num_nodes ({s.num_nodes}) and gpus_per_node ({s.gpus_per_node}) must be ≥ 1")
        if s.precision not in PRECISIONS:
            raise ValueError(f"teacher {s.name!r}: precision {s.precision!r} is not one of {list(PRECISIONS)}")
        mp = s.model_parallel_size
        if s.world_size % mp:
            raise ValueError(
                f"teacher {s.name!r}: {s.world_size} workers ({s.num_nodes} nodes × {s.gpus_per_node}) is not a "
                f"multiple of TP{s.tensor_model_parallel_size} × PP{s.pipeline_model_parallel_size} × "
                f"CP{s.context_parallel_size} = {mp}"
            )
        if s.micro_batch_size < 1:
            raise ValueError(f"teacher {s.name!r}: micro_batch_size must be ≥ 1, got {s.micro_batch_size}")

    def _preflight(self) -> None:
        """Checks that need only files and config classes: fail before anything is placed."""
        from podium.teacher.checkpoint_loader import describe_checkpoint, resolve_checkpoint
        from podium.teacher.megatron_model import check_model_layout, split_overrides

        s = self.spec
        resolved = resolve_checkpoint(s.model_name, self.options.hf_config)
        desc = describe_checkpoint(resolved)
        check_model_layout(desc, self._parallel(), where=f"teacher {s.name!r}: ")
        split_overrides(s.megatron_cfg_overrides, f"teacher {s.name!r} megatron_cfg_overrides")

    def _parallel(self) -> dict[str, int]:
        return {key: int(getattr(self.spec, key)) for key in _PARALLEL_FIELDS}

    def _start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from podium.teacher.worker import TeacherWorker

        if not ray.is_initialized():
            raise RuntimeError("TeacherWorkerGroup needs a connected Ray driver: call ray.init(address=...) first")
        s, o = self.spec, self.options
        use_gpu = o.use_gpu if o.use_gpu is not None else ray.cluster_resources().get("GPU", 0) > 0
        per_node = s.gpus_per_node
        bundle = {"CPU": o.num_cpus_per_worker * per_node}
        if use_gpu:
            bundle["GPU"] = float(per_node)
        strategy = o.placement_strategy if s.num_nodes > 1 else "PACK"
        self._placement_group = placement_group([dict(bundle) for _ in range(s.num_nodes)], strategy=strategy, name="")
        try:
            ray.get(self._placement_group.ready(), timeout=o.placement_timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"teacher {s.name!r}: placement group of {s.num_nodes} × {bundle} ({strategy}) not placed after "
                f"{o.placement_timeout_s:.0f}s; cluster has {ray.available_resources()} available"
            ) from None
        actor_cls = ray.remote(TeacherWorker)
        runtime_env = {"env_vars": dict(o.env_vars)} if o.env_vars else None
        for rank in range(s.world_size):
            options: dict[str, Any] = dict(
                num_cpus=o.num_cpus_per_worker,
                num_gpus=1 if use_gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group,
                    placement_group_bundle_index=rank // per_node,
                ),
                max_concurrency=1,
            )
            if runtime_env:
                options["runtime_env"] = runtime_env
            self._actors.append(actor_cls.options(**options).remote(rank, s.world_size, o.torch_threads, per_node))
        master_addr = ray.get(self._actors[0].node_ip.remote(), timeout=o.setup_timeout_s)
        master_port = ray.get(self._actors[0].pick_master_port.remote(master_addr, o.master_port_range), timeout=o.setup_timeout_s)
        logger.info("teacher %r: rendezvous at %s:%d", s.name, master_addr, master_port)
        futures = [
            actor.setup.remote(
                master_addr,
                master_port,
                str(s.model_name),
                self._parallel(),
                s.precision,
                dict(s.megatron_cfg_overrides),
                hf_config=o.hf_config,
                seed=o.seed,
                teacher_name=s.name,
                dist_timeout_s=o.dist_timeout_s,
            )
            for actor in self._actors
        ]
        self.worker_info: list[dict[str, Any]] = _get_first_error(futures, o.setup_timeout_s)
        outputs = [i for i in self.worker_info if i["is_output"]]
        dp = int(self.worker_info[0]["dp_size"])
        if sorted(i["dp_rank"] for i in outputs) != list(range(dp)):
            raise RuntimeError(f"teacher {s.name!r}: expected one output rank per DP replica, got {outputs}")

    # -- input ------------------------------------------------------------------------------------------

    def _prepare(self, data: Any, micro_batch_size: int | None, top_k: int | None) -> tuple[Any, Any]:
        import torch

        try:
            raw_ids = data["input_ids"]
            raw_lengths = data["input_lengths"]
        except (KeyError, TypeError, IndexError):
            raise ValueError("data must hold 'input_ids' [B, S] and 'input_lengths' [B]") from None
        try:
            ids = torch.as_tensor(raw_ids)
            lengths = torch.as_tensor(raw_lengths)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise ValueError(f"input_ids/input_lengths are not tensors or arrays: {exc}") from None
        if ids.dim() != 2:
            raise ValueError(f"input_ids must be 2-D [batch, seq], got shape {tuple(ids.shape)}")
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids, got dtype {ids.dtype}")
        batch, width = ids.shape
        if batch == 0:
            raise ValueError("empty batch: input_ids has 0 rows")
        if width == 0:
            raise ValueError("input_ids has 0 columns (sequence length 0)")
        if lengths.dim() != 1 or lengths.shape[0] != batch:
            raise ValueError(f"input_lengths must be 1-D with {batch} entries (one per row), got shape {tuple(lengths.shape)}")
        if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
            raise ValueError(f"input_lengths must be integers, got dtype {lengths.dtype}")
        lengths = lengths.long()
        too_short = (lengths < 1).nonzero().flatten().tolist()
        if too_short:
            raise ValueError(f"input_lengths must be ≥ 1; rows {too_short[:8]} have {lengths[too_short[:8]].tolist()}")
        too_long = (lengths > width).nonzero().flatten().tolist()
        if too_long:
            raise ValueError(
                f"input_lengths exceed the sequence length S={width}; rows {too_long[:8]} have {lengths[too_long[:8]].tolist()}"
            )
        longest = int(lengths.max())
        if longest > self.max_sequence_length:
            raise ValueError(
                f"sequence of {longest} tokens exceeds the model's max_sequence_length {self.max_sequence_length}"
            )
        ids = ids[:, :longest].long()
        valid = torch.arange(longest)[None, :] < lengths[:, None]
        bad = valid & ((ids < 0) | (ids >= self.vocab_size))
        if bool(bad.any()):
            rows, cols = bad.nonzero(as_tuple=True)
            raise ValueError(
                f"token ids outside the vocabulary [0, {self.vocab_size}): e.g. input_ids[{int(rows[0])}, {int(cols[0])}] = "
                f"{int(ids[rows[0], cols[0]])} ({int(bad.sum())} such tokens)"
            )
        ids = torch.where(valid, ids, torch.zeros_like(ids))
        if micro_batch_size is not None and (isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1):
            raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= self.vocab_size):
            raise ValueError(f"top_k must be an integer in [1, {self.vocab_size}], got {top_k!r}")
        return ids, lengths

    def validate(self, data: Any) -> None:
        """Raise ``ValueError`` naming what is wrong with ``data``; cheap, no collectives."""
        self._prepare(data, None, None)

    # -- compute ----------------------------------------------------------------------------------------

    def get_logprobs(self, data: Any, micro_batch_size: int | None = None, top_k: int | None = None) -> dict[str, Any]:
        """NeMo RL-convention logprobs ``float32 [B, S]`` (+ top-k ``[B, S, K]`` when ``top_k``)."""
        import ray
        import torch

        with self._lock:
            if self._shutdown_done:
                raise RuntimeError(f"teacher {self.spec.name!r}: group is shut down")
            if self._broken:
                raise RuntimeError(f"teacher {self.spec.name!r}: group is broken by an earlier failure: {self._broken}")
            ids, lengths = self._prepare(data, micro_batch_size, top_k)
            raw = data["input_ids"]
            batch = ids.shape[0]
            width = int(raw.shape[1]) if hasattr(raw, "shape") else len(raw[0])
            mbs = int(micro_batch_size or self.spec.micro_batch_size)
            dp = self.data_parallel_size
            padded = -(-batch // dp) * dp
            if padded != batch:
                reps = padded - batch
                ids = torch.cat([ids, ids[-1:].expand(reps, -1)])
                lengths = torch.cat([lengths, lengths[-1:].expand(reps)])
            per = padded // dp
            shards = [
                (ray.put(ids[d * per : (d + 1) * per].contiguous()), ray.put(lengths[d * per : (d + 1) * per].contiguous()))
                for d in range(dp)
            ]
            futures = []
            for actor, info in zip(self._actors, self.worker_info):
                ids_ref, len_ref = shards[info["dp_rank"]]
                futures.append(actor.get_logprobs.remote(ids_ref, len_ref, mbs, top_k))
            try:
                results = _get_first_error(futures, None)
            except Exception as exc:
                self._broken = f"{type(exc).__name__}: {exc}"[:2000]
                raise
            by_dp: dict[int, dict[str, Any]] = {}
            for info, out in zip(self.worker_info, results):
                if info["is_output"]:
                    by_dp[int(info["dp_rank"])] = out
            merged: dict[str, Any] = {}
            for key in by_dp[0]:
                full = torch.cat([by_dp[d][key] for d in range(dp)])[:batch]
                if full.shape[1] < width:
                    pad = torch.zeros((batch, width - full.shape[1], *full.shape[2:]), dtype=full.dtype)
                    full = torch.cat([full, pad], dim=1)
                merged[key] = full.contiguous()
            return merged

    # -- observability / lifecycle --------------------------------------------------------------

    def memory(self) -> list[dict[str, int]]:
        """Peak and current RSS of every worker (bytes), in rank order."""
        import ray

        return ray.get([a.memory.remote() for a in self._actors])

    def shutdown(self) -> bool:
        """Kill the workers and remove the placement group; harmless when repeated."""
        if getattr(self, "_shutdown_done", True):
            return True
        self._shutdown_done = True
        try:
            import ray
            from ray.util.placement_group import remove_placement_group

            if not ray.is_initialized():
                return True
            for actor in getattr(self, "_actors", []):
                try:
                    ray.kill(actor, no_restart=True)
                except Exception as exc:  # already dead
                    logger.debug("kill of a teacher worker failed: %s", exc)
            self._actors = []
            if self._placement_group is not None:
                try:
                    remove_placement_group(self._placement_group)
                except Exception as exc:
                    logger.debug("removing the placement group failed: %s", exc)
                self._placement_group = None
        finally:
            logger.info("teacher %r shut down", getattr(getattr(self, "spec", None), "name", "?"))
        return True

    def __enter__(self) -> "TeacherWorkerGroup":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            if not getattr(self, "_shutdown_done", True):
                self.shutdown()
        except Exception:  # interpreter shutdown: nothing more to do
            pass


def _get_first_error(futures: list[Any], timeout: float | None) -> list[Any]:
    """``ray.get`` all futures, but raise as soon as any one fails (others may be stuck in a collective)."""
    import ray

    pending = list(futures)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        wait_for = None if deadline is None else max(0.0, deadline - time.monotonic())
        done, pending = ray.wait(pending, num_returns=1, timeout=wait_for)
        if not done:
            raise TimeoutError(f"{len(pending)} teacher worker call(s) unfinished after {timeout}s")
        ray.get(done)  # raises the worker's exception (a RayTaskError subclassing the original)
    return ray.get(futures)
