"""A teacher generation's life as its endpoint record tells it; the record's one publisher.

Only the head node's task has a :class:`TeacherLifecycle`. It publishes every status the
generation passes through, keeps the heartbeat, watches the stop signals while serving and drains
the endpoint before it says ``stopped``::

    starting -> loading -> ready -> draining -> stopped (why; whether the job requeues)
          \\________________\\________\\__________-> failed (the error, the node at fault, and
                                                    the restart decision: retried or final)

The endpoint (:mod:`podium.teacher.endpoint`) only serves and reports (its URL, model metadata,
queue); readiness is set here, right before ``ready`` is published, so a trainer that reads
``ready`` finds the endpoint answering. Each status's first time goes into the record's
``extra.timings`` (what ``podium status`` and the benchmarks show), and a drain or stop says why
(the signal, and whether the job requeues) in ``reason``.

With ``server.idle_stop_s`` the serving loop stops the teacher once nobody has called it for that
long (:class:`IdleWatch`: no answer given and nothing queued), so a forgotten teacher on a shared
cluster gives its nodes back; the job then ends (``stopped``, no requeue).

Being fenced by a newer generation's record stops this generation (it is stale). A failure to
write ``draining`` or ``stopped`` (a full disk, a stale NFS handle) is logged, never allowed to skip
the drain: the requests in flight matter more than the record, which the next generation replaces.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from podium.config.spec import TeacherSpec
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.stop_request import stop_requested
from podium.launcher.job.signals import Signals
from podium.rendezvous.records import Generation, Heartbeat, RecordWriter, RestartInfo, StaleGenerationError, Status

if TYPE_CHECKING:  # pragma: no cover
    from podium.launcher.common.restarts import Decision, RestartLedger
    from podium.teacher.seam import ServedGroup

logger = logging.getLogger(__name__)

STOP_FILE_POLL_S = 0.5


class IdleWatch:
    """How long the endpoint has gone uncalled: the clock restarts whenever it has answered a
    request since the last look, or has requests queued or computing."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last = clock()
        self._served: int | None = None

    def idle_for(self, served: int, queued: int) -> float:
        now = self._clock()
        if queued or served != self._served:
            self._served, self._last = served, now
        return now - self._last


