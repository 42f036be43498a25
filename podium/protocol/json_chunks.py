"""JSON text of a protocol header whose tensors hold millions of values, written a chunk at a time.

One ``json.dumps`` of millions of floats is one C call that holds the GIL for seconds: the
endpoint encodes answers on a thread, but its event loop's thread could not run meanwhile and
health probes went unanswered. :func:`dumps_chunked` writes each tensor's values
``JSON_CHUNK_VALUES`` at a time (other threads run between chunks); its text is exactly
``json.dumps(header, separators=(",", ":"))`` with the arrays as lists.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

JSON_CHUNK_VALUES = 1 << 16  # values written as JSON in one call (about 0.1 s for floats)


def dumps_chunked(header: dict[str, Any]) -> bytes:
    """``header`` as compact JSON, its tensors' ``data`` (numpy arrays) written a chunk at a time:
    one ``json.dumps`` of millions of floats holds the GIL for seconds, stalling the event loop's
    thread; between chunks other threads run."""
    arrays: list[np.ndarray] = []

    def placeholder(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            arrays.append(value)
            return f"\0podium-data-{len(arrays) - 1}\0"
        if isinstance(value, dict):
            return {k: placeholder(v) for k, v in value.items()}
        if isinstance(value, list):
            return [placeholder(v) for v in value]
        return value

    text = json.dumps(placeholder(header), separators=(",", ":"))
    for i, array in enumerate(arrays):
        parts = [json.dumps(array[at:at + JSON_CHUNK_VALUES].tolist(), separators=(",", ":"))[1:-1]
                 for at in range(0, array.size, JSON_CHUNK_VALUES)]
        text = text.replace(json.dumps(f"\0podium-data-{i}\0"), "[" + ",".join(parts) + "]", 1)
    return text.encode("utf-8")
