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

# `name{label="value",...} value [timestamp]`; a label value may hold escaped quotes and braces.
_SAMPLE = re.compile(r'(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?'
                     r"[ \t]+(?P<value>\S+)(?:[ \t]+-?\d+)?")


def totals(text: str) -> dict[str, float]:
    """Each sample name of a ``/metrics`` text with its value summed over its labels; a line that is
    no sample is a ``ValueError`` naming it."""
    values: dict[str, float] = collections.defaultdict(float)
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        if match is None:
            raise ValueError(f"not a Prometheus sample line: {line[:200]!r}")
        try:
            values[match["name"]] += float(match["value"])  # float() reads +Inf, -Inf and NaN too
        except ValueError:
            raise ValueError(f"not a number in Prometheus sample line: {line[:200]!r}") from None
    return dict(values)


def summary(text: str) -> dict[str, float]:
    """The key figures of one endpoint's ``/metrics`` text: tokens/s and answer bytes/s over the
    last minute, queue depth, padding share (padded share of the computed token positions),
    requests and errors."""
    values = totals(text)
    computed = values.get("podium_computed_tokens_total", 0.0)
    tokens = values.get("podium_call_tokens_sum", 0.0)  # real tokens of every batch
    return {
        "tokens_per_s_1m": values.get("podium_tokens_per_second_1m", 0.0),
        "bytes_out_per_s_1m": values.get("podium_response_bytes_per_second_1m", 0.0),
        "queue_depth": values.get("podium_queue_depth", 0.0),
        "padding_share": (1.0 - tokens / computed) if computed else 0.0,
        "requests": values.get("podium_requests_total", 0.0),
        "errors": values.get("podium_errors_total", 0.0),
    }
