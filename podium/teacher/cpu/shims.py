"""The machinery of podium's CPU shims: named stand-ins, each applied at most once per process and
only where what it stands in for is missing.

This module owns :class:`Shim` (a name, what it patches, and when it is needed) and
:class:`ShimSet` (an ordered set of them: apply the needed ones once, leave out the ones a test
skips, report which are active), and the checks the conditions share (``cuda_available``,
``module_missing``). The shims themselves live with what they stand in for: ``cuda_shims`` (every
model) and ``mamba_shims`` (the hybrid model).

Every shim is named so that a test can run megatron's code path with all shims but one and expect it
to fail: a megatron-core upgrade that no longer needs a shim, or needs a new one, then fails that test
instead of hiding.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def module_missing(module: str) -> bool:
    """Whether ``module`` cannot be imported here (a module set to None in ``sys.modules``, as the
    shim tests hide TransformerEngine, counts as missing)."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def mark(stand_in: _T) -> _T:
    """Mark a function, class or module put in megatron's place as podium's (``__podium_shim__``), so
    that whoever meets it in a traceback or a debugger knows where it comes from."""
    obj: Any = stand_in
    obj.__podium_shim__ = True
    return stand_in


@dataclass(frozen=True)
class Shim:
    """One named stand-in: ``apply`` patches megatron (or torch), ``needed`` says whether what it
    stands in for is missing in this process."""

    name: str
    apply: Callable[[], None]
    needed: Callable[[], bool]


class ShimSet:
    """An ordered set of shims of one kind (``"CUDA"``, ``"Mamba"``), applied at most once per process."""

    def __init__(self, kind: str, shims: Sequence[Shim]) -> None:
        self.kind = kind
        self._shims = {shim.name: shim for shim in shims}
        self.names: tuple[str, ...] = tuple(self._shims)
        self._applied: set[str] = set()
        self._skipped: set[str] = set()  # left out for the rest of the process (the test that proves each is needed)
        self._lock = threading.Lock()

    def apply(self, skip: Iterable[str] = ()) -> tuple[str, ...]:
        """Apply every needed shim not yet applied, in order; return the names active.

        ``skip`` (for the test that proves each shim is needed) leaves those out for the rest of the
        process, later calls included; an unknown name is a ``ValueError``.
        """
        skip = set(skip)
        unknown = skip - set(self.names)
        if unknown:
            raise ValueError(f"unknown {self.kind} shim(s) {sorted(unknown)}; known: {list(self.names)}")
        needed = [shim for shim in self._shims.values() if shim.needed()]  # all asked before any applies
        with self._lock:
            self._skipped.update(skip)
            for shim in needed:
                if shim.name in self._skipped or shim.name in self._applied:
                    continue
                shim.apply()
                self._applied.add(shim.name)
                logger.debug("applied %s CPU shim %s", self.kind, shim.name)
            return self.applied()

    def applied(self) -> tuple[str, ...]:
        """Names of the shims active in this process, in order."""
        return tuple(name for name in self.names if name in self._applied)
