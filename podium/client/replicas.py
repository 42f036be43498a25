"""A teacher's replicas as one client sees them: which can answer now, and which the next request goes to.

A teacher may be served by several replicas: independent allocations of the same model, each with
its own job, generation and endpoint record (``rendezvous.json`` lists their records). The teacher
is deterministic, so any replica gives the same answer and a request may go to any of them.

Owns :class:`ReplicaSet`: the records of a teacher's replicas, the endpoints among them that are
known to answer (ready, heartbeat not stale, and confirmed by a health probe on a connection where
the server proved it is the generation the record names: see :mod:`podium.client.transport`), and
the choice:

- **least expected wait** among the usable replicas (:func:`podium.client.routing.choose`: this
  client's requests in flight there at its measured time per answer; alike ones by fewest
  outstanding requests, ties taken in turn), so concurrent callers spread over the replicas by how
  busy and how fast each is; a **slow** one (:func:`podium.client.routing.is_slow`) is drained,
  but for a probe now and then, until it answers at the others' pace (:meth:`ReplicaSet.slow`
  lists them; drain and recovery are logged once each); where a request is sent again when its
  answer is late (:meth:`ReplicaSet.hedge_after`, :meth:`ReplicaSet.acquire_hedge`);
- a replica whose request failed (connection lost, 503 while it drains, a generation gone) is
  dropped from the usable ones (:meth:`ReplicaSet.forget`) and the request goes at once to another;
  when none is usable the call waits, re-reading every replica's record, until one is;
- a replica whose queue is full (503 + Retry-After) gets no request until its backoff has passed
  (:meth:`ReplicaSet.full`): requests go to the others, or wait for the first one to be due;
- replicas not in use are looked at again every ``ClientOptions.refresh_s``, in a thread of its
  own started by the call that finds it due (so a replica that hangs its probe delays no call; a
  failed probe backs off), so a replica that comes back after a preemption, or one newly listed,
  takes its share again;
- ``failed`` for good (:meth:`EndpointRecord.failure_is_final`) ends a call only when every replica is.

:class:`ReplicaConnection` is a replica known to answer, as a request reaches it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from podium.client.deadline import CallDeadline
from podium.client.errors import TeacherFailedError, TeacherStoppedError, TransportError
from podium.client.options import ClientOptions
from podium.client.routing import (
    Candidate,
    HedgeBudget,
    Latency,
    SlowReplica,
    censored,
    choose,
    hedge_after_s,
    judged,
    observed,
    typical_s,
)
from podium.client.transport import HTTPTransport, ServerIdentity
from podium.protocol.names import HEALTH_READY
from podium.rendezvous.atomic import FileReadError
from podium.rendezvous.records import EndpointRecord, Status, read_record

logger = logging.getLogger(__name__)

PROBE_BACKOFF_MAX_S = 60.0  # a replica whose ready record does not answer is probed at most this rarely


@dataclass(eq=False)
class Replica:
    """One replica's record, and how this client reaches it (None: not known to answer)."""

    path: Path
    connection: ReplicaConnection | None = None
    transport: HTTPTransport | None = None  # kept while the URL and the generation stay the same
    outstanding: int = 0  # requests of this client in flight there
    final: EndpointRecord | None = None  # its record says failed for good
    probe_after: float = 0.0  # monotonic: a background look probes it again no sooner
    probe_backoff_s: float = 0.0
    full_until: float = 0.0  # monotonic: its queue said full; no request goes there sooner
    latency: Latency = field(default_factory=Latency)  # its answers' time, as this client measured it
    slow: bool = False  # drained: only probes go there (podium.client.routing)
    slow_probe_at: float = 0.0  # monotonic: while slow, its next probe no sooner


@dataclass(frozen=True, eq=False)
class ReplicaConnection:
    """A replica known to answer, as this client reaches it: its record (the generation) and the
    transport to its endpoint (which holds the sockets, one per thread)."""

    replica: Replica
    record: EndpointRecord
    transport: HTTPTransport


