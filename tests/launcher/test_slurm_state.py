"""Parsers of Slurm's text, on output captured from the Slurm 22.05 test cluster (odd cases too)."""

from __future__ import annotations

import os

import pytest

from podium.launcher.common import slurm_state as ss

# `sacct -j 4,5,6,9 -o JobID,JobName,State,ExitCode,NodeList,Start,End -P` on the test cluster
SACCT = """\
JobID|JobName|State|ExitCode|NodeList|Start|End
4|wrap|COMPLETED|0:0|n[1-2]|2026-11-30T16:55:30|2026-11-30T16:55:31
4.batch|batch|COMPLETED|0:0|n1|2026-11-30T16:55:30|2026-11-30T16:55:31
4.0|hostname|COMPLETED|0:0|n[1-2]|2026-11-30T16:55:30|2026-11-30T16:55:30
6|wrap|CANCELLED by 0|0:0|n2|2026-11-30T16:55:30|2026-11-30T16:55:30
6.batch|batch|CANCELLED|0:15|n2|2026-11-30T16:55:30|2026-11-30T16:55:30
5_1|wrap|COMPLETED|0:0|n1|2026-11-30T16:55:30|2026-11-30T16:55:32
5_1.batch|batch|COMPLETED|0:0|n1|2026-11-30T16:55:30|2026-11-30T16:55:32
5_[2-3]|wrap|PENDING|0:0|None assigned|Unknown|Unknown
9|wrap|FAILED|3:0|n2|2026-11-30T16:55:30|2026-11-30T16:55:30
9.batch|batch|FAILED|3:0|n2|2026-11-30T16:55:30|2026-11-30T16:55:30
11|wrap|REQUEUED|0:0|n3|2026-11-30T16:56:00|2026-11-30T16:56:10
11|wrap|RUNNING|0:0|n4|2026-11-30T16:56:16|Unknown
12|wrap|WEIRD_NEW_STATE|0:0|n1|2026-11-30T16:56:16|Unknown
13|wrap|WEIRD_DONE|0:0|n1|2026-11-30T16:56:16|2026-11-30T16:56:20
"""

# `squeue -h -o '%i|%T|%N|%R'` while an array and a 2-node job ran
SQUEUE = """\
4|RUNNING|n[1-2]|n[1-2]
5_1|RUNNING|n1|n1
5_2|RUNNING|n1|n1
7|PENDING||(Resources)
6|COMPLETING|n2|n2
"""


def test_sacct_job_rows_only_and_kinds() -> None:
    jobs = ss.parse_sacct(SACCT)
    assert sorted(jobs) == ["11", "12", "13", "4", "5_1", "5_[2-3]", "6", "9"]
    assert jobs["4"].nodes == ("n1", "n2") and jobs["4"].kind == "done"
    assert jobs["6"].state == "CANCELLED" and jobs["6"].raw_state == "CANCELLED by 0"
    assert jobs["9"].exit_code == "3:0" and not jobs["9"].alive
    assert jobs["5_[2-3]"].kind == "pending" and jobs["5_[2-3]"].nodes == ()
    assert jobs["11"].kind == "running" and jobs["11"].nodes == ("n4",)  # last row of a requeued job
    assert jobs["12"].kind == "pending"  # unknown and not ended: never resubmit over it
    assert jobs["13"].kind == "done"  # unknown but ended


def test_squeue() -> None:
    jobs = ss.parse_squeue(SQUEUE)
    assert jobs["4"].nodes == ("n1", "n2")
    assert jobs["7"].kind == "pending" and jobs["7"].nodes == ()
    assert jobs["6"].kind == "running"


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("gpu[007-009],login1", ["gpu007", "gpu008", "gpu009", "login1"]),
        ("n1", ["n1"]),
        ("rack1-n[1-2]-ib", ["rack1-n1-ib", "rack1-n2-ib"]),
        ("None assigned", []),
        ("", []),
    ],
)
def test_expand_nodelist(text: str, names: list[str]) -> None:
    assert ss.expand_nodelist(text) == names


def test_bad_nodelist_is_an_error() -> None:
    with pytest.raises(ValueError, match="n\\[1-x\\]"):
        ss.expand_nodelist("n[1-x]")


def test_sacct_without_header_is_an_error() -> None:
    with pytest.raises(ss.SlurmQueryError):
        ss.parse_sacct("4|COMPLETED\n")


def test_failed_sacct_is_an_error(tmp_path, monkeypatch) -> None:
    fake = tmp_path / "sacct"
    fake.write_text("#!/bin/sh\necho 'sacct: error: Problem talking to the database' >&2\nexit 1\n")
    fake.chmod(0o755)
    (tmp_path / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(ss.SlurmQueryError, match="Problem talking to the database"):
        ss.query_states(["123"])


# `squeue -h --name=podium-cap-0123abcd -O 'JobID:|,State:|,Comment:|'` on the test cluster: held
# jobs with our comment, none, and someone's comment with "|" and a space; one running.
SQUEUE_COMMENTS = """\
59|PENDING|a|b c|
58|PENDING|(null)|
57|PENDING|podium:0123abcd4567:9f86d081884c7d65|
60|RUNNING|podium:0123abcd4567:9f86d081884c7d65|
"""


def test_squeue_comments_and_live_jobs_of_one_identity() -> None:
    jobs = {j.job_id: j for j in ss.parse_squeue_comments(SQUEUE_COMMENTS)}
    assert jobs["59"].comment == "a|b c" and jobs["58"].comment == ""
    assert ss.live_with_comment(jobs.values(), "podium:0123abcd4567:9f86d081884c7d65") == ["57", "60"]
    assert ss.live_with_comment(jobs.values(), "podium:0123abcd4567") == []  # exact, not a prefix
    assert ss.parse_squeue_comments("") == []


def test_squeue_comment_line_without_its_fields_is_an_error() -> None:
    with pytest.raises(ss.SlurmQueryError, match=r"JOBID|STATE|COMMENT"):
        ss.parse_squeue_comments("57|PENDING\n")


def test_a_job_of_another_user_with_the_teachers_comment_is_not_found() -> None:
    """A job found by its name and comment must be this user's."""
    comment = "podium:abcdef123456:9f86d081884c7d65"
    # `squeue -h --me --name=... -O 'JobID:|,State:|,UserId:|,Comment:|'` (22.05 prints the uid)
    text = f"57|PENDING|{os.getuid()}|{comment}|\n58|RUNNING|{os.getuid() + 1}|{comment}|\n59|RUNNING|x(5)|a|b|\n"
    jobs = ss.parse_squeue_comments(text, with_user=True)
    assert [j.uid for j in jobs] == [os.getuid(), os.getuid() + 1, 5] and jobs[2].comment == "a|b"
    assert ss.live_with_comment(jobs, comment, uid=os.getuid()) == ["57"]
    with pytest.raises(ss.SlurmQueryError):
        ss.parse_squeue_comments(f"57|PENDING|{comment}|\n", with_user=True)  # no user column
