"""``ensure_submitted``: reattach to live jobs, submit once under concurrency, resubmit ended ones
(each new job with a fresh restart ledger)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from harness.fake_backend import fake_slurm as fake_slurm_backend

from podium.config.spec import TeacherSpec
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.restarts import RestartLedger
from podium.launcher.login import submission
from podium.launcher.login.claims import claim_state

SPEC = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt",
                   num_nodes=1, gpus_per_node=1)


@pytest.fixture
def fake_slurm(monkeypatch):
    # Jobs the scheduler runs that no job.json names (the real one: tests/integration/test_submit_once.py):
    # fake.unrecorded.
    with fake_slurm_backend(monkeypatch, submit_delay_s=0.2) as fake:  # a slow sbatch widens the race window
        yield fake.jobs, fake.submitted, fake.unrecorded


def test_concurrent_ensure_submits_once(tmp_path: Path, fake_slurm) -> None:
    _jobs, calls, _ = fake_slurm
    files = TeacherFiles(tmp_path / "teachers" / "math-abcdef12")
    files.folder.mkdir(parents=True)
    results = []
    threads = [threading.Thread(target=lambda: results.append(submission.ensure_submitted(SPEC, files)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["100"]
    assert sorted(a for _, a in results) == ["reattached"] * 3 + ["submitted"]
    assert files.claim_numbers() == [0]  # one claim was taken, and released
    assert claim_state(files, 0) == "released"


def test_ended_job_is_resubmitted(tmp_path: Path, fake_slurm) -> None:
    jobs, _calls, _ = fake_slurm
    files = TeacherFiles(tmp_path / "t")
    files.folder.mkdir(parents=True)
    record, action = submission.ensure_submitted(SPEC, files)
    assert action == "submitted"
    assert submission.ensure_submitted(SPEC, files)[1] == "reattached"
    jobs[record.job_id] = "CANCELLED"
    record2, action2 = submission.ensure_submitted(SPEC, files)
    assert action2 == "resubmitted" and record2.previous_job_ids == [record.job_id]


def test_a_live_job_that_job_json_does_not_name_is_adopted(tmp_path: Path, fake_slurm) -> None:
    jobs, calls, unrecorded = fake_slurm
    files = TeacherFiles(tmp_path / "t")
    files.folder.mkdir(parents=True)
    jobs["77"] = "RUNNING"
    unrecorded.append("77")  # submitted by an `up` that died before writing job.json
    record, action = submission.ensure_submitted(SPEC, files)
    assert (record.job_id, action, calls) == ("77", "reattached", [])
    assert JobRecord.read(files).job_id == "77"
    jobs["77"] = "CANCELLED"  # once it has ended, the next `up` submits, keeping it in the history
    record, action = submission.ensure_submitted(SPEC, files)
    assert action == "resubmitted" and calls == [record.job_id] and record.previous_job_ids == ["77"]


def test_stale_claim_is_taken_over(tmp_path: Path, fake_slurm) -> None:
    files = TeacherFiles(tmp_path / "t")
    files.folder.mkdir(parents=True)
    files.claim(3).write_text('{"pid": 999999999, "host": "elsewhere", "time": 0}')
    old = time.time() - 3600  # a claim's age is its file's age
    os.utime(files.claim(3), (old, old))
    assert submission.ensure_submitted(SPEC, files, timeout_s=10)[1] == "submitted"
    assert files.claim_numbers() == [4]  # taken over as claim 4; claim 3 removed


def test_down_marks_stopped_but_never_over_a_newer_generation(tmp_path: Path, monkeypatch) -> None:
    from podium.launcher.login import stop
    from podium.rendezvous.records import Generation, RecordWriter, Status, read_record

    files = TeacherFiles(tmp_path / "t")
    files.folder.mkdir(parents=True)
    old = RecordWriter(files.endpoint, teacher_key=SPEC.key, teacher_name="math", generation=Generation(7, 0))
    old.publish(Status.READY, url="http://n1:1")
    stop._mark_stopped(files)
    assert read_record(files.endpoint).status is Status.STOPPED

    new = RecordWriter(files.endpoint, teacher_key=SPEC.key, teacher_name="math", generation=Generation(7, 1))
    new.publish(Status.READY, url="http://n2:2")
    real_read = stop.read_record
    calls = []

    def read_then_requeue(path):  # a newer generation writes between down's read and its rename
        record = real_read(path)
        if not calls:
            RecordWriter(files.endpoint, teacher_key=SPEC.key, teacher_name="math",
                         generation=Generation(7, 2)).publish(Status.STARTING)
        calls.append(path)
        return record

    monkeypatch.setattr(stop, "read_record", read_then_requeue)
    stop._mark_stopped(files)
    record = read_record(files.endpoint)
    assert (record.generation, record.status) == (Generation(7, 2), Status.STARTING)


def test_a_new_job_gets_a_fresh_ledger_and_forgets_excluded_nodes(tmp_path: Path, fake_slurm) -> None:
    """A new job starts with a fresh restart ledger; a reattach keeps the running job's."""
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
