"""A teacher served as in production, for the endpoint and client tests: :class:`Teacher`.

It runs the real :class:`podium.launcher.job.lifecycle.TeacherLifecycle` on a group (a ``FakeGroup`` or
a real one) in a thread: ``starting`` (published here, as the node task does before the lifecycle
serves), the endpoint, ``ready``, the heartbeat. :meth:`Teacher.stop` asks for a stop the way
``podium down`` does and publishes ``stopped`` once the lifecycle drained; :meth:`Teacher.restart`
and :meth:`Teacher.successor` start the next generation on another port. A successor fences this
generation through its record, as in production, and this one then stops itself.

What a test does to a teacher that the lifecycle takes from no caller, the double allows:

- ``config_overrides``: more endpoint config fields (a body limit under 1 MiB, a Retry-After, a
  tokenizer fingerprint), put in while the lifecycle builds the endpoint's config;
- ``heartbeat.stop()`` silences the lifecycle's heartbeats (the record goes stale, or stays torn);
  ``writer.heartbeat()`` still writes one, and a test may start a heartbeat of its own;
- ``server.stop()``: the server goes away with no word in the record (a lost node).

Signal handlers are never installed (they need the main thread): stops are asked with
``Signals.request_stop``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from harness.poll import wait_for
from harness.run import TeacherDef
from podium.config.launcher import TeacherLauncherSettings
from podium.config.spec import TeacherSpec
from podium.launcher.common.files import TeacherFiles
from podium.launcher.job.lifecycle import TeacherLifecycle
from podium.launcher.job.signals import Signals
from podium.rendezvous import Generation, RecordWriter, RunLayout, Status
from podium.teacher.endpoint import ServerThread

PORT_RANGE = (23000, 23999)
HEARTBEAT_S = 0.5
START_S = 120.0  # a real group's first endpoint start on a loaded machine
STOP_S = 60.0  # the drain (up to Signals' drain_s) and the endpoint's stop

# While one double's lifecycle builds its endpoint config with overrides, no other builds one.
_CONFIG_LOCK = threading.Lock()


class _EndpointConfigOverrides:
    """``podium.teacher.endpoint.EndpointConfig`` with ``fields`` over what its caller passes, from
    :meth:`apply` to :meth:`undo` (the lifecycle imports it from there when it serves)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        import podium.teacher.endpoint as endpoint

        self._module, self._fields = endpoint, fields
        self._real: Any = None

    def apply(self) -> None:
        if not self._fields:
            return
        _CONFIG_LOCK.acquire()
        real = self._real = self._module.EndpointConfig

        def with_overrides(*args: Any, **kwargs: Any) -> Any:
            return real(*args, **{**kwargs, **self._fields})

        self._module.EndpointConfig = with_overrides

    def undo(self) -> None:
        if self._real is not None:
            self._module.EndpointConfig = self._real
            self._real = None
            _CONFIG_LOCK.release()


class _PausableBeats:
    """The lifecycle's record writer as its heartbeat sees it: ``stop()`` pauses the beats (what
    ``teacher.heartbeat.stop()`` does); everything else goes to the writer."""

    def __init__(self, writer: RecordWriter) -> None:
        self._writer = writer
        self._paused = threading.Event()

    def heartbeat(self) -> None:
        if not self._paused.is_set():
            self._writer.heartbeat()

    def stop(self, timeout: float | None = None) -> None:
        self._paused.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


