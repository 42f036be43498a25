"""The typed files processes hand each other: schema versions, the endpoint record's verdict fields,
``down``'s fenced write, ``stop.request`` and ``job.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.restarts import RestartLedger
from podium.launcher.common.stop_request import request_stop, stop_requested
from podium.rendezvous.atomic import FileReadError, atomic_write_json
from podium.rendezvous.manifest import read_rendezvous
from podium.rendezvous.records import (
    SCHEMA_VERSION,
    Generation,
    RecordWriter,
    RestartInfo,
    StaleGenerationError,
    Status,
    read_record,
)


def _writer(path: Path, generation: Generation) -> RecordWriter:
    return RecordWriter(path, teacher_key="k" * 16, teacher_name="math", generation=generation)


def test_a_schema_1_record_reads_with_its_verdict_as_fields(tmp_path: Path) -> None:
    """Schema 1 kept final/will_retry/restart/timings in ``extra``: they read as fields."""
    record = _writer(tmp_path / "endpoint.json", Generation(5)).publish(Status.READY, url="http://x")
    old = record.to_json()
    old.update(schema_version=1, final=None, will_retry=None, restart=None, timings={})
    for name in ("final", "will_retry", "restart", "timings"):
        del old[name]
    old["extra"] = {"final": False, "will_retry": True, "timings": {"ready": 3.0},
                    "restart": {"requeue": True, "final": False, "delay_s": 30.0, "why": "failure 1 of at most 3"},
                    "seq": 7}
    atomic_write_json(tmp_path / "old.json", old)
    read = read_record(tmp_path / "old.json")
    assert (read.final, read.will_retry, read.timings) == (False, True, {"ready": 3.0})
    assert read.restart == RestartInfo(requeue=True, delay_s=30.0, why="failure 1 of at most 3")
    assert read.extra == {"seq": 7}  # what schema 2 does not know stays where it was


@pytest.mark.parametrize(("reader", "path_of", "what"), [
    (read_record, lambda d: d / "endpoint.json", "an endpoint record"),
    (lambda p: read_rendezvous(p), lambda d: d / "rendezvous.json", "a rendezvous file"),
])
def test_a_newer_schema_is_refused_by_name(tmp_path: Path, reader, path_of, what: str) -> None:
    record = _writer(tmp_path / "endpoint.json", Generation(5)).publish(Status.READY, url="http://x")
    data = record.to_json() if what == "an endpoint record" else {
        "run_name": "r", "routing": {}, "teachers": {}}
    data["schema_version"] = 99
    path = path_of(tmp_path)
    atomic_write_json(path, data)
    with pytest.raises(FileReadError) as info:
        reader(path)
    assert info.value.kind == "newer"
    assert f"{what} written by a newer podium (schema 99 >" in str(info.value) and str(path) in str(info.value)
    assert "upgrade podium" in str(info.value)


def test_records_are_written_with_the_current_schema(tmp_path: Path) -> None:
    record = _writer(tmp_path / "endpoint.json", Generation(5)).publish(Status.STARTING)
    on_disk = json.loads((tmp_path / "endpoint.json").read_text())
    assert record.schema_version == on_disk["schema_version"] == SCHEMA_VERSION == 2
    assert RestartLedger().schema_version == 1


def test_a_new_status_carries_no_old_verdict(tmp_path: Path) -> None:
    writer = _writer(tmp_path / "endpoint.json", Generation(5))
    failed = writer.publish(Status.FAILED, reason="node n2 lost", final=False, will_retry=True,
                            restart=RestartInfo(requeue=True, why="failure 1"), timings={"fault": 1.0})
    assert not failed.failure_is_final()
    again = writer.publish(Status.FAILED, reason="the same")  # no verdict given: none carried over
    assert (again.final, again.will_retry, again.restart) == (None, None, None) and again.failure_is_final()
    assert again.timings == {"fault": 1.0}  # timings are kept unless given


def test_down_writes_through_the_writer_and_its_fence(tmp_path: Path) -> None:
    """``down`` (a second process) resumes the record it read; a newer generation's record that
    appeared since is left alone and the resumed writer refuses from then on."""
    path = tmp_path / "endpoint.json"
    head = _writer(path, Generation(5, 1))
    serving = head.publish(Status.READY, url="http://n1:1")
    down = RecordWriter.resume(path, read_record(path))
    stopped = down.publish(Status.STOPPED, reason="podium down")
    assert (stopped.status, stopped.url, stopped.host, stopped.pid, stopped.started_at) == (
        Status.STOPPED, "http://n1:1", serving.host, serving.pid, serving.started_at)
    _writer(path, Generation(5, 2)).publish(Status.STARTING)
    with pytest.raises(StaleGenerationError):
        down.publish(Status.STOPPED, reason="podium down")
    assert read_record(path).generation == Generation(5, 2)


def test_a_stop_request_is_for_its_job_only(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path / "teachers" / "math-12345678")
    files.folder.mkdir(parents=True)
    assert stop_requested(files, 41) is None
    request_stop(files, "41")
    assert stop_requested(files, 41) is not None and stop_requested(files, "41").job_id == "41"
    assert stop_requested(files, 42) is None  # a request left for an older job stops no later one
    files.stop_request.write_text('{"job_id": "41", "time": 1, "pid": 1, "schema_version": 9}')
    assert stop_requested(files, 41) is None  # unreadable as a request: none (the head looks again)


def test_job_json_is_a_typed_file(tmp_path: Path) -> None:
    files = TeacherFiles(tmp_path / "teachers" / "math-12345678")
    files.folder.mkdir(parents=True)
    record = JobRecord(teacher_key="k", teacher_name="math", job_id="41", cluster="slurm", submitted_at=1.0,
                       folder=str(files.submitit), previous_job_ids=["40"])
    record.write(files)
    assert JobRecord.read(files) == record
    files.job.write_text('{"teacher_key": "k"}')  # a corrupt job.json is logged, read as none
    assert JobRecord.read(files) is None
