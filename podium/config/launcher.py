"""podium's own settings: the top-level ``podium:`` section of a recipe (or ``--launcher FILE``).

```yaml
podium:
  cluster: slurm            # slurm | local (submitit's local executor, no Slurm needed)
  replicas: 1               # independent allocations serving each teacher (`podium scale` changes it live)
  run_dir: /shared/podium/NAME  # default: $PODIUM_RUNS_DIR or ~/podium-runs, /<recipe stem>-<hash8>
  slurm:  {partition, account, qos, time, constraint, exclusive, cpus_per_task, mem,
           gpus, gpu_request, extra_sbatch, setup, container_image, container_mounts,
           requeue, signal, signal_lead_s, python}
  ray:    {port_range, temp_dir_root, interface, object_store_memory_mb, nodes_timeout_s, start_attempts}
  server: {port_range, interface, max_body_mb, heartbeat_s, stale_after_s, drain_s, max_queue,
           max_tokens_per_microbatch, max_queue_delay_ms, batch_requests, max_top_k,
           max_request_tokens, max_response_mb, max_json_body_mb, header_timeout_s, idle_timeout_s,
           body_timeout_s, max_connections, max_connections_per_peer, metrics_need_token, idle_stop_s}
  restart: {max_consecutive_failures, max_requeues, backoff_s, max_backoff_s, exclude_lost_nodes,
            at_time_limit}
  teachers:
    ALIAS: {replicas, slurm: {...}, ray: {...}, server: {...}, restart: {...}}   # merged over the above
```

Every model forbids unknown keys, so a typo is an error that names its key path and lists the valid
keys. Defaults suit a typical GPU cluster (GPUs requested per node, exclusive nodes, requeue on
preemption, USR2 two minutes ahead of the time limit, which ends the teacher).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from podium.config.errors import ConfigError, did_you_mean
from podium.config.recipe import merge_with_override

SECTION = "podium"


DEFAULT_STUCK_AFTER_S = 300.0  # server.stuck_after_s (the teacher group's watch takes it as its default too)

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _port_range(value: Any) -> tuple[int, int]:
    lo, hi = value
    if not (1024 <= lo <= hi <= 65535):
        raise ValueError(f"expected [low, high] with 1024 <= low <= high <= 65535, got [{lo}, {hi}]")
    return (lo, hi)


# sbatch options podium sets itself and finds its jobs by (backends/slurm/scheduler.py job_name, job_comment).
RESERVED_SBATCH = frozenset({"comment", "job-name"})
_SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$")


class SlurmSettings(_Strict):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str = "04:00:00"
    constraint: str | None = None
    exclusive: bool = True
    cpus_per_task: int | None = Field(default=None, gt=0)
    mem: str | None = None  # e.g. "0" (all of the node) or "200G"
    # Request GPUs: `gpus_per_node` of the plan becomes --gpus-per-node (or --gres=gpu:N). On a
    # cluster without GPUs (the test cluster) set false: workers are then CPU slots.
    gpus: bool = True
    gpu_request: Literal["gpus_per_node", "gres"] = "gpus_per_node"
    extra_sbatch: dict[str, str | int | bool] = Field(default_factory=dict)
    setup: list[str] = Field(default_factory=list)  # shell lines run before the job entry
    container_image: str | None = None  # pyxis --container-image
    container_mounts: list[str] = Field(default_factory=list)  # pyxis --container-mounts
    requeue: bool = True
    signal: Literal["USR1", "USR2", "TERM"] = "USR2"
    signal_lead_s: int = Field(default=120, ge=0)  # how long before the end the signal comes
    python: str | None = None  # interpreter on the compute nodes; default: the one running podium

    @field_validator("extra_sbatch")
    @classmethod
    def _not_the_identity(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & RESERVED_SBATCH)
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by podium (the job's name and --comment are how "
                             f"`podium up` finds a teacher's job); remove them from extra_sbatch")
        return value

    @field_validator("time")
    @classmethod
    def _check_time(cls, value: str) -> str:
        if not _SLURM_TIME.match(value.strip()):
            raise ValueError("expected a Slurm time: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
        return value.strip()


class RaySettings(_Strict):
    # Each job takes a block of ports from this range, checked free on its nodes. Below Linux's
    # ephemeral range (32768-60999), where outgoing connections would take ports from under Ray.
    port_range: tuple[int, int] = (20000, 32767)
    temp_dir_root: str = "/tmp"  # per-job temp dirs are created below it
    interface: str | None = None  # network interface whose address Ray uses; default: hostname
    object_store_memory_mb: int | None = Field(default=None, gt=0)
    # How long a generation's nodes get to come together: the head's wait for every node to join
    # its Ray (and for its own `ray start`), a worker's wait for the head's address. Past it, the
    # start fails (a failure for the restart policy) naming what was missing.
    nodes_timeout_s: float = Field(default=300.0, gt=0)
    # How many times a node's `ray start` is tried when it missed one of Ray's fixed start limits
    # (a starved or slow node: its dashboard agent not up within the raylet's 15 s, its raylet not
    # registered within `ray start`'s 30 s), before the start fails the generation. Other deaths
    # of `ray start` (a bad argument, a port taken) fail it at the first.
    start_attempts: int = Field(default=3, ge=1)

    @field_validator("port_range")
    @classmethod
    def _check_ports(cls, value: tuple[int, int]) -> tuple[int, int]:
        return _port_range(value)


class ServerSettings(_Strict):
    port_range: tuple[int, int] = (18500, 18999)
    interface: str | None = None  # bind address's interface; default: the node's hostname address
    max_body_mb: int = Field(default=512, gt=0)
    heartbeat_s: float = Field(default=10.0, gt=0)
    stale_after_s: float = Field(default=60.0, gt=0)
    drain_s: float = Field(default=10.0, ge=0)  # on preemption, queued requests get this long
    max_queue: int = Field(default=64, gt=0)  # infer requests queued or running at once; beyond: 503 + Retry-After
    # Tokens (rows × their bucket length) in one forward micro-batch. None: the teacher block's
    # sequence_packing / dynamic_batching logprob_mb_tokens where enabled (classic distillation
    # recipes), else micro_batch_size × the model's max sequence length (NeMo RL's own formula).
    max_tokens_per_microbatch: int | None = Field(default=None, gt=0)
    # How long an idle teacher lets a request wait for company before computing it (requests
    # that arrive while it computes are batched anyway).
    max_queue_delay_ms: float = Field(default=5.0, ge=0)
    # False: one request per batch through the group, in arrival order (no batching across callers).
    batch_requests: bool = True
    # A teacher nobody has called for this long stops (its job ends, its nodes go back); None: never.
    # For shared clusters, where a forgotten teacher would hold its nodes until its time limit.
    idle_stop_s: float | None = Field(default=None, gt=0)
    # What one request may cost, refused (4xx naming the key) before anything is computed.
    max_top_k: int = Field(default=256, gt=0)  # top-k width (NeMo RL distillation uses 64)
    max_request_tokens: int = Field(default=2_097_152, gt=0)  # rows × padded width of one request
    max_response_mb: int = Field(default=2048, gt=0)  # bytes of one answer, estimated before compute
    max_json_body_mb: int = Field(default=16, gt=0)  # a JSON body (binary ones: max_body_mb)
    # Connections: closed when a request's headers take longer than header_timeout_s, when idle
    # longer than idle_timeout_s; a body with no byte for body_timeout_s is answered 408.
    header_timeout_s: float = Field(default=10.0, gt=0)
    idle_timeout_s: float = Field(default=60.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    # Open connections, in all and per client address: at the cap, the oldest idle one is closed
    # to make room (none idle: the new one is refused).
    max_connections: int = Field(default=1024, gt=0)
    max_connections_per_peer: int = Field(default=256, gt=0)
    # /metrics: aggregate load figures, open to scrapers like Triton's and vLLM's; true: it needs
    # the bearer token like every route but liveness (the generation's job id is in it).
    metrics_need_token: bool = False
    # A call (or the warm-up forward that comes before ready) whose ranks finish no micro-batch for
    # this long, or for 10x what the teacher's measured speed says its largest micro-batch takes if
    # that is longer, is stuck: the generation fails and the restart policy brings the teacher back.
    # Above what a cold first forward of the model takes (a lazy collective init, a compile).
    stuck_after_s: float = Field(default=DEFAULT_STUCK_AFTER_S, gt=0)

    @field_validator("port_range")
    @classmethod
    def _check_ports(cls, value: tuple[int, int]) -> tuple[int, int]:
        return _port_range(value)

    @model_validator(mode="after")
    def _stale_after_heartbeat(self) -> ServerSettings:
        if self.stale_after_s <= self.heartbeat_s:
            raise ValueError(
                f"stale_after_s ({self.stale_after_s}) must exceed heartbeat_s ({self.heartbeat_s})"
            )
        return self


class RestartSettings(_Strict):
    """When a teacher comes back by itself, and when it stops trying.

    A *failure* (a start that fails, a join timeout, a load error, a node lost while serving)
    requeues the job after a backoff that doubles from ``backoff_s`` up to ``max_backoff_s``;
    ``max_consecutive_failures`` failed generations in a row end the teacher (``failed``, final).
    A preemption is not a failure: the job requeues at once, up to ``max_requeues`` times (None:
    without limit). A time limit ends the teacher (``at_time_limit: stop``, so ``slurm.time``
    bounds what it holds), or, with ``at_time_limit: requeue``, requeues it as a preemption does.
    A node lost while serving is excluded from the next generation's allocation when
    ``exclude_lost_nodes`` (and the site lets jobs change their excluded nodes).
    """

    max_consecutive_failures: int = Field(default=3, ge=1)
    max_requeues: int | None = Field(default=None, ge=0)
    backoff_s: float = Field(default=30.0, ge=0)
    max_backoff_s: float = Field(default=600.0, ge=0)
    exclude_lost_nodes: bool = True
    at_time_limit: Literal["stop", "requeue"] = "stop"


class TeacherLauncherOverrides(_Strict):
    replicas: int | None = Field(default=None, ge=1)
    slurm: dict[str, Any] = Field(default_factory=dict)
    ray: dict[str, Any] = Field(default_factory=dict)
    server: dict[str, Any] = Field(default_factory=dict)
    restart: dict[str, Any] = Field(default_factory=dict)


class TeacherLauncherSettings(_Strict):
    """The settings one teacher runs with (what its ``TeacherSpec`` carries)."""

    cluster: Literal["slurm", "local"] = "slurm"
    run_dir: str | None = None
    # Independent allocations (jobs, generations, endpoints) of the same teacher, among which
    # clients spread their calls and fail over: what `podium up` brings the teacher to. Not part of
    # what the teacher is (its key), and `podium scale` changes it for a running teacher.
    replicas: int = Field(default=1, ge=1)
    slurm: SlurmSettings = Field(default_factory=SlurmSettings)
    ray: RaySettings = Field(default_factory=RaySettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    restart: RestartSettings = Field(default_factory=RestartSettings)


class LauncherSettings(TeacherLauncherSettings):
    """The whole ``podium:`` section: the settings of every teacher, and per-alias overrides."""

    teachers: dict[str, TeacherLauncherOverrides] = Field(default_factory=dict)

    def for_teacher(self, overrides: Mapping[str, Any], where: str) -> TeacherLauncherSettings:
        """These settings with one teacher's overrides merged in (validated again)."""
        base = self.model_dump(mode="python", exclude={"teachers"})
        merged = parse_launcher(merge_with_override(base, dict(overrides)), where)
        return TeacherLauncherSettings.model_validate(merged.model_dump(mode="python", exclude={"teachers"}))