@dataclass(eq=False)
class Teacher:
    """One generation of one replica of a teacher, served in-process by the real lifecycle."""

    group: Any
    layout: RunLayout
    definition: TeacherDef
    token: str
    generation: Generation = field(default_factory=lambda: Generation(1000, 0))
    port_range: tuple[int, int] = PORT_RANGE
    heartbeat_s: float = HEARTBEAT_S
    config_overrides: dict[str, Any] = field(default_factory=dict)  # more EndpointConfig fields
    replica: int = 0  # which replica of the teacher this is (its record: the replica's)
    server_settings: dict[str, Any] = field(default_factory=dict)  # podium.server settings besides the above
    lifecycle: TeacherLifecycle | None = None
    server: ServerThread | None = None  # the lifecycle's endpoint, once ready
    writer: RecordWriter | None = None  # the lifecycle's record writer
    heartbeat: Any = None  # its heartbeat: stop() silences it (a test may put a Heartbeat of its own here)

    def __post_init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._up = threading.Event()  # set once ready, or when serving ended before
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def spec(self) -> TeacherSpec:
        """What the launcher would hand this generation's lifecycle."""
        d = self.definition
        server = {"port_range": self.port_range, "heartbeat_s": self.heartbeat_s, **self.server_settings}
        model = self.group.facts.checkpoint_path or d.model_name or d.name
        return TeacherSpec(key=d.key, name=d.name, aliases=d.aliases, model_name=str(model), num_nodes=1,
                           gpus_per_node=1, replica=self.replica,
                           launcher=TeacherLauncherSettings.model_validate({"server": server}))

    def start(self) -> Teacher:
        """Publish ``starting`` and serve; returns once the record says ``ready``."""
        d = self.definition
        files = TeacherFiles(self.layout.teacher_dir(d.name, d.key, self.replica))
        lifecycle = self.lifecycle = TeacherLifecycle(self.spec(), files, self.generation, Signals())
        self.writer = lifecycle.writer
        lifecycle.writer = self.heartbeat = _PausableBeats(lifecycle.writer)  # type: ignore[assignment]
        lifecycle.publish(Status.STARTING)
        overrides = _EndpointConfigOverrides(self.config_overrides)

        def on_ready(url: str) -> None:
            overrides.undo()
            self.server = lifecycle._server  # set by serve() before it starts the endpoint
            self._up.set()

        def serve() -> None:
            overrides.apply()
            try:
                lifecycle.serve(self.group, host="127.0.0.1", token=self.token, on_ready=on_ready)
            except BaseException as exc:  # raised by start() or stop()
                self._error = exc
            finally:
                overrides.undo()
                self._up.set()

        self._thread = threading.Thread(target=serve, name=f"teacher-{d.name}-{self.generation}", daemon=True)
        self._thread.start()
        wait_for(self._up.is_set, f"{d.name} generation {self.generation} ready", timeout_s=START_S)
        if self.server is None:
            raise RuntimeError(f"{d.name} generation {self.generation} ended before it was ready") from self._error
        return self

    def stop(self) -> None:
        """Stop as ``podium down`` asks (drain, then ``stopped``). A serving error is raised unless
        the test had stopped the server itself (the lifecycle then finds nothing to drain)."""
        if self.lifecycle is None or self._thread is None:
            return
        stopped_by_test = self.server is not None and self.server._loop is None  # ServerThread.stop() ran
        self.lifecycle.signals.request_stop("the test stops this teacher")
        self._thread.join(STOP_S)
        assert not self._thread.is_alive(), f"{self.definition.name} generation {self.generation} did not stop"
        if self.heartbeat is not None:
            self.heartbeat.stop()  # a test's own Heartbeat, if it put one here
        self.lifecycle.publish(Status.STOPPED)
        if self._error is not None and not stopped_by_test:
            raise self._error

    def successor(self, group: Any = None) -> Teacher:
        """The next generation (``group``, default this one's) started on another port while this
        one still serves; its record replaces this one's, which fences this one."""
        old_port = self.server.port if self.server is not None else PORT_RANGE[0]
        return self._next(group if group is not None else self.group, (old_port + 1, PORT_RANGE[1])).start()

    def restart(self, *, port_range: tuple[int, int] | None = None, gap_s: float = 0.0) -> Teacher:
        """Stop, then come back under the next generation (other port unless ``port_range`` says)."""
        old_port = self.server.port if self.server is not None else None
        self.stop()
        if gap_s:
            time.sleep(gap_s)
        ports = port_range or ((old_port + 1, PORT_RANGE[1]) if old_port else self.port_range)
        return self._next(self.group, ports).start()

    def adopt(self, other: Teacher) -> None:
        """Become ``other`` (a later generation of this teacher), for whoever holds this object."""
        vars(self).update(vars(other))

    def _next(self, group: Any, port_range: tuple[int, int]) -> Teacher:
        g = self.generation
        return Teacher(group, self.layout, self.definition, self.token, Generation(g.job_id, g.restart + 1),
                       port_range, self.heartbeat_s, dict(self.config_overrides), self.replica,
                       dict(self.server_settings))