class TeacherLifecycle:
    """The endpoint record of one generation of one teacher, and the serving loop."""

    def __init__(self, spec: TeacherSpec, files: TeacherFiles, generation: Generation, signals: Signals) -> None:
        self.spec, self.files, self.generation, self.signals = spec, files, generation, signals
        self.timings: dict[str, float] = {"task_start": time.time()}
        self.fault: tuple[str, str | None] | None = None  # (reason, node) the watchdog found
        self._server: Any = None
        self.writer = RecordWriter(files.endpoint, teacher_key=spec.key, teacher_name=spec.name,
                                   generation=generation, aliases=spec.aliases, replica=spec.replica,
                                   stale_after_s=spec.launcher.server.stale_after_s)

    @property
    def fenced(self) -> bool:
        return self.writer.fenced

    def stamp(self, event: str) -> None:
        """Record the first time of ``event`` (published with the next status)."""
        self.timings.setdefault(event, time.time())

    def publish(self, status: Status, *, reason: str | None = None, best_effort: bool = False,
                **fields: Any) -> bool:
        """Write ``status``; False when this generation is fenced (it then stops) or, with
        ``best_effort``, when the write failed (logged)."""
        if self.writer.fenced:
            return False
        self.stamp(status.value)
        if status in (Status.DRAINING, Status.STOPPED) and reason is None and self.signals.stop.is_set():
            reason = self.signals.describe()
            if self.signals.first is not None:
                self.timings.setdefault("stop_signal", self.signals.first[1])
        try:
            self.writer.publish(status, reason=reason, timings=dict(self.timings), **fields)
        except StaleGenerationError as exc:
            logger.error("%s", exc)
            self.signals.request_stop(f"fenced: {exc}", kind="cancel")
            return False
        except OSError as exc:
            if not best_effort:
                raise
            logger.error("could not publish %s to %s: %s", status.value, self.writer.path, exc)
            return False
        return True

    def fault_found(self, reason: str, node: str | None) -> None:
        """The watchdog found the generation broken: readiness off at once (new requests get 503
        and retry elsewhere), then a stop with no drain; :meth:`end` publishes ``failed``."""
        if self.fault is not None:
            return
        self.fault = (reason, node)
        self.stamp("fault")
        if self._server is not None:
            self._server.set_ready(False, reason)
        self.signals.request_stop(reason, kind="fault", requeue=True)

    def end(self, outcome: str, reason: str, decision: Decision, ledger: RestartLedger, *,
            comes_back: bool | None = None) -> None:
        """Publish how the generation ended: ``failed`` (with the restart decision, so a reader
        knows whether it comes back) or ``stopped`` (with why, and whether it requeues).
        ``comes_back`` (default: the decision's requeue) is what ``will_retry`` says: a job the
        scheduler requeues itself comes back though this generation does not ask for it."""
        restart = RestartInfo(**decision.to_json(), consecutive_failures=ledger.consecutive_failures,
                              requeues=ledger.requeues,
                              max_consecutive_failures=self.spec.launcher.restart.max_consecutive_failures)
        fields = {"final": decision.final, "will_retry": decision.requeue if comes_back is None else comes_back,
                  "restart": restart}
        if outcome == "failed":
            text = f"{reason} ({decision.why})"
            self.publish(Status.FAILED, reason=text[:2000], best_effort=True, **fields)
        else:
            text = reason if not decision.requeue or "requeu" in reason else f"{reason}; requeueing"
            self.publish(Status.STOPPED, reason=text, best_effort=True, **fields)

    def serve(self, group: ServedGroup, *, host: str, token: str,
              on_ready: Callable[[str], None] | None = None) -> None:
        """Serve ``group`` until a stop: endpoint up, ``ready``, heartbeat; then ``draining`` and the
        drain the stop allows (none for a fault or a cancel). :meth:`end` says how it ended."""
        from podium.protocol.tokenizer import fingerprint_from_pretrained
        from podium.teacher.endpoint import EndpointConfig, ServerThread

        server_cfg = self.spec.launcher.server
        fingerprint, tokenizer_size = _fingerprint(fingerprint_from_pretrained, group.facts.checkpoint_path)
        config = EndpointConfig(served_name=self.spec.name, token=token, server=server_cfg, teacher_key=self.spec.key,
                                aliases=self.spec.aliases, generation=self.generation, host=host,
                                model_name=self.spec.model_name, tokenizer_fingerprint=fingerprint,
                                tokenizer_vocab_size=tokenizer_size)
        server = ServerThread(group, config)
        self._server = server
        heartbeat: Heartbeat | None = None
        try:
            url = server.start()
            server.set_ready(True)
            if not self.publish(Status.READY, url=url, model=server.server.model_info()):
                return
            def fenced(exc: Exception) -> None:
                self.signals.request_stop(f"fenced: {exc}", kind="cancel")

            heartbeat = Heartbeat(self.writer, server_cfg.heartbeat_s, on_fenced=fenced).start()
            if on_ready is not None:
                on_ready(url)
            idle = IdleWatch()
            while not self.signals.stop.wait(STOP_FILE_POLL_S):
                self._check_stop_file()
                self._check_idle(idle, server.server)
            intent = self.signals.intent()
            drain_s = 0.0 if intent is None or intent.urgent else intent.drain_s()
            logger.warning("generation %s: %s: draining (up to %.0fs for queued requests)",
                           self.generation, self.signals.describe(), drain_s)
            server.set_ready(False, self.fault[0] if self.fault else "draining")
            server.drain()
            if self.fault is None:  # a fault is published as failed by end(), at once
                self.publish(Status.DRAINING, best_effort=True)
            server.stop(grace_s=drain_s)
        except BaseException:
            server.stop(grace_s=0)
            raise
        finally:
            if heartbeat is not None:
                heartbeat.stop()

    def _check_idle(self, idle: IdleWatch, endpoint: Any) -> None:
        """Stop once nobody has called for ``server.idle_stop_s`` (when set)."""
        limit = self.spec.launcher.server.idle_stop_s
        if limit is not None and idle.idle_for(endpoint.served, endpoint.queue_depth) >= limit:
            logger.warning("no call for %.0fs: stopping (server.idle_stop_s)", limit)
            self.signals.request_stop(f"idle: no call for {limit:g}s (server.idle_stop_s)", kind="idle")

    def _check_stop_file(self) -> None:
        """``podium down`` asks this job to stop through the stop file (only this job: a request
        left for an older job does not stop a later one)."""
        if stop_requested(self.files, self.generation.job_id) is not None:
            logger.warning("stop requested by %s", self.files.stop_request)
            self.signals.request_stop(f"stop requested by {self.files.stop_request.name} (podium down)")


def _fingerprint(compute: Callable[[str], tuple], path: str | None) -> tuple[str | None, int | None]:
    if not path:
        return None, None
    try:
        return compute(str(path))
    except Exception as exc:  # no tokenizer next to the checkpoint: the field stays empty
        logger.info("no tokenizer fingerprint for %s: %s", path, exc)
        return None, None
