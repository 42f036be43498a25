"""The launcher on a shared cluster (issue 20): files, claims, generations and polls that are the
run's own. Logic with fake schedulers and real processes on this machine; what needs Slurm itself
(another user's job, a time limit, a trainer killed at its time limit) is
``tests/integration/test_hardening_slurm.py``.
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from podium.config.plan import load_plan
from podium.config.spec import TeacherSpec
from podium.launcher.backends import Submission, registered
from podium.launcher.backends.base import NodeContext
from podium.launcher.backends.local import scheduler as local_scheduler
from podium.launcher.backends.local.environment import LocalEnvironment
from podium.launcher.backends.slurm import environment as slurm_environment
from podium.launcher.backends.slurm.environment import SlurmEnvironment
from podium.launcher.backends.slurm.scheduler import SlurmScheduler
from podium.launcher.common.files import CLAIM_STALE_S, TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.procs import ProcRef
from podium.launcher.common.restarts import RestartLedger, decide
from podium.launcher.common.slurm_state import JobState
from podium.launcher.common.stop_request import request_stop, stop_requested
from podium.launcher.job import ray_bootstrap as rb
from podium.launcher.job.lifecycle import IdleWatch, TeacherLifecycle
from podium.launcher.job.signals import Signals
from podium.launcher.login import status, submission
from podium.launcher.login.claims import claim_state
from podium.launcher.login.run_dir import prepare_run_dir
from podium.launcher.login.scale import scale
from podium.launcher.login.up import up
from podium.poll import poll_until
from podium.rendezvous.manifest import read_rendezvous
from podium.rendezvous.records import Generation

SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)

RECIPE = """\
on_policy_distillation:
  teacher_model_by_agent_name: {math: Qwen/Qwen2-0.5B, code: Qwen/Qwen2.5-0.5B}
  non_colocated_teachers:
    default_teacher_cfg: {num_nodes: 1, gpus_per_node: 1}
podium:
  cluster: slurm
  slurm: {gpus: false, time: "04:00:00", partition: low}
