"""Turning a podium run into what NeMo RL's setup would have built, and handing it over.

- :func:`teacher_worker_groups`: a rendezvous path plus the recipe's ``on_policy_distillation``
  section → ``(groups, alias_to_group_alias)``, what ``nemo_rl.algorithms.opd.
  create_teacher_worker_groups`` returns: one :class:`RemoteTeacherWorkerGroup` per teacher,
  keyed by its primary alias (the first alias of the recipe that it serves), and every alias of
  the recipe mapped to its primary alias. It checks that the run serves every alias, with the
  checkpoint the recipe names, and waits for the teachers to be ready.
- :func:`distillation_teacher`: the object NeMo RL's distillation loop holds as its teacher.
- :func:`distillation_policy`: a context manager under which NeMo RL's distillation ``setup``
  builds that object instead of loading the teacher on the trainer's GPUs.

How a MOPD run uses :func:`teacher_worker_groups` without reserving teacher nodes (no patch): run
the trainer with ``on_policy_distillation.non_colocated_teachers.enabled=false`` (NeMo RL then
subtracts no nodes, reserves no placement groups and its ``setup`` returns no teachers) and pass
the groups to ``async_grpo_train(..., teacher_worker_groups=groups,
alias_to_group_alias=alias_to_group_alias)``, as ``examples/run_grpo.py`` passes its own. The
README shows the lines.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from podium.client.client import PodiumClient
from podium.client.options import ClientOptions
from podium.config.checkpoints import normalise_checkpoint
from podium.nemo_rl.distillation import RemoteDistillationTeacher
from podium.nemo_rl.worker_group import RemoteTeacherWorkerGroup
from podium.rendezvous.records import ModelInfo

MAPPING_KEY = "teacher_model_by_agent_name"
SECTION = "on_policy_distillation"


class NemoRLWiringError(ValueError):
    """The run and the trainer's recipe do not fit; the message names the key and the fix."""


