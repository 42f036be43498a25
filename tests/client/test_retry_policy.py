"""The client's retry rules (:func:`podium.client.retry.decide`) on what one exchange produced, alone:
no socket, no thread, no record on disk; the jitter's random source is given.

Every rule of the module's docstring, the crash limit, the queue-full backoff (doubling, jitter
bounds, its cap, ``Retry-After``), the pause after a 503 and the call's deadline. The same rules
end to end, against real endpoints: ``test_teacher_client.py``, ``test_replicas.py``.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time

import pytest

from podium.client import (
    ClientOptions,
    TeacherRequestError,
    TeacherRequestFailedError,
    TeacherServerError,
    TeacherUnavailableError,
)
from podium.client.deadline import CallDeadline
from podium.client.retry import (
    CRASHED,
    Answer,
    BackOff,
    Exchange,
    Fail,
    FailOver,
    Tally,
    asks_answerer,
    backoff_s,
    decide,
    gone_since,
    retry_after_s,
)
from podium.protocol.names import (
    ERROR_GROUP_BROKEN,
    ERROR_QUEUE_FULL,
    ERROR_REFUSED,
    ERROR_REQUEST_FAILED,
    ERROR_UNAVAILABLE,
)
from podium.rendezvous import Generation, Status
from podium.rendezvous.records import EndpointRecord

OPTIONS = ClientOptions(poll_interval_s=0.2, max_backoff_s=60.0, max_retries_after_crash=2)
WHERE = "'math' (a1a1a1a1a1a1)"
AT = "generation 7:0 at http://n1:8000"


def low(a: float, b: float) -> float:
    """The jitter's smallest draw."""
    return a


def high(a: float, b: float) -> float:
    """The jitter's largest draw."""
    return b


def sent(**what: object) -> Exchange:
    """An exchange with generation 7:0 of the teacher ``WHERE`` at ``AT``."""
    return Exchange(WHERE, "7:0", AT, **what)


def answered(status: int, error: str = "", **what: object) -> Exchange:
    return sent(status=status, body=json.dumps({"error": error}).encode() if error else b"", **what)


def record(status: Status = Status.READY, generation: tuple[int, int] = (7, 0), reason: str | None = None
           ) -> EndpointRecord:
    """A replica's record, re-read: ``generation`` (job, restart) in ``status``."""
    return EndpointRecord(teacher_key="a1a1a1a1a1a1", teacher_name="math", status=status, reason=reason,
                          generation=Generation(*generation), host="n1", pid=1, started_at=0.0, heartbeat_at=0.0)


def messages(decision: Answer | BackOff | FailOver) -> list[tuple[int, str]]:
    return list(decision.logs)


# ---------------------------------------------------------------------------------------- an answer


def test_an_answer_is_returned() -> None:
    assert decide(answered(200), Tally(), OPTIONS) == Answer()
    assert decide(answered(200, served="7:0"), Tally(), OPTIONS) == Answer()


def test_an_answer_from_another_generation_is_returned_and_the_replica_forgotten() -> None:
    decision = decide(answered(200, served="7:1"), Tally(), OPTIONS)
    assert decision == Answer(forget=True, logs=((logging.INFO, f"teacher {WHERE}: answered by generation 7:1, "
                                                                "record said 7:0; re-reading the record"),))


# ---------------------------------------------------------------------------------------- refusals and failures


@pytest.mark.parametrize("status", [400, 404, 413, 422, 499])
def test_a_4xx_is_never_retried(status: int) -> None:
    decision = decide(answered(status, "token 500 outside the vocabulary", kind=ERROR_REFUSED), Tally(), OPTIONS)
    assert isinstance(decision, Fail) and type(decision.error) is TeacherRequestError
    assert str(decision.error) == (f"teacher {WHERE} (generation 7:0) refused the request: HTTP {status}: "
                                   "token 500 outside the vocabulary")
    # the generation gone since changes nothing for a refusal (and the rule does not ask)
    assert not asks_answerer(status, ERROR_REFUSED)
    gone = decide(answered(status, "bad", gone="the record now says generation 7:1 (ready)"), Tally(), OPTIONS)
    assert isinstance(gone, Fail) and type(gone.error) is TeacherRequestError


