"""The run-directory contract: atomic writes, modes, fencing, heartbeats, corrupt files, routing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import rdv_worker  # its folder is on sys.path: it is this test's

from podium.rendezvous import (
    FileReadError,
    Generation,
    Heartbeat,
    RecordWriter,
    RoutingError,
    RunLayout,
    StaleGenerationError,
    Status,
    atomic_write_json,
    build_rendezvous,
    create_token,
    read_record,
    read_rendezvous,
    read_token,
    try_read_json,
    write_rendezvous,
)
from podium.rendezvous.atomic import file_mode

WORKER = Path(rdv_worker.__file__)


def _writer(path: Path, gen: Generation, key: str = "k" * 12) -> RecordWriter:
    return RecordWriter(path, teacher_key=key, teacher_name="math", aliases=("math",), generation=gen)


def test_layout_names_every_file(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    assert layout.rendezvous_path == tmp_path / "rendezvous.json"
    assert layout.auth_token_path == tmp_path / "auth_token"
    assert layout.endpoint_relpath("math teacher/x", "0123456789ab") == "teachers/math_teacher_x-01234567/endpoint.json"
    assert RunLayout.from_rendezvous_path(layout.rendezvous_path).run_dir == tmp_path
    with pytest.raises(ValueError, match="relative"):
        layout.resolve("../elsewhere/endpoint.json")


def test_modes_hold_under_any_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        token = create_token(tmp_path / "auth_token")
        _writer(tmp_path / "endpoint.json", Generation(1)).publish(Status.STARTING)
        atomic_write_json(tmp_path / "public.json", {}, mode=0o644)
    finally:
        os.umask(old)
    assert file_mode(tmp_path / "auth_token") == 0o600
    assert file_mode(tmp_path / "endpoint.json") == 0o600
    assert file_mode(tmp_path / "public.json") == 0o644
    assert read_token(tmp_path / "auth_token") == token
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp files left


def test_token_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "auth_token"
    create_token(path)
    os.chmod(path, 0o644)
    with pytest.raises(FileReadError, match=r"0644.*chmod 600"):
        read_token(path)


def test_rendezvous_roundtrip_and_routing(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run")
    teachers = [{"key": "aaaa11112222", "name": "math", "aliases": ["math", "code"]},
                {"key": "bbbb33334444", "name": "chat", "aliases": ["chat"]}]
    rdv = build_rendezvous("r", teachers, layout=layout, default_alias="chat")
    write_rendezvous(layout, rdv)
    assert file_mode(layout.rendezvous_path) == 0o644
    back = read_rendezvous(layout.rendezvous_path)
    assert back == rdv
    assert back.teachers["aaaa11112222"].endpoint == "teachers/math-aaaa1111/endpoint.json"
    assert layout.resolve(back.teachers["aaaa11112222"].endpoint).parent.is_dir()
    assert back.resolve("code") == "aaaa11112222"
    assert back.resolve("some_other_agent") == "bbbb33334444"  # default alias
    strict = build_rendezvous("r", teachers, layout=layout, default_alias="chat", strict=True)
    with pytest.raises(RoutingError, match=r"'some_other_agent' has no teacher and strict.*code, math"):
        strict.resolve("some_other_agent")
    no_default = build_rendezvous("r", teachers, layout=layout)
    with pytest.raises(RoutingError, match="no default alias"):
        no_default.resolve("x")
    with pytest.raises(ValueError, match="default_alias 'nope'"):
        build_rendezvous("r", teachers, layout=layout, default_alias="nope")


def test_stale_generation_writer_does_not_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.json"
    old = _writer(path, Generation(500, 0))
    old.publish(Status.READY, url="http://127.0.0.1:23001")
    new = _writer(path, Generation(500, 1))
    new.publish(Status.LOADING)
    with pytest.raises(StaleGenerationError, match=r"500:0 must not overwrite .* 500:1"):
        old.publish(Status.DRAINING)
    with pytest.raises(StaleGenerationError):
        old.heartbeat()
    record = read_record(path)
    assert record.generation == Generation(500, 1) and record.status is Status.LOADING
    # a newer job id beats any restart count of an older job
    assert Generation(501, 0) > Generation(500, 7) and Generation.parse("501:0") == Generation(501)
    # the old process's heartbeat stops itself and reports it once
    fenced: list[StaleGenerationError] = []
    beat = Heartbeat(old, interval_s=0.02, on_fenced=fenced.append).start()
    deadline = time.monotonic() + 60
    while not fenced and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.stop()
    assert len(fenced) == 1
    assert read_record(path).generation == Generation(500, 1)


def test_fence_is_rechecked_just_before_the_rename(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.json"
    old = _writer(path, Generation(7, 0))
    old.publish(Status.READY)
    new = _writer(path, Generation(7, 1))
    # The newer generation writes after the old writer's first check, before its rename.
    original = old._check_fence
    calls = {"n": 0}

    def check_then_race() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            original()
            new.publish(Status.READY, url="http://new")
        else:
            original()

    old._check_fence = check_then_race  # type: ignore[method-assign]
    with pytest.raises(StaleGenerationError):
        old._write(old.record.model_copy(update={"status": Status.DRAINING}))
    assert read_record(path).url == "http://new"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_heartbeat_refreshes(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.json"
    writer = _writer(path, Generation(1))
    first = writer.publish(Status.READY, url="http://x")
    assert not first.is_stale(30.0)
    assert first.is_stale(30.0, now=first.heartbeat_at + 31)
    with Heartbeat(writer, interval_s=0.05):
        deadline = time.monotonic() + 60  # waits for the next beat, however slow the machine
        while read_record(path).heartbeat_at <= first.heartbeat_at and time.monotonic() < deadline:
            time.sleep(0.01)
    later = read_record(path)
    assert later.heartbeat_at > first.heartbeat_at and later.status is Status.READY and later.url == "http://x"
    with pytest.raises(ValueError, match="interval"):
        Heartbeat(writer, interval_s=0)


@pytest.mark.parametrize(
    ("content", "kind", "detail"),
    [
        (None, "missing", "no such file"),
        (b"", "corrupt", "empty file"),
        (b'{"teacher_key": "k", "status": "rea', "corrupt", "truncated"),
        (b"\xff\xfe\x00", "corrupt", "not UTF-8"),
        (b'{"teacher_key": "k"}', "corrupt", "not an endpoint record"),
        (b'{"teacher_key": "k", "status": "sleeping", "generation": {"job_id": 1}, "teacher_name": "t", '
         b'"host": "h", "pid": 1, "started_at": 0, "heartbeat_at": 0}', "corrupt", "status"),
    ],
)
def test_bad_record_is_reported_with_its_path(tmp_path: Path, content: bytes | None, kind: str, detail: str) -> None:
    path = tmp_path / "endpoint.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(FileReadError) as info:
        read_record(path)
    assert info.value.kind == kind and detail in str(info.value) and str(path) in str(info.value)
    assert not try_read_json(path).ok or kind == "corrupt"


def test_truncated_record_heals_when_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.json"
    writer = _writer(path, Generation(3))
    writer.publish(Status.READY, url="http://x")
    full = path.read_bytes()
    path.write_bytes(full[: len(full) // 2])  # what a non-atomic writer or a crashed copy leaves
    with pytest.raises(FileReadError, match=r"endpoint.json: corrupt"):
        read_record(path)
    writer.heartbeat()  # the owner's next write replaces it whole
    assert read_record(path).url == "http://x"


MIN_CHANGES = 20  # reads per reader that found a record rewritten since its previous read


def test_concurrent_writers_and_readers_threads(tmp_path: Path) -> None:
    """Readers run until the writers are done, and the writers until every reader has seen them
    write MIN_CHANGES times: no reader can finish, or start, outside the writes."""
    paths = [tmp_path / f"t{i}" / "endpoint.json" for i in range(3)]
    for i, p in enumerate(paths):
        p.parent.mkdir()
        rdv_worker.write(str(p), 10 + i, 1)
    writers_done = threading.Event()
    enough = [threading.Event() for _ in range(4)]
    results: dict[int, dict] = {}
    writes: dict[int, dict] = {}

    def reader(k: int) -> None:
        results[k] = rdv_worker.read([str(p) for p in paths], until=writers_done.is_set,
                                     min_changes=MIN_CHANGES, on_enough=enough[k].set)

    def writer(i: int) -> None:
        writes[i] = rdv_worker.write(str(paths[i]), 10 + i, 150, keep_going=lambda: not all(e.is_set() for e in enough))

    readers = [threading.Thread(target=reader, args=(k,)) for k in range(len(enough))]
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(len(paths))]
    for t in readers + writers:
        t.start()
    for t in writers:
        t.join(rdv_worker.MAX_S + 60)
    writers_done.set()
    for t in readers:
        t.join(rdv_worker.MAX_S + 60)
    assert not any(t.is_alive() for t in readers + writers)
    assert len(results) == len(readers) and len(writes) == len(writers)
    assert all(r["bad"] == 0 for r in results.values()), results
    assert all(r["changes"] >= MIN_CHANGES and not r["timed_out"] for r in results.values()), results
    for i, p in enumerate(paths):
        assert writes[i]["writes"] >= 150
        assert read_record(p).extra["seq"] == writes[i]["writes"] - 1


def test_concurrent_writers_and_readers_processes(tmp_path: Path) -> None:
    """The same across processes: readers until a writers-done file, writers until every reader's ok file."""
    paths = [tmp_path / f"t{i}" / "endpoint.json" for i in range(2)]
    for i, p in enumerate(paths):
        p.parent.mkdir()
        rdv_worker.write(str(p), 20 + i, 1)
    done = tmp_path / "writers_done"
    oks = [tmp_path / f"reader{k}.ok" for k in range(3)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    readers = [subprocess.Popen([sys.executable, str(WORKER), "read", str(done), str(ok), str(MIN_CHANGES),
                                 *map(str, paths)], stdout=subprocess.PIPE, text=True, env=env) for ok in oks]
    writers = [subprocess.Popen([sys.executable, str(WORKER), "write", str(p), str(20 + i), "200", *map(str, oks)],
                                stdout=subprocess.PIPE, text=True, env=env) for i, p in enumerate(paths)]

    def stats(proc: subprocess.Popen) -> dict:
        out, _ = proc.communicate(timeout=rdv_worker.MAX_S + 60)
        assert proc.returncode == 0, proc.args
        return json.loads(out.strip().splitlines()[-1])

    try:
        writes = [stats(proc) for proc in writers]
    finally:
        done.touch()
    read_stats = [stats(proc) for proc in readers]
    assert all(o["bad"] == 0 for o in read_stats), read_stats
    assert all(o["changes"] >= MIN_CHANGES and not o["timed_out"] for o in read_stats), read_stats
    for i, p in enumerate(paths):
        record = read_record(p)
        assert writes[i]["writes"] >= 200 and record.extra["seq"] == writes[i]["writes"] - 1
        assert hashlib.sha256(record.extra["payload"].encode()).hexdigest() == record.extra["digest"]