class ReplicaSet:
    """The replicas of one teacher for one client (thread-safe; see the module doc)."""

    def __init__(self, label: str, paths: Sequence[str | Path], *, token: str | None, options: ClientOptions,
                 check_tokenizer: Callable[[str, EndpointRecord], None]) -> None:
        if not paths:
            raise ValueError(f"teacher {label}: no replica to call")
        self.label = label
        self.options = options
        self._token = token
        self._check_tokenizer = check_tokenizer
        self._lock = threading.Lock()  # the fields below; never held while reading or probing
        self._finding = threading.Lock()  # one thread at a time reads the records and probes
        self._replicas = [Replica(Path(p)) for p in paths]
        self._retired: list[Replica] = []  # no longer listed: their transports close with the client
        self._old_transports: list[HTTPTransport] = []  # to earlier generations: they close with the client
        self._turn = 0
        self._hedges = HedgeBudget(options.hedge_fraction)
        self._looked_at = 0.0  # monotonic time of the last look at the replicas not in use
        self._looking: threading.Thread | None = None  # the look in a thread of its own, if one runs
        self._closed = False
        self.last: ReplicaConnection | None = None  # where the last request went

    # ------------------------------------------------------------------ what it holds

    @property
    def paths(self) -> list[Path]:
        with self._lock:
            return [r.path for r in self._replicas]

    @property
    def multiple(self) -> bool:
        return len(self._replicas) > 1

    def where(self, record: EndpointRecord) -> str:
        """The teacher, and which of its replicas when it has several (for errors and logs)."""
        return f"{self.label} replica {record.replica}" if self.multiple else self.label

    def set_paths(self, paths: Sequence[str | Path]) -> None:
        """The replicas are now those whose records are ``paths`` (the rendezvous changed): new ones
        are looked at with the next call; requests in flight on a removed one finish there."""
        if not paths:
            raise ValueError(f"teacher {self.label}: no replica to call")
        with self._lock:
            current = {r.path: r for r in self._replicas}
            self._replicas = [current.pop(Path(p)) if Path(p) in current else Replica(Path(p)) for p in paths]
            self._retired.extend(current.values())
            self._looked_at = 0.0
        if current:
            logger.info("teacher %s: replicas %s are no longer listed", self.label, ", ".join(map(str, current)))

    # ------------------------------------------------------------------ choosing one

    def acquire(self, deadline: CallDeadline) -> ReplicaConnection:
        """Where to send a request (least expected wait among the usable replicas), waiting
        for one within the call's ``deadline``; :meth:`release` it after the exchange."""
        while True:
            if self._due():
                self._look_aside()
            picked, full_for = self._pick()
            if picked is not None:
                deadline.usable()
                return picked
            if full_for is not None:  # every usable replica said its queue is full: wait for the first due
                left = deadline.left()
                if left <= 0:
                    raise deadline.unavailable()
                time.sleep(min(full_for, left))
                continue
            # none answers now: one thread waits for one (the others wait for it, within their deadlines)
            if not self._finding.acquire(timeout=max(deadline.left(), 0.0)):
                deadline.note("another call of this client was waiting for the teacher")
                raise deadline.unavailable()
            try:
                if not self.any_usable():
                    self._wait(deadline)
            finally:
                self._finding.release()

    def _look_aside(self) -> None:
        """Look at the replicas not in use in a thread of its own (unless a look runs already)."""
        with self._lock:
            if self._closed or (self._looking is not None and self._looking.is_alive()):
                return
            self._looked_at = time.monotonic()
            self._looking = threading.Thread(target=self._look_in_background, name="podium-replicas", daemon=True)
            thread = self._looking
        thread.start()

    def _look_in_background(self) -> None:
        if not self._finding.acquire(blocking=False):
            return  # a call waits for a replica: it looks at them itself
        try:
            limit = self.options.connect_timeout_s  # the look's own deadline: it serves no call, its notes are dropped
            self._look(CallDeadline(self.label, limit, limit), background=True)
        except Exception as exc:  # a tokenizer mismatch, a failure: the call that goes there says it
            logger.warning("teacher %s: looking at its replicas: %s", self.label, exc)
        finally:
            self._finding.release()

    def release(self, connection: ReplicaConnection, *, answered_s: float | None = None,
                cancelled_s: float | None = None) -> None:
        """The request sent through ``connection`` is over: answered (2xx) after ``answered_s``,
        cancelled unanswered after ``cancelled_s`` (it lost a hedge), or neither (it failed)."""
        with self._lock:
            replica = connection.replica
            replica.outstanding -= 1
            if answered_s is not None:  # a drained replica gets probes only: each says how fast it is now
                replica.latency = observed(replica.latency, answered_s, fresh=replica.slow)
            elif cancelled_s is not None:
                replica.latency = censored(replica.latency, cancelled_s)
            else:
                return
            changed = self._judge()
        for level, text in changed:
            logger.log(level, text)

    def _judge(self) -> list[tuple[int, str]]:
        """Mark the usable replicas slow or not (:func:`~podium.client.routing.judged`, under the
        lock); what changed, to log."""
        usable = [r for r in self._replicas if r.connection is not None]
        logs = []
        for replica, slow in zip(usable, judged([r.latency.seconds for r in usable], self.options.slow_factor),
                                 strict=True):
            if slow != replica.slow and replica.connection is not None:
                replica.slow, replica.slow_probe_at = slow, time.monotonic() + self.options.slow_probe_s
                where, own, o = self.where(replica.connection.record), replica.latency.seconds, self.options
                logs.append((logging.WARNING, f"teacher {where} is slow: its answers take {own:.3g}s, over "
                             f"{o.slow_factor:g}x the other replicas' median; no new calls go there but a probe "
                             f"every {o.slow_probe_s:g}s") if slow else
                            (logging.INFO, f"teacher {where} answers in {own:.3g}s again: calls go there again"))
        return logs

    def slow(self) -> list[SlowReplica]:
        """The usable replicas drained for their slowness, with their measured latency."""
        with self._lock:
            usable = [(r.connection, r.latency.seconds, r.slow) for r in self._replicas if r.connection is not None]
        return [SlowReplica(c.record.replica, str(c.record.url), own,
                            typical_s([s for o, s, _ in usable if o is not c]))
                for c, own, slow in usable if slow and own is not None]

    def hedge_after(self, connection: ReplicaConnection) -> float | None:
        """Seconds after which a request sent through ``connection`` is sent again elsewhere when
        still unanswered (:func:`~podium.client.routing.hedge_after_s`; None: never)."""
        with self._lock:
            others = [r.latency.seconds for r in self._replicas
                      if r is not connection.replica and r.connection is not None and not r.slow]
            return hedge_after_s(connection.replica.latency.seconds, others, self.options)

    def acquire_hedge(self, connection: ReplicaConnection) -> ReplicaConnection | None:
        """Where the second copy of a request sent through ``connection`` goes: another usable
        replica, due and not slow, while the hedge budget lasts (None: nowhere; :meth:`release` it)."""
        now = time.monotonic()
        with self._lock:
            pool = [(i, r) for i, r in enumerate(self._replicas) if r is not connection.replica
                    and r.connection is not None and r.full_until <= now and not r.slow]
            if not pool or not self._hedges.take():
                return None
            return self._take(self._choose(pool))

    def forget(self, connection: ReplicaConnection) -> None:
        """The replica did not answer a request sent through ``connection``: no new request goes
        there until a look at its record finds it ready again."""
        with self._lock:
            if connection.replica.connection is connection:
                connection.replica.connection = None
                connection.replica.probe_after = 0.0

    def full(self, connection: ReplicaConnection, wait_s: float) -> None:
        """The replica's queue is full: no request goes there for ``wait_s`` (others go elsewhere)."""
        with self._lock:
            replica = connection.replica
            replica.full_until = max(replica.full_until, time.monotonic() + wait_s)

    def any_usable(self) -> bool:
        """A request sent now would go to a replica known to answer (none: it would wait)."""
        with self._lock:
            return any(r.connection is not None for r in self._replicas)

    def _pick(self) -> tuple[ReplicaConnection | None, float | None]:
        """Where to send a request, or (None, seconds until a full one is due; None: none usable)."""
        now = time.monotonic()
        with self._lock:
            usable = [(i, r) for i, r in enumerate(self._replicas) if r.connection is not None]
            if not usable:
                return None, None
            due = [(i, r) for i, r in usable if r.full_until <= now]
            if not due:
                return None, min(r.full_until for _, r in usable) - now
            replica = self._probe_due(due, now) or self._choose([(i, r) for i, r in due if not r.slow] or due)
            self._turn += 1
            self._hedges.earn()
            self.last = self._take(replica)
            return self.last, None

    @staticmethod
    def _take(replica: Replica) -> ReplicaConnection:
        replica.outstanding += 1
        assert replica.connection is not None
        return replica.connection

    def _probe_due(self, due: list[tuple[int, Replica]], now: float) -> Replica | None:
        """A drained replica whose probe is due, with none of this client's requests there, while
        another is not slow (under the lock)."""
        if all(r.slow for _, r in due):
            return None
        for _, replica in due:
            if replica.slow and replica.outstanding == 0 and now >= replica.slow_probe_at:
                replica.slow_probe_at = now + self.options.slow_probe_s
                return replica
        return None

    def _choose(self, pool: list[tuple[int, Replica]]) -> Replica:
        """The replica of ``pool`` ((place, replica)) with the least expected wait (under the lock)."""
        picked = choose([Candidate(i, r.outstanding, r.latency.seconds) for i, r in pool], self._turn,
                        len(self._replicas))
        return self._replicas[picked.index]

    def _due(self) -> bool:
        """Requests go to some replicas, others are not in use, and the last look at those is
        ``refresh_s`` old (with none in use a call waits, and looks itself)."""
        with self._lock:
            used = [r.connection is not None for r in self._replicas]
            return any(used) and not all(used) and time.monotonic() - self._looked_at >= self.options.refresh_s

    # ------------------------------------------------------------------ finding the usable ones

    def _wait(self, deadline: CallDeadline) -> None:
        """Look at every replica until one answers; :class:`TeacherFailedError` when every one has
        failed for good, ``deadline.unavailable()`` when the call's time is up."""
        interval = self.options.poll_interval_s
        while True:
            self._look(deadline, background=False)
            with self._lock:
                if any(r.connection is not None for r in self._replicas):
                    return
                finals = [r.final for r in self._replicas]
            if all(final is not None for final in finals):
                last = finals[-1]
                assert last is not None
                how = "failed" if all(f is not None and f.status is Status.FAILED for f in finals) else "ended"
                raise _ended(self.where(last), last, f" (every one of its {len(finals)} replicas {how} for good)"
                             if self.multiple else "")
            deadline.unusable()
            left = deadline.left()
            if left <= 0:
                raise deadline.unavailable()
            time.sleep(min(interval, left))
            interval = min(interval * 2, self.options.max_poll_interval_s)

    def _look(self, deadline: CallDeadline, *, background: bool) -> None:
        """Read the record of every replica not in use and probe the ready ones; ``background``:
        while requests go to other replicas (a probe that failed lately waits its backoff)."""
        with self._lock:
            replicas = [r for r in self._replicas if r.connection is None]
            self._looked_at = time.monotonic()
        for replica in replicas:
            if background and time.monotonic() < replica.probe_after:
                continue
            if not background and self.any_usable():
                with self._lock:
                    self._looked_at = 0.0  # the waiting call has one: the others are looked at aside, now
                return
            connection = self._examine(replica, deadline, background)
            if connection is not None:
                with self._lock:
                    closed = self._closed
                    if not closed:
                        earlier = replica.transport
                        if earlier is not None and earlier is not connection.transport:
                            self._old_transports.append(earlier)  # another generation's
                            replica.latency, replica.slow = Latency(), False  # a new process: measured afresh
                        replica.connection, replica.transport = connection, connection.transport
                        replica.probe_backoff_s, replica.probe_after = 0.0, 0.0
                if closed:
                    connection.transport.close()
                    return
                logger.info("teacher %s: using generation %s at %s", self.where(connection.record),
                            connection.record.generation, connection.record.url)

    def _examine(self, replica: Replica, deadline: CallDeadline, background: bool) -> ReplicaConnection | None:
        """How to reach the replica when its record says ready and it answers so; else None (what
        was seen is noted)."""
        now = time.time()
        prefix = f"replica {replica.path.parent.name}: " if self.multiple else ""
        try:
            record = read_record(replica.path)
        except FileReadError as exc:
            deadline.note(f"{prefix}record {exc.kind}: {exc.detail}")
            return None
        gen = str(record.generation)
        deadline.generation = gen
        stale = record.is_stale(self.options.stale_after_s, now)
        replica.final = record if record.failure_is_final() or record.stopped_for_good() else None
        if record.status is Status.STOPPED and replica.final is not None:
            deadline.note(f"{prefix}generation {gen} stopped for good ({record.reason or 'no reason given'})")
            if not self.multiple:
                raise _ended(self.label, record)
            return None
        if record.status is Status.FAILED:
            retry = "for good" if replica.final is not None else "the teacher will retry"
            deadline.note(f"{prefix}generation {gen} failed ({record.reason or 'no reason given'}); {retry}")
            if replica.final is not None and not self.multiple:
                raise TeacherFailedError(self.label, gen, record.reason)
            return None
        if record.status is not Status.READY or not record.url:
            reason = f" ({record.reason})" if record.reason else ""
            stale_note = f", stale: no heartbeat for {record.age(now):.0f}s" if stale else ""
            deadline.note(f"{prefix}generation {gen} {record.status.value}{reason}{stale_note}")
            return None
        if stale:
            deadline.note(f"{prefix}generation {gen} ready at {record.url} but stale: no heartbeat for "
                          f"{record.age(now):.0f}s; not used")
            return None
        identity = ServerIdentity(gen, record.teacher_key) if self._token else None
        known = replica.transport
        transport = known if known is not None and known.url == record.url and known.identity == identity \
            else self._transport(record.url, identity)
        # a ready endpoint answers its health at once: one that does not within the connect
        # timeout is not used (and a hung one holds no look for longer)
        problem = self._probe(record, transport, max(min(deadline.left(), self.options.connect_timeout_s), 0.0))
        if problem is not None:
            if transport is not replica.transport:
                transport.close()
            deadline.note(f"{prefix}generation {gen} ready at {record.url} but {problem}")
            with self._lock:
                replica.probe_backoff_s = min(max(2 * replica.probe_backoff_s, self.options.refresh_s),
                                              PROBE_BACKOFF_MAX_S)
                replica.probe_after = time.monotonic() + replica.probe_backoff_s
            return None
        self._check_tokenizer(self.where(record), record)
        return ReplicaConnection(replica, record, transport)

    def _transport(self, url: str, identity: ServerIdentity | None) -> HTTPTransport:
        o = self.options
        return HTTPTransport(url, self._token, connect_timeout_s=o.connect_timeout_s,
                             read_timeout_s=o.request_timeout_s, identity=identity,
                             keepalive=(o.keepalive_idle_s, o.keepalive_interval_s, o.keepalive_count))

    @staticmethod
    def _probe(record: EndpointRecord, transport: HTTPTransport, timeout_s: float) -> str | None:
        """None when the endpoint answers ready for the record's generation (and says which), else
        what was seen."""
        try:
            resp = transport.request("GET", HEALTH_READY, timeout_s=timeout_s)
        except TransportError as exc:
            return f"probe failed: {exc}"
        if resp.status != 200:
            return f"probe answered HTTP {resp.status}: {error_text(resp.body)}"
        try:
            served = json.loads(bytes(resp.body)).get("generation")
        except (ValueError, AttributeError):
            served = None
        if served is None:
            return f"probe at {record.url} names no generation, record says {record.generation}"
        if served != str(record.generation):
            return f"probe found generation {served} at {record.url}, record says {record.generation}"
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            replicas, self._retired = [*self._replicas, *self._retired], []
            old, self._old_transports = self._old_transports, []
            for replica in replicas:
                replica.connection = None
        for transport in old:
            transport.close()
        for replica in replicas:
            if replica.transport is not None:
                replica.transport.close()
                replica.transport = None


def error_text(body: bytes | bytearray | memoryview) -> str:
    """The ``error`` of a JSON error body, else its first 200 bytes."""
    try:
        return str(json.loads(bytes(body))["error"])
    except (ValueError, KeyError, TypeError):
        return bytes(body[:200]).decode("utf-8", errors="replace")


def _ended(teacher: str, record: EndpointRecord, every: str = "") -> TeacherFailedError:
    """The error for a replica (or every replica) whose record says it ended for good: stopped
    (:class:`TeacherStoppedError`, naming when) or failed (:class:`TeacherFailedError`)."""
    reason = f"{record.reason or 'no reason given'}{every}"
    if record.status is Status.STOPPED:
        return TeacherStoppedError(teacher, str(record.generation), reason, record.stopped_at())
    return TeacherFailedError(teacher, str(record.generation), reason)
