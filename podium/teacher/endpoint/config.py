"""What an endpoint is handed beside its group (:class:`~podium.teacher.seam.ServedGroup`): its :class:`EndpointConfig`.

The tunables a recipe sets (port range, limits, deadlines, queue size, batching) are the
recipe's ``podium.server`` section itself, :class:`~podium.config.launcher.ServerSettings`, which
owns their defaults; :class:`EndpointConfig` adds who the endpoint is (names, token, generation,
the model facts it publishes) and the few knobs no recipe sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from podium.config.launcher import ServerSettings
from podium.rendezvous.records import Generation

MIB = 1024 * 1024


@dataclass(frozen=True)
class EndpointConfig:
    """How one endpoint serves: names, token, address, limits. ``token`` is never logged."""

    served_name: str
    token: str = field(repr=False)
    server: ServerSettings = field(default_factory=ServerSettings)  # port range, body limit, queue, batching
    teacher_key: str = ""
    aliases: tuple[str, ...] = ()
    generation: Generation | None = None
    host: str = "127.0.0.1"
    advertise_host: str | None = None  # host in the published URL (default: host, or the FQDN for 0.0.0.0)
    retry_after_s: int = 5  # the Retry-After of a 503
    batch_tokens: int | None = None  # tokens of one batch through the group; default: the group's budget × DP × 2
    max_body_bytes: int | None = None  # a body limit in bytes (under 1 MiB: tests); default: server.max_body_mb
    model_name: str | None = None
    tokenizer_fingerprint: str | None = None
    tokenizer_vocab_size: int | None = None
    model_version: str = "1"

    def __post_init__(self) -> None:
        if not self.token:
            raise ValueError("endpoint: an auth token is required")

    @property
    def body_limit(self) -> int:
        """The largest request body, in bytes."""
        return self.max_body_bytes or self.server.max_body_mb * MIB

    @property
    def json_body_limit(self) -> int:
        """The largest JSON request body, in bytes (never above :attr:`body_limit`)."""
        return min(self.body_limit, self.server.max_json_body_mb * MIB)

    def max_top_k(self, vocab_size: int) -> int:
        """The largest ``top_k`` a request may ask for."""
        return min(self.server.max_top_k, vocab_size)
