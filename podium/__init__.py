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

    from podium.client import ClientOptions, PodiumClient

__all__ = ["__version__", "connect"]


def connect(
    path: str | PathLike[str],
    *,
    token: str | None = None,
    options: ClientOptions | None = None,
    tokenizer: Any = None,
    **option_overrides: Any,
) -> PodiumClient:
    """Connect a trainer to a run: ``podium.connect("<run_dir>/rendezvous.json")`` (or the run dir).

    ``token``: the run's bearer token (default: read ``<run_dir>/auth_token``). ``tokenizer``: a HF
    tokenizer every teacher is checked against when first reached. ``options``: a
    ``podium.client.ClientOptions``, and ``option_overrides`` any of its fields by name
    (``call_timeout_s=60``); ``podium.client.PodiumClient`` lists them, and any other keyword raises
    :class:`TypeError`. Returns a ``PodiumClient``, imported on first call so ``import podium`` stays
    light.
    """
    from podium.client import connect as _connect

    return _connect(path, token=token, options=options, tokenizer=tokenizer, **option_overrides)
