"""``podium.protocol.metrics_text``: a ``/metrics`` text read without prometheus_client (what
``podium status`` and ``wait`` do in a trainer's light install) gives the totals prometheus_client's
own parser gives, on a real registry's text, labels with quotes and braces included."""

from __future__ import annotations

import collections

import pytest
from prometheus_client.parser import text_string_to_metric_families

from podium.protocol.metrics_text import summary, totals
from podium.teacher.endpoint.metrics import EndpointMetrics


def test_totals_are_what_prometheus_client_parses() -> None:
    metrics = EndpointMetrics('odd "name" {x}', queue_depth=lambda: 3, queued_rows=lambda: 7)
    metrics.set_generation("4216489", 2)
    for status in (200, 200, 503):
        metrics.answered(status)
    metrics.served(rows=2, tokens=90)
    metrics.sent(1234)
    metrics.batch(seconds=0.1, tokens=90, computed_tokens=100, microbatches=2, waits=[0.01, 2.0])
    metrics.failed("group")
    text = metrics.render().decode()
    expected: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            expected[sample.name] += sample.value
    assert totals(text) == pytest.approx(dict(expected))
    figures = summary(text)
    assert figures["requests"] == 3 and figures["errors"] == 1 and figures["queue_depth"] == 3
    assert figures["padding_share"] == pytest.approx(0.1)


def test_a_line_that_is_no_sample_is_named() -> None:
    assert totals("# HELP x y\n# TYPE x counter\nx_total 2\nx_total{a=\"b\"} 3 1700000000000\n\n") == {"x_total": 5.0}
    assert totals("up +Inf\n")["up"] == float("inf")
    with pytest.raises(ValueError, match="not a Prometheus sample line: '<html>'"):
        totals("<html>\n")
    with pytest.raises(ValueError, match="not a number in Prometheus sample line"):
        totals("x_total many\n")
