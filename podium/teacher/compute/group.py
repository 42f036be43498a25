"""``TeacherWorkerGroup``: one teacher's Ray actors, placed, set up once, serving ``get_logprobs``.

This module owns the driver side of a teacher:

- the teacher: a ``TeacherSpec`` from the plan (the one planner; there is no second one here), and
  the group options (:class:`GroupOptions`);
- placement: ``num_nodes × gpus_per_node`` workers, one per GPU (one per CPU slot without GPUs),
  in **one placement group with one bundle per node** (``{"CPU": k·c, "GPU": k}`` for ``k`` workers
  per node) and strategy ``STRICT_SPREAD``: each bundle lives on one node, so a node's workers stay
  together, and no two bundles share a node, so nodes are spread. Worker ``r`` goes into bundle
  ``r // gpus_per_node``; with TP ≤ ``gpus_per_node`` the TP groups never cross nodes. (Ray has no
  "PACK within a bundle group, SPREAD across groups" strategy; per-node bundles give exactly that.)
- rendezvous: worker 0 reports its node IP and picks ``MASTER_PORT`` by a bind test on that IP;
  every worker joins ``torch.distributed`` there (NCCL on GPU, gloo on CPU);
- ``compute(batch, query)``: a validated :class:`~podium.protocol.batch.Batch` and
  :class:`~podium.protocol.query.Query` (the endpoint checks both once per request; they are
  trusted here), planned into micro-batches by :mod:`podium.teacher.compute.microbatch` (length
  buckets, the token budget ``max_tokens_per_microbatch``, token-balanced replicas), one shard per
  data-parallel replica (``ray.put`` once, shared by the replica's ranks), the output ranks' rows
  put back in the batch's order; what it computed in :attr:`last_batch`. One batch at a time (a
  lock: a second caller waits). ``get_logprobs(data, micro_batch_size, top_k, ...)`` is NeMo RL's
  shape of the same call for in-process callers: it checks a plain mapping and the options (bad
  input is a ``ValueError``, the group stays usable) and calls ``compute``;
- ``shutdown`` (idempotent) and a ``__del__`` safety net.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from podium.config.launcher import DEFAULT_STUCK_AFTER_S
from podium.config.spec import TeacherSpec
from podium.protocol.batch import Batch, batch_inputs, validate_batch
from podium.protocol.query import Query, ask
from podium.teacher.compute.liveness import CallWatch, RankSeat, allowed_s
from podium.teacher.compute.microbatch import (
    MicroBatch,
    assign_replicas,
    bucket_length,
    computed_tokens,
    plan_microbatches,
)
from podium.teacher.compute.rank import RankInfo
from podium.teacher.compute.waiting import (
    WATCH_GROUP,
    RankTask,
    StuckForwardError,
    await_watched,
    get_first_error,
    workers_settled,
)
from podium.teacher.seam import BatchStats, GroupFacts, Liveness, RankLiveness

logger = logging.getLogger(__name__)

# What a stuck warm-up forward adds to its verdict (a cold first forward can need longer than the floor)
WARM_UP_HINT = " (server.stuck_after_s is {floor:g} s: raise it if a first forward of this model needs longer)"
SPEED_WEIGHT = 0.3  # the weight of the newest call in the measured speed (an exponential average)


@dataclass(frozen=True)
class GroupOptions:
    """How the group is placed and run (the launcher sets ``master_port_range``; tests and benchmarks
    set the rest)."""

    use_gpu: bool | None = None  # None: GPUs if the Ray cluster has any
    num_cpus_per_worker: float = 1.0
    torch_threads: int | None = None  # None: the node's CPUs / workers on the node (CPU only)
    placement_strategy: str = "STRICT_SPREAD"
    placement_timeout_s: float = 600.0
    setup_timeout_s: float | None = None
    dist_timeout_s: float = 600.0
    # After a batch raised: how long the other workers get to come back before the group counts as
    # broken (one stuck in a collective its peers left never does).
    failed_call_settle_s: float = 30.0
    # The watch's floor (server.stuck_after_s): a call none of whose ranks finishes a micro-batch
    # for this long (or 10x its measured time, when longer) is stuck, and the group broken.
    stuck_after_s: float = DEFAULT_STUCK_AFTER_S
    watch_calls: bool = True  # False: calls wait unwatched (benchmarks measure what the watch costs)
    master_port_range: tuple[int, int] | None = None
    env_vars: Mapping[str, str] = field(default_factory=dict)  # e.g. NCCL_*, GLOO_SOCKET_IFNAME
    hf_config: str | None = None  # config.json for a torch_dist checkpoint that lacks one
    seed: int = 1234
    name_prefix: str = "podium-teacher"


class TeacherWorkerGroup:
    """One teacher: ``num_nodes × gpus_per_node`` Ray workers holding one Megatron model.

    Assumes ``ray.init`` was called by the caller. See the module docstring for placement and the
    call's steps. Attributes after construction: ``facts`` (:class:`~podium.teacher.seam.GroupFacts`:
    the vocabulary, not padded, the longest row, what TP/CP pad a row to, DP size, micro-batch
    budget, checkpoint), ``spec``, ``worker_info`` (one :class:`~podium.teacher.compute.rank.RankInfo`
    per rank).
    """

    def __init__(self, spec: TeacherSpec, options: GroupOptions | None = None, **kw: Any) -> None:
        self._shutdown_done = True  # until actors exist, nothing to release
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._calls = 0  # calls dispatched (their number is what the ranks report)
        self._speed: float | None = None  # token positions per second of one replica, measured
        self._watch: CallWatch | None = None  # the call computing now
        self._stuck: str | None = None
        self._ended: dict[int, float] = {}  # rank -> when (wall clock) its task of a call last returned
        self._rank_seconds: dict[int, float] = {}  # rank -> seconds its task of the last call took
        if not isinstance(spec, TeacherSpec):
            raise TypeError(f"TeacherWorkerGroup takes a TeacherSpec (from the plan), got {type(spec).__name__}")
        self.spec = spec
        self.options = dataclasses.replace(options or GroupOptions(), **kw) if kw else (options or GroupOptions())
        self._preflight()
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
        rank0 = self.worker_info[0]
        self.facts = GroupFacts(
            vocab_size=rank0.vocab_size,
            max_sequence_length=rank0.max_position_embeddings,
            sequence_length_multiple=rank0.sequence_length_multiple,
            data_parallel_size=rank0.dp_size,
            max_tokens_per_microbatch=spec.token_budget(rank0.max_position_embeddings),
            # a hub id: the pinned snapshot the ranks loaded (its tokenizer too, not whatever main is now)
            checkpoint_path=rank0.checkpoint_path if spec.revision else str(spec.model_name),
            temperature=spec.temperature,
            parallel_sizes=spec.parallel_sizes(),
            hidden_size=rank0.hidden_size,
            hidden_states_refusal=rank0.hidden_states_refusal,
        )
        # Experts sharded (EP·ETP > 1): their groups may span DP replicas (they do once EP·ETP > TP),
        # and every forward is a collective over them, so every replica runs as many micro-batches.
        expert_ranks = spec.expert_model_parallel_size * spec.expert_tensor_parallel_size
        self._lockstep = rank0.dp_size > 1 and expert_ranks > 1
        self.last_batch: BatchStats | None = None
        logger.info(
            "teacher %r ready in %.1fs: %d workers, TP%d PP%d CP%d DP%d, vocab %d, checkpoint %s",
            self.spec.name, self.setup_seconds, len(self._actors), self.spec.tensor_model_parallel_size,
            self.spec.pipeline_model_parallel_size, self.spec.context_parallel_size, rank0.dp_size,
            rank0.vocab_size, self.spec.model_name,
        )

    # -- construction -------------------------------------------------------------------------------

    def _preflight(self) -> None:
        """Checks that need only files and config classes: fail before anything is placed."""
        from podium.teacher.model.checkpoint_loader import describe_model
        from podium.teacher.model.megatron_config import check_model_layout, split_overrides

        s = self.spec
        desc = describe_model(s.model_name, self.options.hf_config, revision=s.revision)
        check_model_layout(desc, s.parallel_sizes(), where=f"teacher {s.name!r}: ")
        split_overrides(s.megatron_cfg_overrides, f"teacher {s.name!r} megatron_cfg_overrides")

    def _start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from podium.teacher.compute.worker import TeacherWorker

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
        # progress() answers the watch on a thread of its own while a call computes
        actor_cls = ray.remote(concurrency_groups={WATCH_GROUP: 1})(TeacherWorker)
        env_vars = dict(o.env_vars)
        if not use_gpu:
            # Ray leaves CUDA_VISIBLE_DEVICES alone for an actor with num_gpus=0, so on a GPU node a
            # group asked to run on CPU would see (and pick) cuda:0: hide the devices, as asked.
            env_vars.setdefault("CUDA_VISIBLE_DEVICES", "")
        runtime_env = {"env_vars": env_vars} if env_vars else None
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
        master_port = ray.get(self._actors[0].pick_master_port.remote(o.master_port_range), timeout=o.setup_timeout_s)
        logger.info("teacher %r: rendezvous at %s:%d", s.name, master_addr, master_port)
        futures = [
            actor.setup.remote(
                master_addr,
                master_port,
                str(s.model_name),
                s.parallel_sizes(),
                s.precision,
                dict(s.megatron_cfg_overrides),
                hf_config=o.hf_config,
                seed=o.seed,
                teacher_name=s.name,
                dist_timeout_s=o.dist_timeout_s,
                revision=s.revision,
                fp32_lm_head=s.fp32_lm_head,
            )
            for actor in self._actors
        ]
        self.worker_info: list[RankInfo] = get_first_error(futures, o.setup_timeout_s)
        outputs = [i for i in self.worker_info if i.is_output]
        dp = self.worker_info[0].dp_size
        if sorted(i.dp_rank for i in outputs) != list(range(dp)):
            raise RuntimeError(f"teacher {s.name!r}: expected one output rank per DP replica, got {outputs}")

    # -- compute ----------------------------------------------------------------------------------------

    def validate(self, data: Any, candidate_ids: Any = None) -> Batch:
        """``data`` (a mapping with ``input_ids``/``input_lengths``, or a :class:`Batch`) as a validated
        batch for this teacher; ``BatchError`` (a ``ValueError``) naming what is wrong."""
        if isinstance(data, Batch):
            return data
        ids, lengths = batch_inputs(data)
        return validate_batch(ids, lengths, vocab_size=self.facts.vocab_size,
                              max_sequence_length=self.facts.max_sequence_length, candidate_ids=candidate_ids)

    def get_logprobs(self, data: Any, micro_batch_size: int | None = None, top_k: int | None = None, *,
                     temperature: float | None = None, outputs: Sequence[str] | None = None,
                     candidate_ids: Any = None, payload_datatype: str | None = None) -> dict[str, Any]:
        """NeMo RL's shape of :meth:`compute`: the requested ``outputs`` (default: NeMo RL-convention
        ``logprobs`` float32 ``[B, S]``, plus top-k logprobs ``[B, S, K]`` when ``top_k``, plus
        ``candidate_logprobs`` with candidate ids; a full-vocabulary payload, ``hidden_states`` or
        ``logits``, in ``payload_datatype``; see :mod:`podium.protocol.names`), at
        ``temperature`` (default: the teacher's). ``data`` is a :class:`Batch` or a mapping, checked
        here with the options (:mod:`podium.protocol.query`)."""
        batch = self.validate(data, candidate_ids)
        query = ask(outputs=outputs, top_k=top_k, micro_batch_size=micro_batch_size, temperature=temperature,
                    payload_datatype=payload_datatype, candidates=batch.candidate_ids is not None,
                    vocab_size=self.facts.vocab_size, hidden_states_refusal=self.facts.hidden_states_refusal)
        return self.compute(batch, query)

    def compute(self, batch: Batch, query: Query, *, what: str = "call") -> dict[str, Any]:
        """The ``query``'s outputs for ``batch`` (both trusted), ``[B, width, ...]`` torch tensors.
        Top-k ids come in :func:`~podium.teacher.compute.head.index_dtype` (int32 for any real
        vocabulary: narrowed on the device; the endpoint hands each caller the dtype it asked).
        Watched (:mod:`podium.teacher.compute.liveness`): :class:`StuckForwardError` when it stops
        making progress, and the group is broken from then on."""
        if query.temperature is None:
            query = dataclasses.replace(query, temperature=self.spec.temperature)
        with self._lock:
            if self._shutdown_done:
                raise RuntimeError(f"teacher {self.spec.name!r}: group is shut down")
            if self._broken:
                raise RuntimeError(f"teacher {self.spec.name!r}: group is broken by an earlier failure: {self._broken}")
            started = time.perf_counter()
            budget = self.facts.max_tokens_per_microbatch
            assert budget is not None, "a TeacherWorkerGroup states its micro-batch budget (facts)"
            plan = plan_microbatches(batch.input_lengths.tolist(), budget, max_rows=query.micro_batch_size,
                                     seq_multiple=self.facts.sequence_length_multiple)
            replicas = assign_replicas(plan, self.facts.data_parallel_size, lockstep=self._lockstep,
                                       seq_multiple=self.facts.sequence_length_multiple)
            # each replica's rows in its plan's order (a filler row, -1, is one token 0 of length 1)
            order = [[i for mb in shard for i in mb.rows] for shard in replicas]
            self._calls += 1
            tasks = self._dispatch(batch, query, replicas, order)
            self._watch = self._new_watch(tasks, replicas, what)
            try:
                answer = self._collect(tasks, order, batch.rows, query)
            finally:
                self._watch = None
            seconds = time.perf_counter() - started
            dp_tokens = tuple(computed_tokens([shard]) for shard in replicas)
            self.last_batch = BatchStats(rows=batch.rows, tokens=batch.tokens, microbatches=sum(map(len, replicas)),
                                         computed_tokens=computed_tokens(replicas), seconds=seconds,
                                         dp_tokens=dp_tokens)
            speed = max(dp_tokens) / max(seconds, 1e-6)  # one replica's token positions per second
            self._speed = speed if self._speed is None else SPEED_WEIGHT * speed + (1 - SPEED_WEIGHT) * self._speed
            # positions past the longest row come back as zeros, up to the caller's width
            return {key: batch.pad(value).contiguous() for key, value in answer.items()}

    def warm_up(self) -> BatchStats:
        """One forward at the largest shape the endpoint admits (a full micro-batch of the longest
        rows on every data-parallel replica), before the teacher is published ready: a lazy
        collective init that hangs or an out-of-memory at the biggest shape fails here, naming the
        rank, not in a trainer's first call. Its allowance is the floor (``stuck_after_s``)."""
        facts = self.facts
        budget = int(facts.max_tokens_per_microbatch or 1)
        longest = facts.max_sequence_length or budget
        length = min(longest, budget)
        # the longest row whose bucket (the length the group computes it at) stays within the model
        while length > 1 and bucket_length(length, facts.sequence_length_multiple) > longest:
            length -= 1
        rows = max(1, budget // bucket_length(length, facts.sequence_length_multiple)) * facts.data_parallel_size
        ids = np.tile(np.arange(length, dtype=np.int64) % facts.vocab_size, (rows, 1))
        batch = self.validate({"input_ids": ids, "input_lengths": np.full(rows, length, dtype=np.int64)})
        query = ask(vocab_size=facts.vocab_size, hidden_states_refusal=facts.hidden_states_refusal)
        self.compute(batch, query, what="warm-up forward")
        assert self.last_batch is not None
        logger.info("teacher %r warmed up: %d rows of %d tokens in %.2fs", self.spec.name, rows, length,
                    self.last_batch.seconds)
        return self.last_batch

    def _dispatch(self, batch: Batch, query: Query, replicas: Sequence[Sequence[MicroBatch]],
                  order: Sequence[Sequence[int]]) -> list[RankTask]:
        """Each replica's shard to its ranks (``ray.put`` once per replica); the task of every rank
        that has rows."""
        import ray
        import torch

        arrays = {"ids": batch.input_ids, "lengths": batch.input_lengths}
        if batch.candidate_ids is not None:
            arrays["cands"] = batch.candidate_ids
        shards = [{name: ray.put(torch.from_numpy(_take(a, rows, filler_length=name == "lengths")))
                   for name, a in arrays.items()} if rows else None for rows in order]
        tasks = []
        for actor, info in zip(self._actors, self.worker_info, strict=True):
            shard = shards[info.dp_rank]
            if shard is None:  # fewer micro-batches than replicas: this one has nothing to do
                continue
            steps = [(len(mb.rows), mb.seq_len) for mb in replicas[info.dp_rank]]
            future = actor.get_logprobs.remote(shard["ids"], shard["lengths"], steps, query, shard.get("cands"),
                                               call=self._calls)
            tasks.append(RankTask(info.rank, info.dp_rank, info.is_output, future))
        return tasks

    def _new_watch(self, tasks: Sequence[RankTask], replicas: Sequence[Sequence[MicroBatch]], what: str) -> CallWatch:
        """The watch of the call just dispatched: its allowance from the teacher's measured speed."""
        steps = max((mb.tokens for shard in replicas for mb in shard), default=1)
        seats = [RankSeat(t.rank, f"{self.worker_info[t.rank].node_ip}, pid {self.worker_info[t.rank].pid}",
                          len(replicas[t.dp_rank])) for t in tasks]
        return CallWatch(self._calls, seats, allowed_s(self.options.stuck_after_s, self._speed, steps),
                         time.monotonic(), what=what)

    def _collect(self, tasks: Sequence[RankTask], order: Sequence[Sequence[int]], rows: int,
                 query: Query) -> dict[str, Any]:
        """The output ranks' answers, each row put back at its place in the batch. A failure whose
        workers do not all come back (a dead one, one stuck in a collective) breaks the group."""
        import torch

        futures = [task.future for task in tasks]
        try:
            results = self._await(tasks)
        except StuckForwardError:
            raise
        except Exception as exc:
            if not workers_settled(futures, self.options.failed_call_settle_s):
                self._broken = f"{type(exc).__name__}: {exc}"[:2000]
            raise
        answer: dict[str, Any] = {}
        for task, out in zip(tasks, results, strict=True):
            if not task.is_output:
                continue
            d = task.dp_rank
            real = [k for k, i in enumerate(order[d]) if i >= 0]
            where = torch.tensor([order[d][k] for k in real], dtype=torch.long)
            for key, value in out.items():
                if not query.wants(key):
                    continue
                if key not in answer:
                    answer[key] = value.new_zeros((rows, *value.shape[1:]))
                answer[key][where] = value[real]
        return answer

    def _await(self, tasks: Sequence[RankTask]) -> list[Any]:
        """The tasks' results (:func:`~podium.teacher.compute.waiting.await_watched`); a stuck call
        breaks the group, its verdict the reason."""
        watch = self._watch
        assert watch is not None

        def returned(rank: int, seconds: float) -> None:
            self._ended[rank], self._rank_seconds[rank] = time.time(), seconds

        if not self.options.watch_calls:
            return get_first_error([task.future for task in tasks], None)
        try:
            return await_watched(tasks, watch, self._actors, returned)
        except StuckForwardError as exc:
            verdict = str(exc)
            if watch.what != "call":
                verdict += WARM_UP_HINT.format(floor=self.options.stuck_after_s)
            self._broken = self._stuck = f"teacher {self.spec.name!r}: {verdict}"[:2000]
            logger.error("%s", self._stuck)
            raise StuckForwardError(self._stuck) from None

    # -- observability / lifecycle --------------------------------------------------------------

    @property
    def broken(self) -> str | None:
        """Why this group can serve no more (the error of the call that broke it), or None."""
        return self._broken

    @property
    def liveness(self) -> Liveness:
        """What the watch knows now (``podium status`` shows it through the endpoint's /metrics)."""
        watch = self._watch
        age = time.monotonic() - watch.started if watch is not None else None
        ranks = tuple(RankLiveness(rank=info.rank, where=f"{info.node_ip}, pid {info.pid}",
                                   last_forward_end=self._ended.get(info.rank),
                                   last_call_seconds=self._rank_seconds.get(info.rank))
                      for info in self.worker_info)
        return Liveness(call_age_s=age, stuck=self._stuck, ranks=ranks)

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

    def __enter__(self) -> TeacherWorkerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            if not getattr(self, "_shutdown_done", True):
                self.shutdown()
        except Exception:  # interpreter shutdown: nothing more to do
            pass


def _take(array: Any, rows: Sequence[int], filler_length: bool) -> Any:
    """``array[rows]``, a filler row (``-1``) as zeros (a length of 1 for ``input_lengths``)."""
    index = np.asarray(rows, dtype=np.int64)
    picked = array[np.maximum(index, 0)]
    if (index < 0).any():
        picked[index < 0] = 1 if filler_length else 0
    return np.ascontiguousarray(picked)
