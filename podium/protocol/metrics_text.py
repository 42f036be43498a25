"""Reading an endpoint's ``GET /metrics`` (Prometheus text format) without ``prometheus_client``.

The endpoint writes the text with ``prometheus_client`` (:mod:`podium.teacher.endpoint.metrics`, a
teacher's package); ``podium status`` and ``wait`` read it on a login node or in a trainer's light
install, where that package need not be. Only what they read is parsed: each sample line's name
and value (labels and timestamps skipped), comments ignored. :func:`summary` is what ``status``
shows per replica: tokens/s and answer bytes/s over the last minute, queue depth, padding share.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterator

# `name{label="value",...} value [timestamp]`; a label value may hold escaped quotes and braces.
_SAMPLE = re.compile(r'(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?'
                     r"[ \t]+(?P<value>\S+)(?:[ \t]+-?\d+)?")
_RANK_LABEL = re.compile(r'[{,]\s*rank="(?P<rank>\d+)"')

BATCH_SECONDS_RECENT = "podium_batch_seconds_recent"  # mean seconds of the latest batches
# What the group's watch publishes (podium.teacher.endpoint.metrics writes them, status reads them).
OLDEST_REQUEST = "podium_oldest_request_seconds"
CALL_SECONDS = "podium_call_seconds"
STUCK = "podium_stuck"
RANK_FORWARD_AGE = "podium_rank_last_forward_age_seconds"
RANK_CALL_SECONDS = "podium_rank_last_call_seconds"


def _samples(text: str) -> Iterator[tuple[str, str, float]]:
    """Each sample line's name, labels (``{...}`` or "") and value; a line that is no sample is a
    ``ValueError`` naming it."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise ValueError(f"not a Prometheus sample line: {line[:200]!r}")
        try:
            yield match["name"], match["labels"] or "", float(match["value"])  # float() reads +Inf and NaN too
        except ValueError:
            raise ValueError(f"not a number in Prometheus sample line: {line[:200]!r}") from None


def totals(text: str) -> dict[str, float]:
    """Each sample name of a ``/metrics`` text with its value summed over its labels; a line that is
    no sample is a ``ValueError`` naming it."""
    values: dict[str, float] = collections.defaultdict(float)
    for name, _, value in _samples(text):
        values[name] += value
    return dict(values)


def per_rank(text: str, name: str) -> dict[int, float]:
    """The samples of ``name`` by their ``rank`` label."""
    out = {}
    for sample, labels, value in _samples(text):
        found = _RANK_LABEL.search(labels) if sample == name else None
        if found is not None:
            out[int(found["rank"])] = value
    return out


def summary(text: str) -> dict[str, float]:
    """The key figures of one endpoint's ``/metrics`` text: tokens/s and answer bytes/s over the
    last minute, queue depth, padding share (padded share of the computed token positions),
    requests and errors, and what its group's watch knows (the oldest request's age, whether the
    watch found a call stuck, the slowest rank of the last call)."""
    values = totals(text)
    computed = values.get("podium_computed_tokens_total", 0.0)
    tokens = values.get("podium_call_tokens_sum", 0.0)  # real tokens of every batch
    took = per_rank(text, RANK_CALL_SECONDS)
    slowest = max(took, key=lambda rank: (took[rank], -rank)) if took else None
    return {
        "batch_s_recent": values.get(BATCH_SECONDS_RECENT, 0.0),
        "oldest_request_s": values.get(OLDEST_REQUEST, 0.0),
        "stuck": values.get(STUCK, 0.0),
        # the rank whose part of the last call took longest (-1: no call yet), and how long
        "slowest_rank": float(slowest) if slowest is not None else -1.0,
        "slowest_rank_s": took[slowest] if slowest is not None else 0.0,
        "tokens_per_s_1m": values.get("podium_tokens_per_second_1m", 0.0),
        "bytes_out_per_s_1m": values.get("podium_response_bytes_per_second_1m", 0.0),
        "queue_depth": values.get("podium_queue_depth", 0.0),
        "padding_share": (1.0 - tokens / computed) if computed else 0.0,
        "requests": values.get("podium_requests_total", 0.0),
        "errors": values.get("podium_errors_total", 0.0),
    }