def test_a_request_failed_500_is_not_retried() -> None:
    decision = decide(answered(500, "CUDA out of memory", kind=ERROR_REQUEST_FAILED), Tally(), OPTIONS)
    assert isinstance(decision, Fail) and isinstance(decision.error, TeacherRequestFailedError)
    assert decision.error.status == 500 and decision.error.message == "CUDA out of memory"
    assert str(decision.error) == (f"teacher {WHERE} (generation 7:0) failed: HTTP 500: CUDA out of memory "
                                   "(this request is not sent again)")


@pytest.mark.parametrize("status", [500, 502, 504, 599])
def test_a_5xx_other_than_503_from_a_generation_still_there_is_a_server_error(status: int) -> None:
    assert asks_answerer(status, None) and asks_answerer(status, ERROR_REQUEST_FAILED)
    decision = decide(answered(status, "worker 3 died"), Tally(), OPTIONS)
    assert isinstance(decision, Fail) and type(decision.error) is TeacherServerError
    assert str(decision.error) == f"teacher {WHERE} (generation 7:0) failed: HTTP {status}: worker 3 died"


def test_a_3xx_is_a_server_error() -> None:
    decision = decide(answered(302), Tally(), OPTIONS)
    assert isinstance(decision, Fail) and type(decision.error) is TeacherServerError


@pytest.mark.parametrize("kind", [None, ERROR_REQUEST_FAILED])
def test_a_5xx_from_a_generation_gone_since_is_retried_as_a_crash(kind: str | None) -> None:
    gone = "the record now says generation 7:1 (ready)"
    decision = decide(answered(500, "worker 3 died", kind=kind, gone=gone), Tally(), OPTIONS)
    assert isinstance(decision, FailOver)
    assert decision.note == f"{AT}: HTTP 500 worker 3 died; {gone}"
    assert decision.tally == Tally(crashes=(f"{AT}: HTTP 500; {gone}",)) and decision.pause_s == 0.0
    assert messages(decision) == [
        (logging.WARNING, f"teacher {WHERE}: generation 7:0 died under this request ({AT}: HTTP 500; {gone}); "
                          "sending it again (1 of at most 2)"),
        (logging.WARNING, f"teacher {WHERE} generation 7:0 answered HTTP 500 and {gone}; retrying"),
    ]


def test_only_a_5xx_that_no_other_rule_takes_asks_for_the_record() -> None:
    assert asks_answerer(500, None)
    for status, kind in ((503, None), (503, ERROR_UNAVAILABLE), (500, ERROR_GROUP_BROKEN), (500, ERROR_QUEUE_FULL),
                         (200, None), (404, ERROR_REFUSED)):
        assert not asks_answerer(status, kind), (status, kind)


def test_what_says_the_generation_that_answered_is_gone() -> None:
    assert gone_since("7:0", record()) is None
    assert gone_since("7:0", record(Status.READY, (7, 1))) == "the record now says generation 7:1 (ready)"
    assert gone_since("7:0", record(Status.STARTING, (8, 0))) == \
        "the record now says generation 8:0 (starting)"
    assert gone_since("7:0", record(Status.DRAINING)) == "its record now says draining"
    assert gone_since("7:0", record(Status.FAILED, reason="node n2 lost")) == \
        "its record now says failed (node n2 lost)"


# ---------------------------------------------------------------------------------------- failing over


@pytest.mark.parametrize(("status", "kind"), [(503, ERROR_UNAVAILABLE), (503, None)])
def test_another_503_fails_over_without_a_crash(status: int, kind: str | None) -> None:
    decision = decide(answered(status, "teacher is draining", kind=kind), Tally(full_answers=1), OPTIONS)
    assert decision == FailOver(Tally(full_answers=1), f"{AT}: HTTP 503 teacher is draining",
                                ((logging.INFO, f"teacher {WHERE} generation 7:0 answered 503; another replica or "
                                                "a ready endpoint"),))


