"""Worker for the rendezvous concurrency tests (functions for threads; run as a script, prints JSON stats).

    python rdv_worker.py write RECORD_PATH JOB_ID N [OK_FILE...]
        fenced writes of one record: at least N, and on until every OK_FILE exists
    python rdv_worker.py read DONE_FILE OK_FILE MIN_CHANGES RECORD_PATH...
        read every record in a loop until DONE_FILE exists; create OK_FILE once MIN_CHANGES reads
        saw a record another write had changed since this reader's previous read of it

Each record carries a payload of varying length and its SHA-256, so a reader notices any file that
is not exactly one complete write. The writers go on until every reader has seen them write, and
the readers until the writers are done, so reads and writes overlap however the machine schedules
them. Both give up after ``MAX_S`` (a stuck peer), which the test then reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from podium.rendezvous import FileReadError, Generation, RecordWriter, Status, read_record


def payload_for(i: int, who: str) -> str:
    return (f"{who}:{i}:" * (200 + (i * 37) % 900))[: 2000 + (i * 7919) % 30000]


def check(record) -> None:  # type: ignore[no-untyped-def]
    payload = record.extra["payload"]
    if hashlib.sha256(payload.encode()).hexdigest() != record.extra["digest"]:
        raise ValueError("payload does not match its digest")


MAX_S = 300.0


def write(path: str, job_id: int, n: int, keep_going: Callable[[], bool] | None = None,
          max_s: float = MAX_S) -> dict:
    """At least ``n`` writes, then more while ``keep_going()`` (at most ``max_s``); the count written."""
    writer = RecordWriter(path, teacher_key=f"key{job_id}", teacher_name=f"t{job_id}", generation=Generation(job_id, 0))
    deadline = time.monotonic() + max_s
    i = 0
    while i < n or (keep_going is not None and keep_going() and time.monotonic() < deadline):
        payload = payload_for(i, str(job_id))
        writer.publish(Status.READY, url=f"http://127.0.0.1:{23000 + i % 999}", payload=payload,
                       digest=hashlib.sha256(payload.encode()).hexdigest(), seq=i)
        i += 1
    return {"writes": i}


def read(paths: list[str], until: Callable[[], bool], min_changes: int = 0,
         on_enough: Callable[[], None] | None = None, max_s: float = MAX_S) -> dict:
    """Read every record until ``until()``; ``changes`` counts reads that found a record rewritten
    since this reader's previous read of it (reads while a writer wrote). ``on_enough()`` is called
    once ``changes`` reaches ``min_changes``."""
    reads = bad = changes = 0
    errors: list[str] = []
    last: dict[str, int] = {}
    told = on_enough is None
    deadline = time.monotonic() + max_s
    timed_out = False
    while not until():
        if time.monotonic() > deadline:
            timed_out = True
            break
        for path in paths:
            try:
                record = read_record(path)
                check(record)
                reads += 1
                seq = record.extra["seq"]
                if path in last and last[path] != seq:
                    changes += 1
                last[path] = seq
            except (FileReadError, ValueError, KeyError) as exc:
                bad += 1
                errors.append(str(exc)[:200])
        if not told and changes >= min_changes:
            on_enough()
            told = True
    return {"reads": reads, "bad": bad, "changes": changes, "errors": errors[:5], "timed_out": timed_out,
            "pid": os.getpid()}


if __name__ == "__main__":
    if sys.argv[1] == "write":
        oks = [Path(p) for p in sys.argv[5:]]
        result = write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                       keep_going=lambda: not all(p.exists() for p in oks))
    else:
        done, ok, min_changes = Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
        result = read(sys.argv[5:], until=done.exists, min_changes=min_changes, on_enough=ok.touch)
    sys.stdout.write(json.dumps(result) + "\n")
