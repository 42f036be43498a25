"""One rank of a teacher: the Ray actor that holds one Megatron model stage and computes logprobs.

This module owns what runs inside each worker process:

- process setup: torch threads (Ray sets ``OMP_NUM_THREADS=1`` for ``num_cpus=1`` actors, so the
  count is set explicitly), the CPU shims when CUDA is absent, the device (Ray gives each GPU
  worker one visible GPU);
- joining the group's ``torch.distributed`` and megatron-core's ``parallel_state``
  (:mod:`podium.teacher.model.parallel`) from worker 0's address and port;
- :class:`TeacherWorker`: the actor body (the group wraps it with ``ray.remote``). ``setup`` builds and
  loads the model stage (see ``checkpoint_loader``) and installs the :class:`LogprobHead`;
  ``get_logprobs`` runs this rank's data-parallel shard in micro-batches through the forward-only
  stage loop and, on the replica's output rank (last PP stage, TP rank 0, CP rank 0), returns the
  NeMo RL-convention tensors; other ranks return ``None``.

All ranks of one data-parallel replica are given the same shard; the group routes shards and
collects outputs.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from podium.config.teacher_keys import Fp32LmHead
from podium.faults import faults
from podium.net import find_free_port
from podium.protocol.names import TARGET_RANK, TOPK_LOGITS, TOPK_LOGPROBS
from podium.protocol.query import Query
from podium.teacher.compute.alignment import (
    cp_split,
    cp_unsplit,
    next_token_labels,
    next_token_outputs,
    shifted_ranks,
    to_nemo_rl,
)
from podium.teacher.compute.head import HeadCall, HeadInputs
from podium.teacher.compute.liveness import RankReport
from podium.teacher.compute.payload import hidden_states_refusal, mask_payload
from podium.teacher.compute.rank import RankInfo
from podium.teacher.compute.stages import StageInfo, forward_only_stage_loop
from podium.teacher.model.parallel import DEFAULT_SEED, init_parallel

logger = logging.getLogger(__name__)

def quiet_library_warnings() -> None:
    """Silence megatron/torch-checkpoint notices that every worker would repeat (no TE/Apex, deprecations)."""
    import warnings

    for module in (r"megatron\..*", r"torch\.distributed\.checkpoint\..*"):
        warnings.filterwarnings("ignore", category=UserWarning, module=module)
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)


def default_torch_threads(workers_per_node: int) -> int:
    """This node's usable CPUs shared by its workers (Ray's OMP_NUM_THREADS=1 would leave one)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, workers_per_node))


def peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class TeacherWorker:
    """One rank of a teacher worker group (a Ray actor body; plain class for in-process use)."""

    def __init__(self, rank: int, world_size: int, torch_threads: int | None = None, workers_per_node: int = 1) -> None:
        import torch

        self.rank = rank
        self.world_size = world_size
        quiet_library_warnings()
        if torch_threads is None and not torch.cuda.is_available():
            torch_threads = default_torch_threads(workers_per_node)
        if torch_threads:
            torch.set_num_threads(int(torch_threads))
        self._ready = False
        self._info: RankInfo | None = None
        # What the group's watch asks (progress(), on a thread of its own while a call computes):
        # the call, its micro-batches and how many finished, and when the last of them ended.
        self._call, self._steps, self._done, self._event = 0, 0, 0, time.monotonic()
        self._froze = False  # the fault freeze_call_rank stops this rank once

    # -- rendezvous -----------------------------------------------------------------------------

    def node_ip(self) -> str:
        try:
            import ray

            return str(ray.util.get_node_ip_address())
        except Exception:  # outside Ray
            return socket.gethostbyname(socket.gethostname())

    def pick_master_port(self, port_range: tuple[int, int] | None = None) -> int:
        """A free port on this node for torch's TCPStore. The bind test is on all addresses: the
        store listens on all of them, and a port another job holds on a different address of this
        node would fail it there."""
        return find_free_port(port_range, "", shuffle=True)

    # -- setup --------------------------------------------------------------------------------------

    def setup(
        self,
        master_addr: str,
        master_port: int,
        checkpoint: str,
        parallel: Mapping[str, int],
        precision: str,
        overrides: Mapping[str, Any] | None = None,
        *,
        hf_config: str | None = None,
        seed: int = DEFAULT_SEED,
        teacher_name: str = "teacher",
        dist_timeout_s: float = 600.0,
        revision: str | None = None,
        fp32_lm_head: Fp32LmHead = False,
    ) -> RankInfo:
        """Initialise parallel state, build and load the model stage (a hub id: its snapshot
        ``revision``, the plan's pin) and, on the last stage, the head (its output GEMM's logits in
        fp32 by ``fp32_lm_head``); return this rank's :class:`RankInfo`."""
        import torch

        from podium.teacher.cpu.cuda_shims import apply_cuda_shims
        from podium.teacher.model.checkpoint_loader import build_and_load

        started = time.perf_counter()
        shims = apply_cuda_shims()
        if torch.cuda.is_available():
            torch.cuda.set_device(0)  # Ray exposes exactly one GPU to each worker
        init_parallel(
            self.rank, self.world_size, f"tcp://{master_addr}:{master_port}", parallel,
            seed=seed, timeout_s=dist_timeout_s,
        )
        loaded = build_and_load(
            checkpoint, parallel, precision, overrides, hf_config=hf_config,
            where=f"teacher {teacher_name!r} megatron_cfg_overrides", revision=revision,
        )
        self._place(loaded, fp32_lm_head)
        self._ready = True
        self._info = self._rank_info(loaded, shims, time.perf_counter() - started)
        logger.info("rank %d ready: %s", self.rank, self._info)
        return self._info

    def _place(self, loaded: Any, fp32_lm_head: Fp32LmHead = False) -> None:
        """This rank's model stage, its place in every parallel group, and (last stage) its head."""
        import torch
        from megatron.core import parallel_state

        from podium.teacher.compute.head import LogprobHead

        self.loaded = loaded
        self.model = loaded.model
        self.desc = loaded.desc
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.cp_rank = parallel_state.get_context_parallel_rank()
        self.cp_size = parallel_state.get_context_parallel_world_size()
        self.is_first = parallel_state.is_pipeline_first_stage()
        self.is_last = parallel_state.is_pipeline_last_stage()
        on_gpu = torch.cuda.is_available()
        self.device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        self.dtype = loaded.config.params_dtype
        self.head: LogprobHead | None = None
        if self.is_last:
            self.head = LogprobHead(vocab_size=self.desc.vocab_size,
                                    tp_group=parallel_state.get_tensor_model_parallel_group(),
                                    tp_rank=self.tp_rank, tp_size=self.tp_size, fp32_lm_head=fp32_lm_head)
            self.head.install(self.model)
        self.seq_multiple = 2 * self.cp_size if self.cp_size > 1 else 1

    def _rank_info(self, loaded: Any, shims: Sequence[str], setup_seconds: float) -> RankInfo:
        import torch
        from megatron.core import parallel_state

        return RankInfo(
            rank=self.rank, node_ip=self.node_ip(), pid=os.getpid(),
            tp_rank=self.tp_rank, pp_rank=self.pp_rank, cp_rank=self.cp_rank,
            dp_rank=parallel_state.get_data_parallel_rank(), dp_size=parallel_state.get_data_parallel_world_size(),
            ep_rank=parallel_state.get_expert_model_parallel_rank(),
            etp_rank=parallel_state.get_expert_tensor_parallel_rank(),
            is_output=bool(self.is_last and self.tp_rank == 0 and self.cp_rank == 0),
            checkpoint_kind=loaded.checkpoint.kind, checkpoint_path=str(loaded.checkpoint.path),
            architecture=self.desc.architecture, vocab_size=self.desc.vocab_size,
            padded_vocab_size=loaded.padded_vocab_size, max_position_embeddings=self.desc.max_position_embeddings,
            sequence_length_multiple=self.seq_multiple, load_seconds=loaded.load_seconds,
            setup_seconds=setup_seconds, torch_threads=torch.get_num_threads(), device=str(self.device),
            parameters_bytes=sum(p.numel() * p.element_size() for p in self.model.parameters()),
            load_stats=dict(loaded.stats), cuda_shims=tuple(shims), hidden_size=self.desc.hidden_size,
            hidden_states_refusal=hidden_states_refusal(tied_embeddings=bool(self.desc.tied_embeddings),
                                                        checkpoint_kind=str(loaded.checkpoint.kind)),
        )

    def info(self) -> RankInfo | None:
        return self._info

    # -- compute ------------------------------------------------------------------------------------

    def get_logprobs(self, input_ids: Any, input_lengths: Any, plan: Sequence[tuple[int, int]], query: Query,
                     candidate_ids: Any = None, call: int = 0) -> dict[str, Any] | None:
        """This replica's shard ``input_ids [b, S]`` through the model; on the output rank, the
        ``query``'s outputs (names of :mod:`podium.protocol.names`: NeMo RL-aligned logprobs and
        top-k logprobs, next-token top-k logits, logprobs of ``candidate_ids [b, S, C]``) at its
        temperature (the group resolved the teacher's default); other ranks return ``None``.

        ``plan`` is the driver's (:mod:`podium.teacher.compute.microbatch`): consecutive micro-batches
        of the shard as ``(rows, seq_len)``, the same on every rank of the replica; ``call`` is the
        group's number of the call, as :meth:`progress` reports it."""
        import torch

        if not self._ready:
            raise RuntimeError(f"worker {self.rank}: get_logprobs before setup")
        self._call, self._steps, self._done, self._event = call, len(plan), 0, time.monotonic()
        started = time.perf_counter()
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        lengths = torch.as_tensor(input_lengths, dtype=torch.long)
        cands = torch.as_tensor(candidate_ids, dtype=torch.long) if candidate_ids is not None else None
        fail_token = faults().fail_call_token
        if fail_token is not None and ids.shape[0] and int(ids[0, 0]) == fail_token:
            raise RuntimeError(f"worker {self.rank}: fault injected by {faults().injected('fail_call_token')}")
        if faults().freeze_call_rank == self.rank and not self._froze:
            self._froze = True
            logger.warning("rank %d stops itself: %s", self.rank, faults().injected("freeze_call_rank"))
            os.kill(os.getpid(), signal.SIGSTOP)
        spans = self._spans(plan, int(ids.shape[0]))
        microbatches, inputs = self._microbatches(ids, lengths, cands, spans)
        results = self._forward(microbatches, inputs, _head_call(query))
        if not self.is_last:
            return None
        full = self._assemble(results, spans, ids.shape)
        self.last_call_seconds = time.perf_counter() - started
        if not (self.tp_rank == 0 and self.cp_rank == 0):
            return None
        return _answer(full, lengths, query)

    def _spans(self, plan: Sequence[tuple[int, int]], rows: int) -> list[tuple[int, int, int]]:
        """The plan's micro-batches as ``(first row, end row, seq_len)``."""
        spans, start = [], 0
        for count, seq_len in plan:
            spans.append((start, start + int(count), int(seq_len)))
            start += int(count)
        if start != rows:
            raise ValueError(f"worker {self.rank}: the plan covers {start} rows of a shard of {rows}")
        return spans

    def _microbatches(self, ids_all: Any, lengths: Any, cands_all: Any,
                      spans: Sequence[tuple[int, int, int]]) -> tuple[list[dict[str, Any]], list[HeadInputs]]:
        """Each micro-batch's model inputs (this CP rank's part, on the device) and head inputs."""
        import torch

        width = ids_all.shape[1]
        microbatches, inputs = [], []
        for lo, hi, seq_len in spans:
            ids = torch.zeros(hi - lo, seq_len, dtype=torch.long)
            take = min(width, seq_len)
            ids[:, :take] = ids_all[lo:hi, :take]
            # padding positions hold token 0: never out of the vocabulary, never looked at
            ids[torch.arange(seq_len)[None, :] >= lengths[lo:hi, None]] = 0
            pos = torch.arange(seq_len, dtype=torch.long)[None, :].expand_as(ids)
            # the head computes only positions whose next token is in the sequence
            wanted = torch.arange(seq_len)[None, :] < (lengths[lo:hi, None] - 1)
            tensors = {"input_ids": ids, "position_ids": pos, "labels": next_token_labels(ids)}
            microbatches.append({k: self._local(v) for k, v in tensors.items()})
            cands = None
            if cands_all is not None:
                cands = torch.zeros(hi - lo, seq_len, cands_all.shape[-1], dtype=torch.long)
                cands[:, :take] = cands_all[lo:hi, :take]
                cands = self._local(cands)
            inputs.append(HeadInputs(wanted=self._local(wanted), candidates=cands))
        return microbatches, inputs

    def _local(self, tensor: Any) -> Any:
        """This CP rank's part of a ``[b, s, ...]`` tensor, on this rank's device."""
        return cp_split(tensor, self.cp_size, self.cp_rank).contiguous().to(self.device)

    def _forward(self, microbatches: list[dict[str, Any]], inputs: list[HeadInputs], call: HeadCall) -> list[Any]:
        """The micro-batches through this pipeline stage (the last stage's head answering ``call``)."""
        from megatron.core import parallel_state

        stage = StageInfo(
            is_first=self.is_first,
            is_last=self.is_last,
            prev_rank=None if self.is_first else parallel_state.get_pipeline_model_parallel_prev_rank(),
            next_rank=None if self.is_last else parallel_state.get_pipeline_model_parallel_next_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
            hidden_size=self.desc.hidden_size,
            dtype=self.dtype,
            device=self.device,
        )
        if self.head is None:
            return forward_only_stage_loop(self.model, microbatches, stage, self._step_done)
        with self.head.serving(call, inputs):
            return forward_only_stage_loop(self.model, microbatches, stage, self._step_done)

    def _step_done(self) -> None:
        self._done, self._event = self._done + 1, time.monotonic()

    def _assemble(self, results: Sequence[Mapping[str, Any]], spans: Sequence[tuple[int, int, int]],
                  shape: Any) -> dict[str, Any]:
        """The head's per-micro-batch outputs as ``[b, S, ...]`` of the shard, on the host (CP pieces
        gathered first)."""
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state

        batch, width = shape
        full: dict[str, torch.Tensor] = {}
        for (lo, hi, seq_len), out in zip(spans, results, strict=True):
            pieces = dict(out)
            if self.cp_size > 1:
                group = parallel_state.get_context_parallel_group()
                for key, value in list(pieces.items()):
                    gathered = [torch.empty_like(value) for _ in range(self.cp_size)]
                    dist.all_gather(gathered, value.contiguous(), group=group)
                    pieces[key] = cp_unsplit(gathered, self.cp_size)
            take = min(width, seq_len)
            for key, value in pieces.items():
                if key not in full:
                    full[key] = torch.zeros((batch, width, *value.shape[2:]), dtype=value.dtype)
                full[key][lo:hi, :take] = value[:, :take].cpu()
        return full

    # -- observability / teardown -----------------------------------------------------------------

    def progress(self) -> RankReport:
        """Where this rank is in its current call (the group's watch asks it on a thread of its own,
        while the call computes; a frozen process never answers)."""
        return RankReport(call=self._call, microbatches=self._steps, done=self._done,
                          since_s=time.monotonic() - self._event)

    def memory(self) -> dict[str, int]:
        return {"peak_rss_bytes": peak_rss_bytes(), "rss_bytes": current_rss_bytes()}

    def stats(self) -> dict[str, Any]:
        """Seconds the last ``get_logprobs`` took inside this worker, thread count, allocator env."""
        import torch

        return {
            "last_call_seconds": getattr(self, "last_call_seconds", None),
            "torch_threads": torch.get_num_threads(),
            "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        }


def _head_call(query: Query) -> HeadCall:
    """What the head computes for ``query``: top-k when a top-k output is asked, the log-sum-exp for
    top-k logits (logits = logprobs + lse)."""
    want_shifted = bool(query.top_k) and query.wants(TOPK_LOGPROBS)
    want_logits = bool(query.top_k) and query.wants(TOPK_LOGITS)
    return HeadCall(temperature=1.0 if query.temperature is None else float(query.temperature),
                    top_k=query.top_k if (want_shifted or want_logits) else None, want_lse=want_logits,
                    want_rank=query.wants(TARGET_RANK), payload=query.payload,
                    payload_datatype=query.payload_datatype)


def _answer(full: Mapping[str, Any], lengths: Any, query: Query) -> dict[str, Any]:
    """The output rank's answer: the head's outputs in NeMo RL's and the next-token alignment."""
    want_shifted = bool(query.top_k) and query.wants(TOPK_LOGPROBS)
    want_logits = bool(query.top_k) and query.wants(TOPK_LOGITS)
    result = to_nemo_rl(full["logprobs"], lengths, full.get("topk_values") if want_shifted else None,
                        full.get("topk_indices") if want_shifted else None)
    result.update(next_token_outputs(lengths, topk_values=full.get("topk_values") if want_logits else None,
                                     topk_indices=full.get("topk_indices"), lse=full.get("lse"),
                                     candidate_logprobs=full.get("candidate_logprobs")))
    if query.wants(TARGET_RANK):
        result[TARGET_RANK] = shifted_ranks(full["rank"], lengths)
    if query.payload is not None:  # the model's own alignment: position i is its output at i
        result[query.payload] = mask_payload(full[query.payload], lengths)
    return result
