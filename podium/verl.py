"""podium.verl: podium's teachers where verl (0.9.1) holds its own, through verl's own classes.

verl's on-policy distillation scores each sequence with ``AsyncTeacherLLMServerManager``
(``verl/experimental/teacher_loop/teacher_manager.py``), which calls, per teacher key,
``LLMServerClient.generate(request_id, prompt_ids=..., sampling_params={"max_tokens": 1,
"temperature": 1.0, "prompt_logprobs": k, "detokenize": False})`` over Ray on a vLLM or SGLang
replica that verl starts on teacher GPUs of its own, and reads ``extra_fields["prompt_ids"]`` /
``extra_fields["prompt_logprobs"]`` (``[S, max(k, 1)]``: row ``t`` the distribution after token
``t``, the last row a dummy), as verl's ``extract_prompt_logprobs`` writes them from vLLM's output.

- :class:`PodiumTeacherClient`: what ``AsyncTeacherLLMServerManager(config, teacher_client={key:
  client})`` takes in place of an ``LLMServerClient``: its ``generate`` scores the sequence on
  podium's teacher through podium's own client (binary, failover across replicas, concurrent calls of
  one event loop sent as one batched request) and writes ``extra_fields`` with verl's own
  ``extract_prompt_logprobs``, fed vLLM's ``prompt_logprobs`` shape: ``None``, then per position a
  map from token id to an object with ``logprob`` and ``rank`` (the top ``k`` ranked ``1..k``, the
  prompt's own token after them where it is not among them, ranked ``k + 1``: its rank is not
  computed, and verl reads only whether it is over ``k``). No token is generated
  (``token_ids`` is empty): verl's teacher manager reads none. Picklable (verl hands its teacher
  clients to its agent-loop workers, Ray actors): the connection is made again in each process.
- :func:`teacher_clients` ``(rendezvous_path, config=None, aliases=None)``: one client per teacher
  key as verl's ``DistillationConfig`` resolves them (``default`` for a single teacher, else each
  teacher's ``key``), each served by the run's alias of that name or the one ``aliases`` names.
- :func:`podium_teachers` ``(rendezvous_path, aliases=None)``: a context manager under which verl's
  trainer, built in this process, reserves no teacher GPUs (its ``teacher_pool`` is not created) and
  its ``MultiTeacherModelManager`` hands out these clients instead of starting replicas. Enter it
  where the trainer is built: inside verl's ``TaskRunner`` (a Ray actor), not around ``main_ppo``'s
  driver.

Importing this module imports neither verl, torch nor Ray (podium's light install); the clients'
calls need verl (its ``TokenOutput`` and parser) and numpy.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import functools
import importlib.util
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from podium.client.client import PodiumClient
from podium.client.options import ClientOptions

logger = logging.getLogger(__name__)

SINGLE_TEACHER_KEY = "default"  # verl's key of the one teacher of a single-teacher config
TEACHER_POOL = "teacher_pool"  # verl's resource pool of its teacher replicas
PARSER_MODULE = "verl.workers.rollout.vllm_rollout.utils"
PARSER = "extract_prompt_logprobs"
MAX_BATCH_ROWS = 64  # concurrent sequences sent as one request, at most


class VerlWiringError(ValueError):
    """The run and verl's distillation config do not fit; the message names the key and the fix."""


@dataclasses.dataclass(frozen=True)
class _Logprob:
    """vLLM's ``Logprob`` as verl's parser reads it."""

    logprob: float
    rank: int | None
    decoded_token: str | None = None


@dataclasses.dataclass
class _PromptOutput:
    """vLLM's ``RequestOutput`` as verl's parser reads it: ``prompt_logprobs`` only."""

    prompt_logprobs: list[dict[int, _Logprob] | None]