# Not compared between a live job and the recipe: where the run lives is the run dir itself, and
# the replica count is the number of jobs, not a setting of any one of them (`up` and `scale`
# submit or stop replicas for it).
NOT_COMPARED = frozenset({"run_dir", "replicas"})


@dataclass(frozen=True)
class SettingChange:
    """One launcher setting that differs between a live job and the plan (``key``: ``slurm.time``)."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}={_shown(self.old)}, the recipe now says {_shown(self.new)}"


def _shown(value: Any) -> str:
    if value is None:
        return "(unset)"
    return value if isinstance(value, str) else json.dumps(value)


def launcher_changes(old: TeacherLauncherSettings, new: TeacherLauncherSettings) -> list[SettingChange]:
    """The settings ``new`` changes from ``old`` (dotted keys, sorted; ``run_dir`` not compared)."""
    before, after = _flatten(old.model_dump(mode="json")), _flatten(new.model_dump(mode="json"))
    return [SettingChange(key, before.get(key), after.get(key)) for key in sorted(set(before) | set(after))
            if key.split(".", 1)[0] not in NOT_COMPARED and before.get(key) != after.get(key)]


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):  # an empty mapping (extra_sbatch: {}) adds no key
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_launcher(raw: Mapping[str, Any] | None, where: str = SECTION) -> LauncherSettings:
    """Validate a ``podium:`` section; errors name the full key path and list the valid keys."""
    try:
        return LauncherSettings.model_validate(dict(raw or {}))
    except ValidationError as exc:
        raise ConfigError(_describe(exc, where)) from None


def _describe(exc: ValidationError, where: str) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        path = ".".join([where, *loc])
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(loc[:-1])
            lines.append(
                f"{path}: unknown key{did_you_mean(loc[-1], valid)}; valid keys: {', '.join(valid)}"
            )
        else:
            lines.append(f"{path}: {err['msg']} (got {err.get('input')!r})")
    return "\n".join(lines)


def _valid_keys(loc: list[str]) -> list[str]:
    model: type[BaseModel] = LauncherSettings
    for part in loc:
        field = model.model_fields.get(part)
        if field is None:  # inside `teachers.<alias>`: the alias itself
            model = TeacherLauncherOverrides
            continue
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
    return sorted(model.model_fields)
