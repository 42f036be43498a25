"""``podium front RUN [--listen HOST:PORT] [--exec -- CMD ...]``: a front for as long as it is asked.

Owns :func:`run_front`: the front starts (:class:`~podium.front.serve.Front`), prints each alias's
base URL once it listens, then serves until SIGTERM or SIGINT; with a command (``--exec``), runs it
with ``PODIUM_FRONT_URL`` and ``PODIUM_FRONT_URL_<ALIAS>`` in its environment, stops when it exits
and returns its exit code (a signal to the front is passed on to the command, which gets
:data:`GRACE_S` to end before it is killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

from podium.front.paths import ENV_URL, env_name
from podium.front.serve import LOOPBACK_NOTE, Front, FrontError

GRACE_S = 10.0  # a command the front was asked to stop gets this long to end
EXIT_SIGNAL_BASE = 128  # a command ended by signal N exits 128 + N, as a shell says


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as (host, port); :class:`FrontError` otherwise."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise FrontError(f"--listen {listen!r}: give HOST:PORT (port 0: a free one), e.g. 127.0.0.1:8800")
    return host.strip("[]"), int(port)


def front_env(front: Front) -> dict[str, str]:
    """What ``--exec`` adds to its command's environment."""
    return {ENV_URL: front.url, **{env_name(alias): url for alias, url in front.aliases.items()}}


def run_front(run: str, listen: str, *, auth: bool, call_timeout_s: float | None, command: Sequence[str],
              echo: Callable[[str], Any]) -> int:
    """Serve (see the module doc); returns the exit code. :class:`FrontError` when it cannot serve."""
    host, port = parse_listen(listen)
    return asyncio.run(_serve(Front(run, host=host, port=port, auth=auth, call_timeout_s=call_timeout_s),
                              list(command), echo))


async def _serve(front: Front, command: list[str], echo: Callable[[str], Any]) -> int:
    await front.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        for alias, url in front.aliases.items():
            echo(f"podium front: {alias}: {url}")
        if not front.auth:
            echo(f"podium front: {LOOPBACK_NOTE}")
        else:
            echo(f"podium front: token: {front.layout.auth_token_path} "
                 f"(a bearer header, the Basic password, or <url>/token/<token>)")
        if not command:
            await stop.wait()
            return 0
        return await _run_command(command, {**os.environ, **front_env(front)}, stop)
    finally:
        await front.stop()


async def _run_command(command: list[str], env: dict[str, str], stop: asyncio.Event) -> int:
    try:
        proc = await asyncio.create_subprocess_exec(*command, env=env)
    except OSError as exc:
        raise FrontError(f"--exec {command[0]!r}: {exc.strerror or exc}") from None
    ended = asyncio.ensure_future(proc.wait())
    asked = asyncio.ensure_future(stop.wait())
    await asyncio.wait({ended, asked}, return_when=asyncio.FIRST_COMPLETED)
    if not ended.done():
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(ended), GRACE_S)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await ended
    asked.cancel()
    code = proc.returncode
    assert code is not None
    return EXIT_SIGNAL_BASE - code if code < 0 else code


def run_checked(run: str, listen: str, auth: bool, call_timeout_s: float | None, exec_: bool, command: list[str],
                fail: Callable[[str], Any], echo: Callable[[str], Any]) -> int:
    """``podium front``'s arguments checked, then :func:`run_front` (its stdout the URLs); ``fail``
    says what is wrong and exits."""
    if exec_ != bool(command):
        fail("--exec needs a command after `--` (podium front RUN --exec -- python train.py)" if exec_ else
             f"unexpected arguments {command}; a command goes after --exec --")
    try:
        return run_front(run, listen, auth=auth, call_timeout_s=call_timeout_s, command=command, echo=echo)
    except FrontError as exc:
        fail(str(exc))
        return 2
