"""What ``podium.connect(path)`` returns: every teacher of a run, routed by agent name.

Owns :class:`PodiumClient`: it reads ``rendezvous.json`` and the run's token once, routes an alias
or agent name to its teacher (default alias, strict flag), keeps one :class:`TeacherClient` per
teacher, calls several teachers concurrently for a batch whose samples belong to different agents
(MOPD) and reassembles the rows in their original order, and checks tokenizers. It re-reads
``rendezvous.json`` when the file is replaced (``podium scale`` changing a teacher's replicas),
looking no more often than ``ClientOptions.refresh_s``. The NeMo RL-shaped facades are built on a
client by :mod:`podium.nemo_rl`, which imports this package (never the other way round).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from podium.client.errors import TokenizerMismatchError
from podium.client.options import ClientOptions, convert_outputs
from podium.client.teacher import TeacherClient, check_tokenizer_against
from podium.protocol.batch import batch_inputs
from podium.protocol.tokenizer import tokenizer_fingerprint, tokenizer_size
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.layout import RunLayout
from podium.rendezvous.manifest import Rendezvous, read_rendezvous
from podium.rendezvous.token import read_token

logger = logging.getLogger(__name__)


class PodiumClient:
    """All teachers of one run (thread-safe; use as a context manager or call :meth:`close`).

    ``path``: ``<run_dir>/rendezvous.json`` or the run dir. ``token``: the run's bearer token
    (default: read ``<run_dir>/auth_token``). ``tokenizer``: a HF tokenizer every teacher is checked
    against when first reached (fingerprint and size). ``options``: a :class:`ClientOptions`
    (default: its defaults); ``option_overrides``: any of its fields by name, replacing that field of
    ``options``:

    - ``call_timeout_s`` (1800): one call, its retries and waits included (per call: ``timeout_s``);
    - ``ready_timeout_s`` (3600): one wait for a (re)started teacher to be ready;
    - ``connect_timeout_s`` (10), ``request_timeout_s`` (3600; None: no limit): one connection,
      one exchange;
    - ``keepalive_idle_s`` (30), ``keepalive_interval_s`` (10), ``keepalive_count`` (3): TCP keepalive;
    - ``poll_interval_s`` (0.2), ``max_poll_interval_s`` (2): how often a record is read again;
    - ``stale_after_s`` (None: what the teacher's record says): when a silent record is stale;
    - ``refresh_s`` (2): how often ``rendezvous.json`` and the unused replicas are looked at again;
    - ``max_retries_after_crash`` (2): how often a request whose generation died under it is sent
      again (then :class:`~podium.client.errors.TeacherRequestFailedError`);
    - ``max_backoff_s`` (60): the longest wait after a full queue (it starts at the Retry-After);
    - ``binary`` (True): the binary tensor extension on the wire (False: JSON tensors);
    - ``pipeline_mb`` (32): a call whose answer is at least this many MB goes as a few requests of
      consecutive rows at once, so the first answers cross the wire while the teacher computes the
      later ones (same numbers; None: always one request);
    - ``slow_factor`` (4; None: off): a replica whose answers take over this many times the other
      replicas' median is drained of new calls, probed once every ``slow_probe_s`` (10) until it
      answers at their pace again (``TeacherClient.slow_replicas`` lists the drained ones);
    - ``hedge_factor`` (3; None: off), ``hedge_min_s`` (1), ``hedge_fraction`` (0.1): a request
      unanswered ``max(hedge_factor x`` its replica's usual time``, hedge_min_s)`` after it was sent
      goes once more to another replica, the first answer winning; at most ``hedge_fraction`` of
      the requests are hedged;
    - ``return_type`` ("auto"): "torch", "numpy", or "auto" (torch where it is importable).

    Any other keyword raises :class:`TypeError` before the run is read.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        token: str | None = None,
        options: ClientOptions | None = None,
        tokenizer: Any = None,
        **option_overrides: Any,
    ) -> None:
        # an unknown name raises TypeError here, before the run is read
        self.options = dataclasses.replace(options or ClientOptions(), **option_overrides)
        self.layout = RunLayout.from_rendezvous_path(path)
        self._stamp = _stamp(self.layout.rendezvous_path) if self.layout.rendezvous_path.exists() else None
        self._checked_at = time.monotonic()
        self.rendezvous: Rendezvous = read_rendezvous(self.layout.rendezvous_path)
        self._token = token if token is not None else read_token(self.layout.auth_token_path)
        self._fingerprint = tokenizer_fingerprint(tokenizer) if tokenizer is not None else None
        self._tokenizer_size = tokenizer_size(tokenizer) if tokenizer is not None else None
        self._teachers: dict[str, TeacherClient] = {}
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __repr__(self) -> str:
        return f"PodiumClient(run={self.rendezvous.run_name!r}, teachers={sorted(self.rendezvous.teachers)})"

    @property
    def run_name(self) -> str:
        return self.rendezvous.run_name

    def resolve(self, alias_or_agent_name: str) -> str:
        """The teacher key serving ``alias_or_agent_name`` (see ``Rendezvous.resolve``)."""
        self._refresh()
        return self.rendezvous.resolve(alias_or_agent_name)

    def aliases(self) -> list[str]:
        """The run's aliases as ``rendezvous.json`` lists them now (re-read as :meth:`resolve` does)."""
        self._refresh()
        return sorted(self.rendezvous.routing)

    def _refresh(self) -> None:
        """Re-read ``rendezvous.json`` if it was replaced since it was read (looked at no more often
        than ``refresh_s``): ``podium scale`` changes a teacher's replicas, ``podium up`` a run's."""
        now = time.monotonic()
        if now - self._checked_at < self.options.refresh_s:
            return
        self._checked_at = now
        try:
            stamp = _stamp(self.layout.rendezvous_path)
        except OSError:
            return  # the file is being replaced, or the filesystem hiccups: the next look sees it
        if stamp == self._stamp:
            return
        try:
            rendezvous = read_rendezvous(self.layout.rendezvous_path)
        except FileReadError as exc:
            logger.warning("%s; keeping the rendezvous read before", exc)
            return
        with self._lock:
            self.rendezvous, self._stamp = rendezvous, stamp
            teachers = dict(self._teachers)
        for key, client in teachers.items():
            entry = rendezvous.teachers.get(key)
            paths = [self.layout.resolve(p) for p in entry.replicas] if entry is not None else None
            if paths is not None and paths != client.replicas.paths:
                logger.info("teacher %s: the rendezvous now lists %d replica(s)", client.label, len(paths))
                client.set_replicas(paths)

    def teacher(self, alias_or_agent_name: str) -> TeacherClient:
        """The client of the teacher serving ``alias_or_agent_name``."""
        key = self.resolve(alias_or_agent_name)
        with self._lock:
            client = self._teachers.get(key)
            if client is None:
                entry = self.rendezvous.entry(key)
                client = TeacherClient(
                    key=key,
                    name=entry.name,
                    record_paths=[self.layout.resolve(path) for path in entry.replicas],
                    token=self._token,
                    options=self.options,
                    expected_fingerprint=self._fingerprint,
                    expected_tokenizer_size=self._tokenizer_size,
                )
                self._teachers[key] = client
            return client

    def wait_ready(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Block until every teacher of the run is ready; return their records by key."""
        return {key: self.teacher(key).wait_ready(timeout_s) for key in self.rendezvous.teachers}

    # ------------------------------------------------------------------ logprobs

    def get_logprobs(
        self,
        alias_or_agent_name: str,
        data: Mapping[str, Any],
        *,
        top_k: int | None = None,
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Logprobs of ``data`` from the teacher of ``alias_or_agent_name``, like the in-process group;
        ``timeout_s``: this call's deadline (default ``ClientOptions.call_timeout_s``)."""
        return self.teacher(alias_or_agent_name).get_logprobs(data, top_k=top_k, micro_batch_size=micro_batch_size,
                                                              temperature=temperature, timeout_s=timeout_s)

    def get_topk_logits(
        self,
        alias_or_agent_name: str,
        data: Mapping[str, Any],
        k: int,
        *,
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        values_datatype: str = "FP32",
        indices_datatype: str = "INT32",
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """NeMo RL's ``get_topk_logits`` from the teacher of ``alias_or_agent_name``:
        ``{"topk_logits": float32 [B, S, k], "topk_indices": int64 [B, S, k]}``, the
        temperature-scaled logits of the ``k`` likeliest next tokens at each position (see
        :meth:`TeacherClient.get_topk_logits`). ``values_datatype="BF16"`` halves the values' bytes
        on the wire, ids travel INT32 (``indices_datatype="INT64"``: wide), not the result's dtypes;
        ``timeout_s``: this call's deadline (default ``ClientOptions.call_timeout_s``)."""
        return self.teacher(alias_or_agent_name).get_topk_logits(
            data, k, micro_batch_size=micro_batch_size, temperature=temperature, values_datatype=values_datatype,
            indices_datatype=indices_datatype, timeout_s=timeout_s)

    def get_candidate_logprobs(
        self,
        alias_or_agent_name: str,
        data: Mapping[str, Any],
        candidate_ids: Any = None,
        *,
        micro_batch_size: int | None = None,
        temperature: float | None = None,
        values_datatype: str = "FP32",
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """The teacher's logprobs of the caller's ids (:meth:`TeacherClient.get_candidate_logprobs`)."""
        return self.teacher(alias_or_agent_name).get_candidate_logprobs(
            data, candidate_ids, micro_batch_size=micro_batch_size, temperature=temperature,
            values_datatype=values_datatype, timeout_s=timeout_s)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=max(2, len(self.rendezvous.teachers)), thread_name_prefix="podium-client"
                )
            return self._pool

    def get_logprobs_by_agent(
        self,
        data: Mapping[str, Any],
        agent_names: Sequence[str],
        *,
        top_k: int | None = None,
        micro_batch_size: int | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Logprobs of a batch whose row ``b`` belongs to ``agent_names[b]``.

        Rows are grouped by teacher, the teachers are called concurrently (each within ``timeout_s``,
        default ``ClientOptions.call_timeout_s``), and the answers are put back in the original row
        order.
        """
        ids, lengths = batch_inputs(data)
        if len(agent_names) != ids.shape[0]:
            raise ValueError(f"{len(agent_names)} agent names for a batch of {ids.shape[0]} rows")
        groups: dict[str, list[int]] = {}
        for row, agent in enumerate(agent_names):
            groups.setdefault(self.resolve(agent), []).append(row)
        if len(groups) == 1:
            (key,) = groups
            result = self.teacher(key).get_logprobs_arrays(ids, lengths, top_k=top_k, micro_batch_size=micro_batch_size,
                                                           timeout_s=timeout_s)
            return convert_outputs(result, self.options.return_type)
        pool = self._executor()
        futures = {
            key: pool.submit(
                self.teacher(key).get_logprobs_arrays,
                ids[rows], lengths[rows], top_k=top_k, micro_batch_size=micro_batch_size, timeout_s=timeout_s,
            )
            for key, rows in groups.items()
        }
        merged: dict[str, np.ndarray] = {}
        for key, future in futures.items():
            rows = np.asarray(groups[key])
            for name, part in future.result().items():
                if name not in merged:
                    merged[name] = np.zeros((ids.shape[0], *part.shape[1:]), dtype=part.dtype)
                merged[name][rows] = part
        return convert_outputs(merged, self.options.return_type)

    # ------------------------------------------------------------------ tokenizer safety

    def check_tokenizer(
        self,
        alias_or_agent_name: str,
        tokenizer: Any = None,
        *,
        fingerprint: str | None = None,
        vocab_size: int | None = None,
    ) -> dict[str, Any]:
        """Raise :class:`TokenizerMismatchError` unless ``tokenizer`` (or ``fingerprint``) is the teacher's.

        ``vocab_size`` (the trainer model's vocabulary, padding included) must equal the teacher's
        when given. Returns the teacher's podium metadata.
        """
        if tokenizer is None and fingerprint is None and vocab_size is None:
            raise ValueError("check_tokenizer needs a tokenizer, a fingerprint or a vocab size")
        client = self.teacher(alias_or_agent_name)
        meta = client.metadata()
        info = meta.get("podium", {})
        gen = info.get("generation") or {}
        fp = fingerprint
        if fp is None and tokenizer is not None:
            fp = tokenizer_fingerprint(tokenizer)
        size = tokenizer_size(tokenizer) if tokenizer is not None else None
        check_tokenizer_against(client.label, f"{gen.get('job_id')}:{gen.get('restart')}", info, fp, size, vocab_size)
        if fp is not None and info.get("tokenizer_fingerprint") is None:
            raise TokenizerMismatchError(
                f"teacher {client.label} publishes no tokenizer fingerprint (no tokenizer next to its "
                "checkpoint); cannot confirm the trainer's tokenizer"
            )
        return info

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close connections and threads (the teachers keep running)."""
        with self._lock:
            teachers, self._teachers = list(self._teachers.values()), {}
            pool, self._pool = self._pool, None
        for client in teachers:
            client.close()
        if pool is not None:
            pool.shutdown(wait=False)

    def __enter__(self) -> PodiumClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stamp(path: Path) -> tuple[int, int, int]:
    """What changes when ``path`` is replaced (written by rename) or rewritten."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def connect(
    path: str | os.PathLike[str],
    *,
    token: str | None = None,
    options: ClientOptions | None = None,
    tokenizer: Any = None,
    **option_overrides: Any,
) -> PodiumClient:
    """Connect to a run: ``path`` is ``<run_dir>/rendezvous.json`` (or the run dir).

    ``token`` (default: read ``<run_dir>/auth_token``), ``tokenizer`` (a HF tokenizer every teacher
    is checked against when first reached), ``options`` (a :class:`ClientOptions`) and any of its
    fields by name (``call_timeout_s=...``): :class:`PodiumClient` lists them; any other keyword
    raises :class:`TypeError`.
    """
    return PodiumClient(path, token=token, options=options, tokenizer=tokenizer, **option_overrides)