"""


@pytest.fixture
def fake_slurm(monkeypatch):
    """A Slurm whose sbatch takes a while (so concurrent commands overlap) and that counts queries."""
    jobs: dict[str, str] = {}
    queries: list[float] = []
    lock = threading.Lock()

    def submit(spec, files):
        time.sleep(0.3)
        with lock:
            job_id = str(100 + len(jobs))
            jobs[job_id] = "RUNNING"
        return job_id

    class FakeSlurm(SlurmScheduler):
        def states(self, recs):
            queries.append(time.monotonic())
            return {r.job_id: JobState(r.job_id, jobs[r.job_id]) for r in recs if r.job_id in jobs}

        def find_live(self, spec, files):
            return []

        def cancel(self, recs):
            for rec in recs:
                jobs[rec.job_id] = "CANCELLED"

    monkeypatch.setattr(submission, "submit", submit)
    with registered("slurm", FakeSlurm, SlurmEnvironment):
        yield jobs, queries


def _recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    return path


# -- 16: a live `up` on this host keeps its submit claim however long sbatch takes ---------------

def test_a_live_same_host_claim_is_never_stale(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path)
    me = ProcRef.of(os.getpid())
    files.claim(0).write_text(json.dumps({"pid": me.pid, "start": me.start, "host": socket.gethostname(),
                                          "time": time.time()}))
    old = time.time() - 10 * CLAIM_STALE_S
    os.utime(files.claim(0), (old, old))
    assert claim_state(files, 0) == "held"


# -- 10: concurrent `scale`s (and `up`) keep each other's rendezvous edits -----------------------

def test_concurrent_scales_of_two_teachers_keep_both_edits(tmp_path: Path, fake_slurm) -> None:
    run_dir = tmp_path / "run"
    up(load_plan(_recipe(tmp_path)), run_dir)
    errors: list[BaseException] = []

    def scale_teacher(name: str) -> None:
        try:
            scale(run_dir, name, 2, wait_s=1)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=scale_teacher, args=(name,)) for name in ("math", "code")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    rdv = read_rendezvous(run_dir)
    listed = {entry.name: len(entry.replicas) for entry in rdv.teachers.values()}
    assert listed == {"math": 2, "code": 2}, listed


# -- 12: a new job starts with a fresh restart ledger ----------------------------------------------

def test_a_new_job_gets_a_fresh_ledger_and_forgets_excluded_nodes(tmp_path: Path, fake_slurm) -> None:
    files = TeacherFiles(tmp_path / "teachers" / "math-abcdef12")
    files.folder.mkdir(parents=True)
    RestartLedger(consecutive_failures=4, requeues=2, excluded_nodes=("n1", "n2")).write(files)
    _, action = submission.ensure_submitted(SPEC, files)
    assert action == "submitted"
    ledger = RestartLedger.read(files)
    assert ledger.consecutive_failures == 0 and ledger.requeues == 0 and ledger.excluded_nodes == ()
    # a reattach keeps the ledger of the job that runs
    RestartLedger(consecutive_failures=1, excluded_nodes=("n3",)).write(files)
    assert submission.ensure_submitted(SPEC, files)[1] == "reattached"
    assert RestartLedger.read(files).excluded_nodes == ("n3",)


# -- run dir 0700, its files 0600 ----------------------------------------------------------------

def test_the_run_dir_is_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    os.chmod(run_dir, 0o755)  # an older podium's run dir: made private when written again
    plan = load_plan(_recipe(tmp_path))
    layout = prepare_run_dir(plan, run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    files = TeacherFiles.of_spec(run_dir, plan.teachers[0])
    for path in (layout.auth_token_path, run_dir / "plan.json", run_dir / "recipe.yaml", files.spec):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    request_stop(files, "7")
    assert stat.S_IMODE(files.stop_request.stat().st_mode) == 0o600


# -- 11: a local job's generation is newer than any the run dir recorded ---------------------------

def test_a_local_job_is_newer_than_every_recorded_one(tmp_path: Path) -> None:
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


# -- 13: Ray's temp dirs under a private parent of this user ---------------------------------------

def test_ray_temp_dirs_live_under_a_private_parent(tmp_path: Path) -> None:
    parent = rb.private_temp_root(str(tmp_path))
    temp = rb.temp_dir(parent, "12", 0, 1)
    info = parent.lstat()
    assert temp.parent == parent and parent.parent == tmp_path
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) == 0o700
    assert rb.private_temp_root(str(tmp_path)) == parent  # the same one next time


def test_a_parent_someone_else_made_is_not_used(tmp_path: Path) -> None:
    taken = tmp_path / rb.private_temp_name()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    taken.symlink_to(elsewhere)  # a link planted where this user's parent goes
    parent = rb.private_temp_root(str(tmp_path))
    assert parent != taken and not parent.is_symlink() and stat.S_IMODE(parent.stat().st_mode) == 0o700
    if os.geteuid() == 0:  # as root (CI), a directory another user owns
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 12345, 12345)
        taken.unlink()
        other.rename(taken)
        parent = rb.private_temp_root(str(tmp_path))
        assert parent != taken and parent.stat().st_uid == os.getuid()


# -- 17: `wait` asks Slurm every few seconds, the records in between -------------------------------

def test_wait_polls_slurm_with_backoff(tmp_path: Path, fake_slurm) -> None:
    _, queries = fake_slurm
    run_dir = tmp_path / "run"
    up(load_plan(_recipe(tmp_path)), run_dir)
    queries.clear()
    t0 = time.monotonic()
    with pytest.raises(status.WaitFailed):
        status.wait(run_dir, timeout_s=6)
    gaps = [b - a for a, b in itertools.pairwise(queries)]
    assert len(queries) <= 5 and queries[0] - t0 < 1, (len(queries), gaps)
    assert all(g >= 1.5 for g in gaps), gaps


# -- 9: a time limit ends a teacher unless the recipe asks for a requeue ---------------------------

def _time_limit_intent(monkeypatch: pytest.MonkeyPatch, spec: TeacherSpec, signal_name: str):
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 100))
    monkeypatch.setattr(slurm_environment, "show_job", lambda job_id: {
        "JobState": "RUNNING", "Restarts": "0", "PreemptTime": "None", "EndTime": end})
    ctx = NodeContext(job_id="9", rank=0, num_nodes=1, restart=0, host="n1")
    return slurm_environment.SlurmEnvironment().stop_intent(ctx, signal_name, spec)


@pytest.mark.parametrize("signal_name", ["SIGUSR2", "SIGTERM"])
def test_a_time_limit_stops_by_default_and_requeues_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                                signal_name: str) -> None:
    intent = _time_limit_intent(monkeypatch, SPEC, signal_name)
    assert intent.kind == "time_limit" and not intent.requeue
    ledger = RestartLedger().ended("9:0", "time_limit", intent.why)
    decision = decide(ledger, "time_limit", SPEC.launcher.restart, can_requeue=True)
    assert not decision.requeue and not decision.final and "at_time_limit" in decision.why
    asked = SPEC.model_copy(update={"launcher": SPEC.launcher.model_copy(update={
        "restart": SPEC.launcher.restart.model_copy(update={"at_time_limit": "requeue"})})})
    intent = _time_limit_intent(monkeypatch, asked, signal_name)
    assert intent.kind == "time_limit" and intent.requeue
    assert decide(ledger, "time_limit", asked.launcher.restart, can_requeue=True).requeue
    assert decide(RestartLedger().ended("9:0", "preempted", "p"), "preempted", SPEC.launcher.restart,
                  can_requeue=True).requeue  # preemption still requeues


# -- 18b: torch's store on rank 0 listens on the allocation's address only --------------------------

def test_the_torch_store_binds_the_masters_address_only() -> None:
    from podium.teacher.compute.worker import rendezvous_store

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = rendezvous_store("127.0.0.1", port, rank=0, world_size=1, timeout=datetime.timedelta(seconds=10))
    try:
        store.set("k", "v")
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # the address it was given answers
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=2):
            pass  # another address of this machine does not
    finally:
        del store


# -- 9: a teacher nobody calls stops after server.idle_stop_s -------------------------------------

class _Endpoint:
    """What the lifecycle reads of the endpoint: answers given, requests queued."""

    served = 0
    queue_depth = 0

    def model_info(self) -> dict:
        return {"served_name": "math", "vocab_size": 8}


class _ServerThread:
    def __init__(self, group, config) -> None:
        self.server = _Endpoint()

    def start(self) -> str:
        return "http://127.0.0.1:1"

    def set_ready(self, ready: bool, reason: str = "") -> None:
        pass

    def drain(self) -> None:
        pass

    def stop(self, grace_s: float = 0.0) -> None:
        pass


def test_a_teacher_nobody_calls_stops_after_idle_stop_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import podium.teacher.endpoint as endpoint

    monkeypatch.setattr(endpoint, "ServerThread", _ServerThread)
    files = TeacherFiles(tmp_path / "teachers" / "math-abcdef12")
    files.folder.mkdir(parents=True)
    spec = SPEC.model_copy(update={"launcher": SPEC.launcher.model_copy(update={
        "server": SPEC.launcher.server.model_copy(update={"idle_stop_s": 1.0})})})
    signals = Signals()
    served = threading.Thread(target=TeacherLifecycle(spec, files, Generation(5, 0), signals).serve,
                              args=(object(),), kwargs={"host": "127.0.0.1", "token": "t"})
    t0 = time.monotonic()
    served.start()
    served.join(30)
    assert not served.is_alive() and 1.0 <= time.monotonic() - t0 < 10
    intent = signals.intent()
    assert intent is not None and intent.kind == "idle" and not intent.requeue and "idle_stop_s" in intent.why


def test_calls_keep_a_teacher_from_idling() -> None:
    now = [0.0]
    watch = IdleWatch(clock=lambda: now[0])
    now[0] = 50.0
    assert watch.idle_for(served=0, queued=0) == 0.0  # the first look starts the clock
    now[0] = 90.0
    assert watch.idle_for(served=0, queued=0) == 40.0
    assert watch.idle_for(served=0, queued=1) == 0.0  # a request computing
    now[0] = 200.0
    assert watch.idle_for(served=3, queued=0) == 0.0  # answered since
    now[0] = 260.0
    assert watch.idle_for(served=3, queued=0) == 60.0


# -- 8: a job found by its name and comment must be this user's --------------------------------------

def test_a_job_of_another_user_with_the_teachers_comment_is_not_found() -> None:
    from podium.launcher.common import slurm_state as ss

    comment = "podium:abcdef123456:9f86d081884c7d65"
    # `squeue -h --me --name=... -O 'JobID:|,State:|,UserId:|,Comment:|'` (22.05 prints the uid)
    text = f"57|PENDING|{os.getuid()}|{comment}|\n58|RUNNING|{os.getuid() + 1}|{comment}|\n59|RUNNING|x(5)|a|b|\n"
    jobs = ss.parse_squeue_comments(text, with_user=True)
    assert [j.uid for j in jobs] == [os.getuid(), os.getuid() + 1, 5] and jobs[2].comment == "a|b"
    assert ss.live_with_comment(jobs, comment, uid=os.getuid()) == ["57"]
    with pytest.raises(ss.SlurmQueryError):
        ss.parse_squeue_comments(f"57|PENDING|{comment}|\n", with_user=True)  # no user column
