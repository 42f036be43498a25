"""Fault injection for tests: one setting, ``PODIUM_FAULTS``, read here and nowhere else.

A test (never a user) sets ``PODIUM_FAULTS`` in the environment of ``podium up``; the job inherits
it (Slurm's ``--export=ALL``, the local executor's environment), so every node task reads the same
value. It is JSON (``{"fail_node_rank": 1}``) or comma-separated ``key=value`` pairs
(``fail_node_rank=1,delay_start_s=5``; a bare key is true: ``exit_after_submit``). Use JSON for a
value with a comma in it. An unknown key or a bad value is an error that names the variable.

=======================  ===========  ==================================================================
key                      read by      what it does
=======================  ===========  ==================================================================
``exit_after_submit``    ``up``       ends ``up`` with ``os._exit(17)`` right after the scheduler
                                      returned a job id, before ``job.json`` is written (a crash, a kill
                                      or a lost login session at the worst moment)
``fail_node_rank``       node tasks   that rank's start fails (before its Ray starts), naming the fault
``delay_start_s``        node tasks   every task waits that long before it installs its signal
                                      handlers (a stop signal then finds none of podium's yet)
``ray_start_args``       node tasks   these arguments (shell words) are appended to every node's
                                      ``ray start`` (a bad one makes it die: what the head must notice
                                      at once, and report by its log's cause)
``slow_ray_agent_rank``  node tasks   that rank's first ``ray start`` has a dashboard agent that waits
                                      :data:`SLOW_AGENT_S` before it starts (a starved node's): the raylet
                                      gives up on it after Ray's fixed 15 s and ``ray start`` fails as
                                      Ray's start limits make it fail, which the node must try again
``take_ray_port_rank``   node tasks   that rank's first ``ray start`` finds its block's node-manager port taken (a
                                      socket of the task holds it, as another user's process could
                                      between the block's check and Ray's bind): the node must start
                                      its Ray again on another block
``freeze_call_rank``     workers      that rank of the teacher's group stops itself (SIGSTOP) at the start of its
                                      first call (the warm-up forward before ready): a frozen process,
                                      which the group's watch must find and name
``fail_call_token``      workers      every rank of the teacher's group raises in a call whose first
                                      row starts with this token id (a request whose own computation
                                      fails, as an out-of-memory would: the group must survive it)
=======================  ===========  ==================================================================

Light (pydantic and the standard library): the launcher and the teacher's workers both read it.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

FAULTS_ENV = "PODIUM_FAULTS"
SLOW_AGENT_S = 20.0  # past the raylet's fixed 15 s wait for its dashboard agent
SLOW_AGENT_DELAY_ENV = "PODIUM_FAULT_AGENT_DELAY_S"  # read by podium.faults_site's sitecustomize


class Faults(BaseModel):
    """The faults a test asked for (none by default); see the module table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    exit_after_submit: bool = False
    fail_node_rank: int | None = Field(default=None, ge=0)
    delay_start_s: float = Field(default=0.0, ge=0)
    ray_start_args: str = ""
    fail_call_token: int | None = Field(default=None, ge=0)
    freeze_call_rank: int | None = Field(default=None, ge=0)
    slow_ray_agent_rank: int | None = Field(default=None, ge=0)
    take_ray_port_rank: int | None = Field(default=None, ge=0)

    def injected(self, key: str) -> str:
        """How logs and errors name one injected fault: ``PODIUM_FAULTS fail_node_rank=1``."""
        value = getattr(self, key)
        return f"{FAULTS_ENV} {key}" if value is True else f"{FAULTS_ENV} {key}={value}"

    def ray_start_words(self) -> list[str]:
        return shlex.split(self.ray_start_args)

    def ray_start_env(self, rank: int, attempt: int) -> dict[str, str]:
        """What the environment of node ``rank``'s ``ray start`` (try ``attempt``, from 1) adds:
        under ``slow_ray_agent_rank``, that rank's first try imports :mod:`podium.faults_site`'s
        ``sitecustomize``, which holds Ray's dashboard agent back."""
        if self.slow_ray_agent_rank != rank or attempt != 1:
            return {}
        site = os.path.join(os.path.dirname(__file__), "faults_site")  # (not imported: it imports this)
        path = os.pathsep.join(filter(None, (site, os.environ.get("PYTHONPATH"))))
        return {"PYTHONPATH": path, SLOW_AGENT_DELAY_ENV: str(SLOW_AGENT_S)}


def parse_faults(text: str) -> Faults:
    """``PODIUM_FAULTS``'s value (JSON or ``key=value,...``) as :class:`Faults`; ValueError naming
    the variable and the valid keys when it is not."""
    text = text.strip()
    raw: Any
    if text.startswith("{"):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{FAULTS_ENV}={text!r}: not valid JSON ({exc.msg})") from None
    else:
        raw = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, value = item.partition("=")
            raw[key.strip()] = value.strip() if sep else True
    try:
        return Faults.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
                             for err in exc.errors())
        raise ValueError(f"{FAULTS_ENV}={text!r}: {problems} (keys: {', '.join(Faults.model_fields)})") from None


def faults(environ: Mapping[str, str] | None = None) -> Faults:
    """The faults this process's environment asks for (``PODIUM_FAULTS``; unset: none)."""
    text = (os.environ if environ is None else environ).get(FAULTS_ENV, "")
    return parse_faults(text) if text.strip() else Faults()
