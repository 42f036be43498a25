"""podium: launch distillation teachers on Slurm, once, and let every trainer find them.

Importing ``podium`` is cheap: it must not pull torch, ray or megatron, so that login-node
commands (``podium --help``, ``plan``, ``status``, ``down``) answer at once. Heavy parts are
imported lazily by the modules that need them. A trainer needs only the base install
(podium without extras: client, protocol, rendezvous, ``podium.nemo_rl``); teachers and the
launcher need the ``teacher`` and ``launcher`` extras (pyproject.toml).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from podium.version import __version__

if TYPE_CHECKING:
    from os import PathLike

    from podium.client import PodiumClient

__all__ = ["__version__", "connect"]


def connect(path: str | PathLike[str], **kwargs: Any) -> PodiumClient:
    """Connect a trainer to a run: ``podium.connect("<run_dir>/rendezvous.json")``.

    Returns a ``podium.client.PodiumClient``; imported on first call so ``import podium`` stays light.
    """
    from podium.client import connect as _connect

    return _connect(path, **kwargs)