@functools.cache
def verl_parser() -> Callable[[Any, int | None, dict[str, Any]], None]:
    """verl's ``extract_prompt_logprobs``: from its module where that imports (it imports vLLM), else
    the function alone compiled from that module's source (it reads only ``prompt_logprobs``,
    ``logprob`` and ``rank``; a teacher's trainer need not install vLLM)."""
    try:
        module = importlib.import_module(PARSER_MODULE)
        return getattr(module, PARSER)
    except Exception as exc:  # verl's vllm_rollout package raises ValueError, not ImportError, without vLLM
        logger.debug("%s not importable (%s): %s compiled from its source", PARSER_MODULE, exc, PARSER)
    spec = importlib.util.find_spec("verl")  # not the module's own spec: finding it imports its package
    if spec is None or spec.origin is None:
        raise ImportError(f"verl is not installed: {PARSER_MODULE} not found (pip install verl)")
    origin = str(Path(spec.origin).parent.joinpath(*PARSER_MODULE.split(".")[1:])) + ".py"
    tree = ast.parse(Path(origin).read_text(), origin)
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == PARSER), None)
    if node is None:
        raise ImportError(f"{PARSER_MODULE} has no {PARSER}: a verl release podium does not know")
    from typing import Optional

    namespace: dict[str, Any] = {"Optional": Optional, "RequestOutput": Any}
    exec(compile(ast.Module([node], type_ignores=[]), origin, "exec"), namespace)  # verl's code as it is
    return namespace[PARSER]


def vllm_prompt_logprobs(ids: np.ndarray, logprobs: np.ndarray, top_ids: np.ndarray | None,
                         top_logprobs: np.ndarray | None) -> list[dict[int, _Logprob] | None]:
    """vLLM's ``prompt_logprobs`` of one sequence from podium's answer (position ``i``: the
    distribution token ``i`` came from): ``None``, then per position the top ``k`` by rank and the
    prompt's own token (first where ``k`` is 0, as vLLM writes it)."""
    out: list[dict[int, _Logprob] | None] = [None]
    own_ids, own = ids.tolist(), logprobs.tolist()
    if top_ids is None or top_logprobs is None:
        out.extend({own_ids[i]: _Logprob(own[i], None)} for i in range(1, len(own_ids)))
        return out
    k = top_ids.shape[1]
    tids, tlps = top_ids.tolist(), top_logprobs.tolist()
    for i in range(1, len(own_ids)):
        entry = {tid: _Logprob(lp, rank) for rank, (tid, lp) in enumerate(zip(tids[i], tlps[i], strict=True), 1)}
        entry.setdefault(own_ids[i], _Logprob(own[i], k + 1))
        out.append(entry)
    return out


