"""How the Slurm backend reads a stop signal while Slurm is still sending it.

While an outgoing signal is pending, ``scontrol show job`` says ``JobState=SIGNALING`` instead of
the job's state, so a time limit's TERM read at that moment looked like a cancel and the teacher
stopped for good instead of requeueing (seen in CI: ``SIGTERM: JobState=SIGNALING ... EndTime in
298s`` -> "stopped by Slurm"). The backend asks again until the signal is delivered. The real time
limit is ``tests/integration/test_faults_restarts.py``; this pins the reading of each answer."""

from __future__ import annotations

import time

import pytest

from podium.config.spec import TeacherSpec
from podium.launcher.backends.base import NodeContext
from podium.launcher.backends.slurm import environment

SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt", num_nodes=1,
                   gpus_per_node=1, launcher={"slurm": {"signal": "TERM", "signal_lead_s": 280}})
CTX = NodeContext(job_id="9", rank=0, num_nodes=1, restart=0, host="n1")


def _answers(monkeypatch: pytest.MonkeyPatch, *states: str, end_in_s: float = 298) -> list[str]:
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + end_in_s))
    asked: list[str] = []

    def show_job(job_id: str) -> dict[str, str]:
        state = states[min(len(asked), len(states) - 1)]
        asked.append(state)
        return {"JobState": state, "Restarts": "0", "PreemptTime": "None", "EndTime": end}

    monkeypatch.setattr(environment, "show_job", show_job)
    monkeypatch.setattr(environment, "SIGNALING_WAIT_S", 2.0)
    return asked


def test_a_time_limit_term_read_while_signaling_is_the_time_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _answers(monkeypatch, "SIGNALING", "SIGNALING", "RUNNING")
    intent = environment.SlurmEnvironment().stop_intent(CTX, "SIGTERM", SPEC)
    assert intent.kind == "time_limit" and asked == ["SIGNALING", "SIGNALING", "RUNNING"]


def test_a_cancel_read_while_signaling_is_a_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, "SIGNALING", "CANCELLED")
    assert environment.SlurmEnvironment().stop_intent(CTX, "SIGTERM", SPEC).kind == "cancel"


def test_signaling_that_never_settles_counts_as_running(monkeypatch: pytest.MonkeyPatch) -> None:
    _answers(monkeypatch, "SIGNALING")
    assert environment.SlurmEnvironment().stop_intent(CTX, "SIGTERM", SPEC).kind == "time_limit"
    _answers(monkeypatch, "SIGNALING", end_in_s=3600)  # far from the end: not the time limit's TERM
    assert environment.SlurmEnvironment().stop_intent(CTX, "SIGTERM", SPEC).kind == "cancel"
