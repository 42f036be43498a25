"""The ``local`` kind's job ids (:mod:`podium.launcher.backends.local`): a job submitted now is newer
than every job the teacher's folder records, in its scheduler and in its task alike; a real local
controller on this machine."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from podium.config.spec import TeacherSpec
from podium.launcher.backends import Submission
from podium.launcher.backends.base import NodeContext
from podium.launcher.backends.local import scheduler as local_scheduler
from podium.launcher.backends.local.environment import LocalEnvironment
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.stop_request import request_stop, stop_requested
from podium.poll import poll_until
from podium.rendezvous.records import Generation

SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)


def test_a_local_job_is_newer_than_every_recorded_one(tmp_path: Path) -> None:
    """A local job's generation is newer than any the run dir recorded."""
    files = TeacherFiles(tmp_path / "teachers" / "math-abcdef12")
    files.submitit.mkdir(parents=True)
    # What an older job left (a PID larger than any this machine hands out now): its record and
    # a stop request for it.
    old = 4_000_000
    JobRecord(teacher_key=SPEC.key, teacher_name=SPEC.name, job_id=str(old), cluster="local",
              submitted_at=0.0, folder=str(files.submitit)).write(files)
    request_stop(files, str(old))
    scheduler = local_scheduler.LocalScheduler()
    sub = Submission(backend="local", teacher="math-abcdef12", folder=files.submitit, text="",
                     command=(sys.executable, "-c", "import time; time.sleep(60)"))
    job_id = scheduler.submit(sub)
    record = JobRecord(teacher_key=SPEC.key, teacher_name=SPEC.name, job_id=job_id, cluster="local",
                       submitted_at=time.time(), folder=str(files.submitit))
    try:
        assert int(job_id) > old
        # the controller's argv names its folder once it has exec'd
        poll_until(lambda: scheduler.states([record])[job_id].state == "RUNNING", timeout_s=10, interval_s=0.1,
                   what="the local controller")
        assert scheduler.find_live(SPEC, files) == [job_id]
        assert stop_requested(files, job_id) is None  # the old job's request does not stop it
        # the task computes the same job id, so its generation fences the old one's record
        pid = int(job_id) % local_scheduler.PID_SPAN
        ctx = _local_context({**_proc_environ(pid), "SUBMITIT_LOCAL_JOB_ID": str(pid)})
        assert ctx.job_id == job_id and ctx.generation > Generation(old, 0)
    finally:
        scheduler.cancel([record])
    assert scheduler.states([record])[job_id].state == "COMPLETED"


def _proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _local_context(env: dict[str, str]) -> NodeContext:
    saved = dict(os.environ)
    try:
        os.environ.update({**env, "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
                           "SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_LOCALID": "0",
                           "SUBMITIT_LOCAL_NTASKS": "1"})
        return LocalEnvironment().node_context()
    finally:
        os.environ.clear()
        os.environ.update(saved)