class PodiumTeacherClient:
    """An ``LLMServerClient`` for verl's teacher manager, on podium's teacher ``alias`` (see the
    module doc)."""

    def __init__(self, rendezvous_path: str | os.PathLike[str], alias: str, *, options: ClientOptions | None = None,
                 max_batch_rows: int = MAX_BATCH_ROWS) -> None:
        self.rendezvous_path = str(rendezvous_path)
        self.alias = alias
        self.options = dataclasses.replace(options or ClientOptions(), return_type="numpy")
        self.max_batch_rows = max_batch_rows
        self._client: PodiumClient | None = None
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._pending: dict[tuple[float, int], list[tuple[list[int], asyncio.Future[dict[str, np.ndarray]]]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"rendezvous_path": self.rendezvous_path, "alias": self.alias, "options": self.options,
                "max_batch_rows": self.max_batch_rows}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rendezvous_path"], state["alias"], options=state["options"],  # type: ignore[misc]
                      max_batch_rows=state["max_batch_rows"])

    def __repr__(self) -> str:
        return f"PodiumTeacherClient({self.rendezvous_path!r}, alias={self.alias!r})"

    @property
    def client(self) -> PodiumClient:
        with self._lock:
            if self._client is None:
                self._client = PodiumClient(self.rendezvous_path, options=self.options)
            return self._client

    async def generate(self, request_id: Any, *, prompt_ids: list[int], sampling_params: Mapping[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, **kwargs: Any) -> Any:
        """verl's ``TokenOutput`` of scoring ``prompt_ids`` (see the module doc)."""
        from verl.workers.rollout.replica import TokenOutput

        if any(x for x in (image_data, video_data, audio_data, kwargs.get("mm_processor_output"))):
            raise ValueError(f"teacher {self.alias!r}: podium teachers are text-only (multimodal data was sent)")
        k = sampling_params.get("prompt_logprobs")
        if k is None:
            raise ValueError(f"teacher {self.alias!r}: sampling_params without prompt_logprobs: podium only scores")
        temperature = float(sampling_params.get("temperature", 1.0))
        rows = list(prompt_ids)
        answer = await self._score(rows, int(k), temperature)
        extra: dict[str, Any] = {}
        top = (answer["topk_indices"], answer["topk_logprobs"]) if k else (None, None)
        verl_parser()(_PromptOutput(vllm_prompt_logprobs(np.asarray(rows), answer["logprobs"], *top)), int(k), extra)
        return TokenOutput(token_ids=[], log_probs=None, stop_reason="completed", extra_fields=extra)

    async def _score(self, row: list[int], k: int, temperature: float) -> dict[str, np.ndarray]:
        """This row's answer, from one request with the rows of every call of this loop waiting
        alike (same ``k`` and temperature) when it is sent."""
        loop = asyncio.get_running_loop()
        key = (temperature, k)
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        waiting = self._pending.setdefault(key, [])
        waiting.append((row, future))
        if len(waiting) == 1 or len(waiting) >= self.max_batch_rows:
            task = loop.create_task(self._send(key, wait=len(waiting) == 1))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _send(self, key: tuple[float, int], wait: bool) -> None:
        if wait:  # the calls started with this one (one gather) join it first
            await asyncio.sleep(0)
        batch = self._pending.pop(key, [])
        if not batch:
            return
        temperature, k = key
        width = max(len(row) for row, _ in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        for b, (row, _) in enumerate(batch):
            ids[b, :len(row)] = row
        lengths = np.array([len(row) for row, _ in batch], dtype=np.int64)
        try:
            out = await asyncio.get_running_loop().run_in_executor(None, functools.partial(
                self.client.get_logprobs, self.alias, {"input_ids": ids, "input_lengths": lengths},
                top_k=k or None, temperature=temperature))
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for b, (row, future) in enumerate(batch):
            n = len(row)
            if not future.done():
                future.set_result({name: np.asarray(value)[b, :n] for name, value in out.items()})


def _verl_keys(config: Any) -> dict[str, str | None]:
    """verl's teacher keys of ``config`` (the trainer's whole config, or its ``distillation``
    section), each with its ``model_path``, as verl's ``DistillationConfig`` resolves them."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import DistillationConfig

    section = config.get("distillation", config) if hasattr(config, "get") else config
    if isinstance(section, DistillationConfig):
        resolved = section
    elif "_target_" in section:  # verl's YAML: instantiated as verl instantiates it
        resolved = omega_conf_to_dataclass(section)
    else:
        resolved = omega_conf_to_dataclass(section, dataclass_type=DistillationConfig)
    if not resolved.enabled:
        raise VerlWiringError("distillation.enabled is false: verl asks no teacher")
    return {key: teacher.model_path for key, teacher in resolved.teacher_models.items()}


def teacher_clients(rendezvous_path: str | os.PathLike[str], config: Any = None, *,
                    aliases: Mapping[str, str] | None = None,
                    options: ClientOptions | None = None) -> dict[str, PodiumTeacherClient]:
    """``{verl teacher key: client}`` for ``AsyncTeacherLLMServerManager(config, teacher_client=...)``
    (see the module doc). ``config``: verl's config (its keys; None: the run's aliases, each its own
    key); ``aliases``: verl key -> the run's alias, where they differ (``default`` for a single
    teacher: the run's only teacher)."""
    probe = PodiumClient(rendezvous_path, options=options or ClientOptions())
    try:
        teachers = list(probe.rendezvous.teachers)
        keys = list(_verl_keys(config)) if config is not None else sorted(probe.rendezvous.routing or teachers)
        chosen: dict[str, str] = {}
        for key in keys:
            alias = (aliases or {}).get(key, key)  # the run routes it: an alias, an agent name, its default alias
            if key == SINGLE_TEACHER_KEY and key not in (aliases or {}) and len(teachers) == 1:
                alias = teachers[0]  # verl's one teacher: the run's one teacher
            try:
                probe.resolve(alias)
            except Exception as exc:
                raise VerlWiringError(f"verl teacher key {key!r}: the run {probe.run_name!r} serves no {alias!r} "
                                      f"({exc}); pass aliases={{{key!r}: <one of the run's aliases>}}") from None
            chosen[key] = alias
    finally:
        probe.close()
    return {key: PodiumTeacherClient(rendezvous_path, alias, options=options) for key, alias in chosen.items()}


class PodiumTeacherModelManager:
    """verl's ``MultiTeacherModelManager`` under :func:`podium_teachers`: no replicas, no GPUs;
    ``get_client()`` gives podium's clients."""

    rendezvous_path: str = ""
    aliases: Mapping[str, str] | None = None

    def __init__(self, config: Any, resource_pool: Any = None) -> None:
        self.config = config
        self.clients = teacher_clients(self.rendezvous_path, config, aliases=self.aliases)

    def get_client(self) -> dict[str, PodiumTeacherClient]:
        return dict(self.clients)

    def sleep(self) -> None:  # verl puts its teacher replicas to sleep with the rollout: podium's stay up
        pass

    def wake_up(self) -> None:
        pass


@contextlib.contextmanager
def podium_teachers(rendezvous_path: str | os.PathLike[str], *,
                    aliases: Mapping[str, str] | None = None) -> Iterator[type[PodiumTeacherModelManager]]:
    """Under this, verl's trainer built in this process uses podium's teachers (see the module doc)."""
    import verl.experimental.teacher_loop as teacher_loop
    from verl.single_controller.ray.base import ResourcePoolManager

    manager = type("PodiumTeacherModelManager", (PodiumTeacherModelManager,),
                   {"rendezvous_path": str(rendezvous_path), "aliases": aliases})
    modules = [teacher_loop]
    with contextlib.suppress(ImportError):  # verl's v1 trainer imports the manager by name
        import verl.trainer.ppo.v1.trainer_base as trainer_base

        modules.append(trainer_base)
    saved = [(module, module.MultiTeacherModelManager) for module in modules]
    create, get = ResourcePoolManager.create_resource_pool, ResourcePoolManager.get_resource_pool

    def create_resource_pool(self: Any) -> Any:
        if self.resource_pool_spec.pop(TEACHER_POOL, None) is not None:
            logger.info("podium: verl's %s not reserved (its teachers are podium's)", TEACHER_POOL)
        return create(self)

    def get_resource_pool(self: Any, role: Any) -> Any:
        if self.mapping.get(role) == TEACHER_POOL:
            return None
        return get(self, role)

    try:
        for module, _ in saved:
            module.MultiTeacherModelManager = manager  # type: ignore[attr-defined]
        ResourcePoolManager.create_resource_pool = create_resource_pool  # type: ignore[method-assign]
        ResourcePoolManager.get_resource_pool = get_resource_pool  # type: ignore[method-assign]
        yield manager
    finally:
        for module, original in saved:
            module.MultiTeacherModelManager = original  # type: ignore[attr-defined]
        ResourcePoolManager.create_resource_pool = create  # type: ignore[method-assign]
        ResourcePoolManager.get_resource_pool = get  # type: ignore[method-assign]
