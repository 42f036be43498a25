"""The planned teacher: one frozen, typed record per unique teacher checkpoint.

A ``TeacherSpec`` is what the planner produces and what every later part consumes: the launcher
sizes its allocation from it and reads its typed launcher settings, the worker group builds its
model from it, the rendezvous names it by its ``key``. It is written to ``spec.json`` in the
teacher's folder (:meth:`TeacherSpec.to_json`) and read back on every node
(:meth:`TeacherSpec.read`), validated both ways, so a default is declared once (in the models) and
no reader re-interprets a dict. It imports nothing heavy, so login-node commands can use it.

A teacher served by ``launcher.replicas`` independent allocations has one spec per replica
(:meth:`TeacherSpec.replica_specs`): the same teacher, the same ``key`` (what routing and the
rendezvous name), and its own ``replica`` index, from which its folder, job name and job identity
follow (:attr:`TeacherSpec.label`, :attr:`TeacherSpec.identity`). Replica 0 is named exactly as a
teacher without replicas, so one replica is today's layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, NonNegativeInt, PositiveInt, field_validator, model_validator

from podium.config.checkpoints import COMMIT
from podium.config.launcher import TeacherLauncherSettings
from podium.config.layout import ParallelLayout
from podium.config.names import name_problem
from podium.config.precision import DEFAULT_PRECISION, Precision, normalise_precision
from podium.config.teacher_keys import Fp32LmHead, fp32_lm_head_setting
from podium.rendezvous.atomic import parse_model, read_json
from podium.rendezvous.layout import REPLICA_SUFFIX, teacher_dir_name

REPLICA_MARK = "#"  # how people name one replica of a teacher: `math#1` (`podium down RUN math#1`)


def display_name(name: str, replica: int = 0) -> str:
    """How commands and tables name a replica of teacher ``name``: the name, ``name#i`` for i >= 1."""
    return f"{name}{REPLICA_MARK}{replica}" if replica else name


class TeacherSpec(ParallelLayout):
    """One unique teacher: identity, checkpoint, parallel layout (inherited), model and launcher."""

    key: str = Field(min_length=1)  # stable content hash (12 hex chars) of what makes it distinct
    name: str = Field(min_length=1)  # readable name: the teacher's first alias
    aliases: tuple[str, ...]  # every agent alias served by this teacher, in recipe order
    model_name: str  # normalised local checkpoint path, or an HF hub id left as written
    # A hub id's snapshot commit in the local HF cache, pinned by the plan (what refs/main named
    # then): every node and every generation loads exactly it. None for a local path. Part of the
    # teacher's key: other weights are another teacher.
    revision: str | None = None
    precision: Precision = DEFAULT_PRECISION
    micro_batch_size: PositiveInt = 1
    # The teacher config's token budget of a micro-batch (classic recipes: the teacher block's
    # logprob_mb_tokens); `podium.server.max_tokens_per_microbatch` wins over it.
    max_tokens_per_microbatch: PositiveInt | None = None
    # Logits are divided by it (the recipe's policy.generation.temperature, as NeMo RL's teachers
    # inherit it); a request may ask for another.
    temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    megatron_cfg_overrides: dict[str, Any] = Field(default_factory=dict)
    # NeMo RL's per-teacher fp32 LM head (false | true | "tf32"): the output layer's logits in fp32
    # (podium.teacher.model.output_gemm); part of what the teacher is (its key changes with it).
    fp32_lm_head: Fp32LmHead = False
    # The `podium:` section with this teacher's own overrides merged in.
    launcher: TeacherLauncherSettings = Field(default_factory=TeacherLauncherSettings)
    # Which of the teacher's independent allocations this spec describes (launcher.replicas of them).
    replica: NonNegativeInt = 0

    @field_validator("name")
    @classmethod
    def _printable_name(cls, value: str) -> str:
        problem = name_problem(value)
        if problem:
            raise ValueError(f"teacher name {value!r} {problem}")
        return value

    @field_validator("aliases")
    @classmethod
    def _printable_aliases(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for alias in value:
            problem = name_problem(alias)
            if problem:
                raise ValueError(f"alias {alias!r} {problem}")
        return value

    @field_validator("revision")
    @classmethod
    def _commit(cls, value: str | None) -> str | None:
        if value is not None and not COMMIT.match(value):
            raise ValueError(f"revision {value!r} is not a commit hash (40 hex characters)")
        return value

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: Any) -> str:
        return normalise_precision(value)

    @field_validator("fp32_lm_head", mode="before")
    @classmethod
    def _fp32_lm_head(cls, value: Any) -> Fp32LmHead:
        return fp32_lm_head_setting(value)

    @model_validator(mode="after")
    def _layout(self) -> TeacherSpec:
        self.check(f"teacher {self.name!r}")
        return self

    def token_budget(self, max_sequence_length: int) -> int:
        """Tokens in one forward micro-batch: the server setting, else the recipe's, else what NeMo
        RL plans for one (``micro_batch_size`` rows of the longest sequence)."""
        return int(self.launcher.server.max_tokens_per_microbatch or self.max_tokens_per_microbatch
                   or self.micro_batch_size * max_sequence_length)

    @property
    def cpus_per_task(self) -> int:
        """CPUs of each node task: ``podium.slurm.cpus_per_task``, else one per worker slot plus the
        node's Ray and driver."""
        return self.launcher.slurm.cpus_per_task or self.gpus_per_node + 1

    @property
    def label(self) -> str:
        """``<name>-<key8>`` (``-r<i>`` for replica i >= 1): how files, jobs and logs name this replica."""
        return teacher_dir_name(self.name, self.key, self.replica)

    @property
    def identity(self) -> str:
        """The key, with ``-r<i>`` for replica i >= 1: what this replica's jobs carry (never two
        replicas' jobs alike, replica 0's as a teacher's without replicas)."""
        return f"{self.key}{REPLICA_SUFFIX}{self.replica}" if self.replica else self.key

    @property
    def display(self) -> str:
        """How commands and tables name this replica: the teacher's name, ``name#i`` for i >= 1."""
        return display_name(self.name, self.replica)

    @property
    def names(self) -> frozenset[str]:
        """Every word a user may type to select this replica (``podium down/logs/scale``, ``render
        --teacher``): the teacher's name, key or any of its aliases (which select all its replicas;
        a recipe maps each alias to one teacher), its folder name and its display name."""
        return frozenset((self.name, self.key, *self.aliases, self.label, self.display))

    def replica_spec(self, replica: int) -> TeacherSpec:
        """This teacher's spec for replica ``replica``."""
        if replica < 0:
            raise ValueError(f"teacher {self.name!r}: replica {replica} < 0")
        return self if replica == self.replica else self.model_copy(update={"replica": replica})

    def replica_specs(self) -> tuple[TeacherSpec, ...]:
        """The specs of the ``launcher.replicas`` replicas the launcher settings ask for."""
        return tuple(self.replica_spec(i) for i in range(self.launcher.replicas))

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    @classmethod
    def read(cls, path: str | Path) -> TeacherSpec:
        """The spec in ``path`` (``spec.json``); a bad file is a ``FileReadError`` naming it."""
        return parse_model(cls, read_json(path), path, "a teacher spec")
