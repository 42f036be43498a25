"""Subprocess worker for the rendezvous concurrency test (run as a script; prints JSON stats).

    python rdv_worker.py write RECORD_PATH JOB_ID N        # N fenced writes of one record
    python rdv_worker.py read SECONDS RECORD_PATH...       # read every record in a loop

Each record carries a payload of varying length and its SHA-256, so a reader notices any file that
is not exactly one complete write.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from podium.rendezvous import FileReadError, Generation, RecordWriter, Status, read_record  # noqa: E402


def payload_for(i: int, who: str) -> str:
    return (f"{who}:{i}:" * (200 + (i * 37) % 900))[: 2000 + (i * 7919) % 30000]


def check(record) -> None:  # type: ignore[no-untyped-def]
    payload = record.extra["payload"]
    if hashlib.sha256(payload.encode()).hexdigest() != record.extra["digest"]:
        raise ValueError("payload does not match its digest")


def write(path: str, job_id: int, n: int) -> dict:
    writer = RecordWriter(path, teacher_key=f"key{job_id}", teacher_name=f"t{job_id}", generation=Generation(job_id, 0))
    for i in range(n):
        payload = payload_for(i, str(job_id))
        writer.publish(Status.READY, url=f"http://127.0.0.1:{23000 + i % 999}", payload=payload,
                       digest=hashlib.sha256(payload.encode()).hexdigest(), seq=i)
    return {"writes": n}


def read(seconds: float, paths: list[str]) -> dict:
    reads = bad = 0
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for path in paths:
            try:
                check(read_record(path))
                reads += 1
            except (FileReadError, ValueError, KeyError) as exc:
                bad += 1
                errors.append(str(exc)[:200])
    return {"reads": reads, "bad": bad, "errors": errors[:5], "pid": os.getpid()}


if __name__ == "__main__":
    if sys.argv[1] == "write":
        result = write(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        result = read(float(sys.argv[2]), sys.argv[3:])
    sys.stdout.write(json.dumps(result) + "\n")