def test_a_503_with_retry_after_pauses_at_most_a_poll_interval_and_never_past_the_deadline() -> None:
    long = decide(answered(503, "not ready", kind=ERROR_UNAVAILABLE, retry_after_s=5.0), Tally(), OPTIONS)
    short = decide(answered(503, "not ready", kind=ERROR_UNAVAILABLE, retry_after_s=0.05), Tally(), OPTIONS)
    assert isinstance(long, FailOver) and isinstance(short, FailOver)
    assert long.pause_s == 0.2 and short.pause_s == 0.05
    assert long.pause(10.0) == 0.2 and long.pause(0.1) == 0.1  # no later than the deadline
    assert long.pause(0.0) == 0.0 and long.pause(-3.0) == 0.0  # the deadline has passed: no wait


@pytest.mark.parametrize("status", [503, 500])
def test_a_group_broken_answer_fails_over_as_a_crash(status: int) -> None:
    decision = decide(answered(status, "node n2 (rank 1) lost", kind=ERROR_GROUP_BROKEN, retry_after_s=1.0),
                      Tally(), OPTIONS)
    said = f"{AT}: HTTP {status} node n2 (rank 1) lost"
    assert isinstance(decision, FailOver)
    assert decision.note == said and decision.tally == Tally(crashes=(said,)) and decision.pause_s == 0.2
    assert [level for level, _ in decision.logs] == [logging.WARNING, logging.INFO]
    assert "sending it again (1 of at most 2)" in decision.logs[0][1]


def test_a_connection_error_fails_over_and_counts_a_crash_only_when_the_request_was_sent() -> None:
    refused = decide(sent(error="connection refused"), Tally(), OPTIONS)
    assert refused == FailOver(Tally(), f"{AT}: connection refused",
                               ((logging.WARNING, f"teacher {WHERE} generation 7:0: connection refused; "
                                                  "re-reading the records"),))
    dropped = decide(sent(error="connection reset", dropped=True), Tally(), OPTIONS)
    assert isinstance(dropped, FailOver) and dropped.note == f"{AT}: connection reset"
    assert dropped.tally == Tally(crashes=(f"{AT}: connection lost with the request sent",))
    assert messages(dropped)[-1] == (logging.WARNING, f"teacher {WHERE} generation 7:0: connection reset; "
                                                      "re-reading the records")


# ---------------------------------------------------------------------------------------- the crash limit


def test_the_death_past_max_retries_after_crash_ends_the_call() -> None:
    first, second = f"{AT}: connection lost with the request sent", "generation 7:1 at http://n1:8001: HTTP 503 lost"
    tally = Tally(crashes=(first, second), full_answers=3)
    decision = decide(sent(error="connection reset", dropped=True), tally, OPTIONS)
    assert isinstance(decision, Fail) and isinstance(decision.error, TeacherRequestFailedError)
    why = CRASHED.format(n=3, seen=f"{first}; {second}; {first}", limit=2)
    assert decision.error.status is None and decision.error.message == why
    assert "3 generations died under this request" in why and "max_retries_after_crash is 2" in why
    assert str(decision.error) == f"teacher {WHERE} (generation 7:0) failed: {why} (this request is not sent again)"
    # deaths that do not exhaust it, and answers that are no death, go on
    assert isinstance(decide(sent(error="timed out"), tally, OPTIONS), FailOver)
    assert isinstance(decide(answered(503, kind=ERROR_UNAVAILABLE), tally, OPTIONS), FailOver)
    assert isinstance(decide(sent(error="reset", dropped=True), Tally(crashes=(first,)), OPTIONS), FailOver)


def test_no_retry_after_a_crash_when_the_limit_is_zero() -> None:
    none = ClientOptions(max_retries_after_crash=0)
    decision = decide(answered(503, "broken", kind=ERROR_GROUP_BROKEN), Tally(), none)
    assert isinstance(decision, Fail) and isinstance(decision.error, TeacherRequestFailedError)
    assert "1 generations died under this request" in decision.error.message


# ---------------------------------------------------------------------------------------- a full queue


