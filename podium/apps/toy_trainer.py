"""A toy trainer step for ``sbatch/trainer.sbatch``: call every alias of ``$PODIUM_RENDEZVOUS`` once.

Stands in for a NeMo RL training step: random token batches, one ``get_logprobs`` per alias
through ``podium.connect``, the mean logprob per alias printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    import numpy as np

    from podium.client import connect

    path = os.environ.get("PODIUM_RENDEZVOUS")
    if not path:
        sys.stderr.write("toy_trainer: PODIUM_RENDEZVOUS is not set\n")
        return 2
    rng = np.random.default_rng(0)
    out = {}
    with connect(path) as client:
        for alias in sorted(client.rendezvous.routing):
            ids = rng.integers(1, 64, size=(2, 8)).astype(np.int64)
            lengths = np.array([8, 5], dtype=np.int64)
            result = client.get_logprobs(alias, {"input_ids": ids, "input_lengths": lengths})
            value = result["logprobs"] if isinstance(result, dict) else result
            out[alias] = float(np.asarray(value).sum() / float(lengths.sum() - len(lengths)))
    print(json.dumps({"toy_trainer": out}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
