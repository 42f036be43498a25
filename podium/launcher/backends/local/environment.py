"""The ``local`` cluster kind inside the job: the one node task submitit's local controller runs,
its job id, and the GPUs this machine gives it.

Job ids. A local job is its controller, known by its PID; PIDs do not grow (a reboot, a fresh
container), and a job's generation must be newer than every one recorded in the run dir, or an
older job's record would fence it and an older ``stop.request`` stop it. So a local job id is
``sequence * PID_SPAN + PID`` (:func:`local_job_id`): the scheduler picks a sequence above every
job id the teacher's folder records and hands it to the job in ``PODIUM_LOCAL_SEQUENCE``, and
``id % PID_SPAN`` is the controller's PID again (:func:`controller_pid`).

GPUs. A recipe asks for GPUs (``gpus_per_node``, with ``podium.slurm.gpus`` on, the default, as
NeMo RL's recipes ship); on a machine without a CUDA device the local teacher runs on CPU instead
(``--num-gpus=0``: ``gpus_per_node`` CPU worker slots) and ``up`` says so in one line. Running
slowly beats refusing: a first try on a laptop works, and the line says why it is slow. A machine
with some CUDA devices but fewer than asked is refused at ``up``, naming ``gpus_per_node``.
"""

from __future__ import annotations

import os

from podium.config.spec import TeacherSpec
from podium.launcher.backends.base import JobEnvironment, NodeContext, SubmitError, asked_gpus, host_name
from podium.launcher.common.devices import cuda_device_count

PID_SPAN = 1 << 22  # above Linux's largest pid_max (2**22)
SEQUENCE_ENV = "PODIUM_LOCAL_SEQUENCE"


def local_job_id(sequence: int, pid: int) -> str:
    """The job id of the controller ``pid`` started with ``sequence``."""
    return str(sequence * PID_SPAN + pid)


def controller_pid(job_id: str) -> int:
    """The PID of a local job's controller (a job id of an older podium is the PID itself)."""
    return int(job_id) % PID_SPAN


def local_gpu_use(teacher: str, wanted: int, found: int) -> tuple[int, str | None]:
    """GPUs the local Ray node offers a teacher that asks for ``wanted`` on a machine with ``found``
    CUDA devices, and the notice ``up`` prints: all it asks for when there are enough; none (CPU
    worker slots) with a notice when there is no CUDA device; ``SubmitError`` when there are some,
    but too few (the recipe must say which it wants)."""
    if not wanted or found >= wanted:
        return wanted, None
    if found:
        raise SubmitError(f"teacher {teacher!r}: gpus_per_node={wanted} but this machine has {found} CUDA "
                          f"device{'s' if found > 1 else ''} (set gpus_per_node: {found}, or "
                          f"podium.slurm.gpus: false to run on CPU)")
    return 0, (f"teacher {teacher!r} runs on CPU: no CUDA device found on this machine, so its "
               f"gpus_per_node={wanted} workers are CPU processes, far slower than on GPUs "
               f"(podium.slurm.gpus: false asks for CPU and silences this)")


def gpu_use(spec: TeacherSpec) -> tuple[int, str | None]:
    """:func:`local_gpu_use` of this teacher on this machine."""
    wanted = asked_gpus(spec)
    return local_gpu_use(spec.name, wanted, cuda_device_count() if wanted else 0)


class LocalEnvironment(JobEnvironment):
    name = "local"

    def node_gpus(self, spec: TeacherSpec) -> int:
        return gpu_use(spec)[0]

    def node_context(self) -> NodeContext:
        # The controller's variables for its task (those submitit's LocalJobEnvironment reads; the
        # controller runs in the login side's Python, the task needs no submitit): its PID is the job's.
        env = os.environ
        pid = env["SUBMITIT_LOCAL_JOB_ID"]
        return NodeContext(job_id=local_job_id(int(env.get(SEQUENCE_ENV) or 0), int(pid)),
                           rank=int(env.get("SUBMITIT_LOCAL_NODEID") or 0),
                           num_nodes=int(env.get("SUBMITIT_LOCAL_JOB_NUM_NODES") or 1), restart=0, host=host_name(),
                           log_job_id=pid)

    def node_address(self, interface: str | None) -> str:
        # One machine: Ray and the endpoint on loopback unless an interface is named.
        return super().node_address(interface) if interface else "127.0.0.1"