def test_a_full_queue_backs_the_replica_off_and_counts_the_full_answer() -> None:
    decision = decide(answered(503, "queue is full", kind=ERROR_QUEUE_FULL, retry_after_s=1.0),
                      Tally(crashes=("x",), full_answers=1), OPTIONS, uniform=low)
    assert decision == BackOff(2.0, Tally(crashes=("x",), full_answers=2), f"{AT}: HTTP 503 queue is full",
                               ((logging.INFO, f"teacher {WHERE} generation 7:0: queue full; none sent there for "
                                               "2.0s"),))


def test_the_backoff_doubles_with_each_full_answer_jittered_up_to_half_again() -> None:
    assert [backoff_s(1.0, n, OPTIONS, low) for n in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 8.0]
    assert [backoff_s(1.0, n, OPTIONS, high) for n in (1, 2, 3, 4)] == [1.5, 3.0, 6.0, 12.0]
    draws = [backoff_s(2.0, 3, OPTIONS, random.Random(seed).uniform) for seed in range(200)]
    assert all(8.0 <= d <= 12.0 for d in draws) and max(draws) - min(draws) > 2.0  # jittered, within the bounds


def test_the_backoff_starts_at_retry_after_but_no_sooner_than_a_poll_interval() -> None:
    assert backoff_s(3.0, 1, OPTIONS, low) == 3.0
    assert backoff_s(0.05, 1, OPTIONS, low) == 0.2 and backoff_s(0.0, 2, OPTIONS, low) == 0.4


def test_the_backoff_stops_at_max_backoff_s_unless_retry_after_says_more() -> None:
    assert backoff_s(1.0, 7, OPTIONS, low) == 60.0  # 64 s, cut
    assert backoff_s(50.0, 1, OPTIONS, high) == 60.0  # the jitter is cut too
    assert backoff_s(100.0, 1, OPTIONS, high) == 100.0  # the server's word is kept
    assert backoff_s(1.0, 1000, ClientOptions(poll_interval_s=1.0, max_backoff_s=1e9), low) == 2.0 ** 16


def test_a_full_queue_is_no_crash_and_no_failover() -> None:
    tally = Tally()
    for n in range(1, 6):  # many full answers: never the end of the call (only its deadline is)
        decision = decide(answered(503, "queue is full", kind=ERROR_QUEUE_FULL), tally, OPTIONS, uniform=low)
        assert isinstance(decision, BackOff) and decision.tally == Tally(full_answers=n)
        tally = decision.tally


def test_retry_after_is_read_as_seconds() -> None:
    assert retry_after_s("2") == 2.0 and retry_after_s("1.5") == 1.5
    assert retry_after_s(None) == retry_after_s("") == retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") == 0.0
    # a server's nonsense never makes the pause raise (NaN, negative) or shuts a replica out for good (inf)
    assert retry_after_s("nan") == retry_after_s("-3") == retry_after_s("inf") == retry_after_s("-inf") == 0.0


# ---------------------------------------------------------------------------------------- the deadline


def test_when_the_deadline_passes_the_call_is_unavailable_naming_what_ended_it() -> None:
    over = CallDeadline(WHERE, limit_s=1.0, ready_timeout_s=60.0, started=time.monotonic() - 1.5)
    over.generation = "7:0"
    over.note(f"{AT}: timed out")
    assert over.left() < 0
    error = over.unavailable()
    assert isinstance(error, TeacherUnavailableError) and isinstance(error, TimeoutError)
    assert error.limit == "call deadline 1s" and error.generation == "7:0" and error.waited_s >= 1.5
    assert re.fullmatch(rf"teacher {re.escape(WHERE)} unavailable after \d+\.\ds \(call deadline 1s\); last "
                        rf"generation 7:0; seen: {re.escape(AT)}: timed out", str(error)), str(error)
    # while the teacher cannot answer, the ready timeout runs too
    waiting = CallDeadline(WHERE, limit_s=600.0, ready_timeout_s=2.0, waiting_since=time.monotonic() - 3.0)
    assert waiting.left() < 0 and waiting.unavailable().limit == "not ready within ready_timeout_s 2s"
    waiting.usable()
    assert waiting.left() > 500