def plain_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict of a dict, an OmegaConf node (interpolations resolved) or a pydantic model
    (NeMo RL's ``OnPolicyDistillationConfig``, dumped as its ``opd._opd_cfg`` dumps it)."""
    if hasattr(cfg, "model_dump"):
        return dict(cfg.model_dump(exclude_none=True))
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            return dict(OmegaConf.to_container(cfg, resolve=True))
    except ImportError:  # pragma: no cover - omegaconf is a podium dependency
        pass
    if not isinstance(cfg, Mapping):
        raise NemoRLWiringError(f"{SECTION}: expected the recipe's section as a mapping, got {type(cfg).__name__}")
    return dict(cfg)


def _same_checkpoint(recipe_value: str, served: str | None) -> bool:
    """Whether the run's checkpoint can be the one the trainer's recipe names (a relative path is
    resolved from the trainer's working directory, which may not be the recipe's: then the last
    path component decides)."""
    if not served:
        return True
    ref = normalise_checkpoint(str(recipe_value), Path.cwd())
    return ref.name == served or Path(str(recipe_value).rstrip("/")).name == Path(served).name


def teacher_worker_groups(
    rendezvous_path: str | Path,
    opd_cfg: Any,
    *,
    ready_timeout_s: float | None = None,
    options: ClientOptions | None = None,
) -> tuple[dict[str, RemoteTeacherWorkerGroup], dict[str, str]]:
    """``(groups, alias_to_group_alias)`` for NeMo RL's MOPD trainer (see the module doc);
    ``ready_timeout_s``: how long to wait for the teachers (default: the client's)."""
    served, alias_to_group_alias, used = ready_teachers(rendezvous_path, opd_cfg, ready_timeout_s=ready_timeout_s,
                                                         options=options)
    groups = {alias: RemoteTeacherWorkerGroup(rendezvous_path, alias, options=used, model=model)
              for alias, model in served.items()}
    return groups, alias_to_group_alias


def ready_teachers(
    rendezvous_path: str | Path,
    opd_cfg: Any,
    *,
    ready_timeout_s: float | None = None,
    options: ClientOptions | None = None,
) -> tuple[dict[str, ModelInfo | None], dict[str, str], ClientOptions]:
    """What every MOPD facade is built from: each teacher of the run that the recipe's section
    ``opd_cfg`` maps, under its primary alias (the first alias of the recipe it serves), with its
    model info once it is ready (None if its record carries none); every alias mapped to its
    primary alias; the client options used. Checks that the run serves every alias with the
    checkpoint the recipe names."""
    cfg = plain_dict(opd_cfg)
    mapping = cfg.get(MAPPING_KEY)
    if not isinstance(mapping, Mapping) or not mapping:
        raise NemoRLWiringError(f"{SECTION}.{MAPPING_KEY}: missing or empty; pass the recipe's "
                                f"'{SECTION}' section (master_config['{SECTION}'])")
    client = PodiumClient(rendezvous_path, options=options)
    try:
        rdv = client.rendezvous
        where = f"run {rdv.run_name!r} ({client.layout.rendezvous_path})"
        key_of: dict[str, str] = {}
        for alias, checkpoint in mapping.items():
            if alias not in rdv.routing:
                raise NemoRLWiringError(
                    f"{SECTION}.{MAPPING_KEY}.{alias}: {where} serves no alias {alias!r} (it serves "
                    f"{', '.join(sorted(rdv.routing))}); start the teachers from this recipe: podium up <recipe>")
            key_of[alias] = rdv.routing[alias]
            served = rdv.entry(key_of[alias]).model_name
            if not _same_checkpoint(checkpoint, served):
                raise NemoRLWiringError(
                    f"{SECTION}.{MAPPING_KEY}.{alias}: the recipe names {checkpoint!r} but {where} serves "
                    f"{served!r} for it; start the teachers from this recipe (podium up <recipe> --replace)")
        primary: dict[str, str] = {}  # teacher key -> its first alias in recipe order
        for alias, key in key_of.items():
            primary.setdefault(key, alias)
        models = {alias: client.teacher(key).wait_ready(ready_timeout_s).model for key, alias in primary.items()}
        return models, {alias: primary[key] for alias, key in key_of.items()}, client.options
    finally:
        client.close()


def _only_alias(client: PodiumClient) -> str:
    rdv = client.rendezvous
    if len(rdv.teachers) == 1:
        (entry,) = rdv.teachers.values()
        return entry.aliases[0]
    if rdv.default_alias:
        return rdv.default_alias
    names = ", ".join(a for e in rdv.teachers.values() for a in e.aliases)
    raise NemoRLWiringError(f"run {rdv.run_name!r} has {len(rdv.teachers)} teachers and no default alias: "
                            f"name one (alias=...; aliases: {names})")


def distillation_teacher(
    rendezvous_path: str | Path,
    alias: str | None = None,
    *,
    ready_timeout_s: float | None = None,
    options: ClientOptions | None = None,
    values_datatype: str = "FP32",
    indices_datatype: str = "INT32",
) -> RemoteDistillationTeacher:
    """The teacher NeMo RL's distillation loop holds (``alias=None``: the run's only teacher, or
    its default alias's), once that teacher is ready."""
    client = PodiumClient(rendezvous_path, options=options)
    try:
        alias = alias or _only_alias(client)
        record = client.teacher(alias).wait_ready(ready_timeout_s)
        return RemoteDistillationTeacher(rendezvous_path, alias, options=client.options, model=record.model,
                                         values_datatype=values_datatype, indices_datatype=indices_datatype)
    finally:
        client.close()


@contextlib.contextmanager
def distillation_policy(
    rendezvous_path: str | Path, alias: str | None = None, **kwargs: Any
) -> Iterator[RemoteDistillationTeacher]:
    """Within the block, NeMo RL's distillation ``setup`` gets the podium teacher where it builds
    ``Policy(name_prefix="teacher", ...)`` (the student's ``Policy`` is built as before)::

        with podium.nemo_rl.distillation_policy("/shared/run/rendezvous.json"):
            (student, student_generation, cluster, ..., teacher, ...) = distillation.setup(...)

    ``nemo_rl.algorithms.distillation`` builds both with its module-level ``Policy``; that one
    name is replaced for the block and restored after it. ``kwargs`` are
    :func:`distillation_teacher`'s (``ready_timeout_s``, ``options``, ``values_datatype``,
    ``indices_datatype``); any other raises :class:`TypeError` before the block runs."""
    import nemo_rl.algorithms.distillation as upstream

    teacher = distillation_teacher(rendezvous_path, alias, **kwargs)
    original = upstream.Policy

    def policy(*args: Any, **kw: Any) -> Any:
        if kw.get("name_prefix") == "teacher":
            return teacher
        return original(*args, **kw)

    upstream.Policy = policy
    try:
        yield teacher
    finally:
        upstream.Policy = original
