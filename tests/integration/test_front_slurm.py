"""``podium front`` on the real Slurm test cluster: one fixed URL through a real preemption, ``podium
scale`` and ``podium down``, one teacher start.

The teacher (tiny Qwen2, the real teacher group, one node of partition ``low``) comes up with
``podium up --wait``; a front serves its alias; a caller posts SGLang ``/generate`` through the
front's URL all along, every answer checked against the HF fp32 oracle:

1. the teacher is preempted for real (a job in ``high`` needs its node) and comes back as its next
   generation on another node/port: the caller's calls are held, then answered;
2. ``podium scale RUN solo 2``: the second replica is listed and the front sends it calls;
3. ``podium down``: a call through the front fails at once with 410 naming the teacher.

0 failed and 0 wrong calls before the stop.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
from fixtures.checkpoints import hf_oracle_logprobs
from harness.cli import podium
from harness.client_loop import COMEBACK_S
from harness.faults import RecordWatcher, preempt
from harness.poll import SLOW_POLL_S, wait_for
from harness.recipes import write_recipe
from test_replicas_slurm import generation, replicas_of, requests_served

from podium.front.serve import FrontThread
from podium.rendezvous.token import read_token

ROW = [5, 17, 99, 3, 200, 41, 7]


class Caller:
    """SGLang ``/generate`` through the front until stopped; each answer against the oracle."""

    def __init__(self, base: str, token: str, expected: np.ndarray) -> None:
        self.base, self.token, self.expected = base, token, expected
        self.answers, self.errors = 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"input_ids": ROW, "return_logprob": True, "logprob_start_len": 0,
                "sampling_params": {"max_new_tokens": 0}}
        while not self._stop.is_set():
            try:
                answer = requests.post(f"{self.base}/generate", json=body, timeout=COMEBACK_S,
                                       headers={"Authorization": f"Bearer {self.token}"})
                assert answer.status_code == 200, answer.text
                got = [t[0] for t in answer.json()["meta_info"]["input_token_logprobs"][1:]]
                np.testing.assert_allclose(got, self.expected, atol=1e-4)
                self.answers += 1
            except Exception as exc:  # asserted on by the test
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def start(self) -> Caller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(COMEBACK_S)


@pytest.mark.slurm
def test_one_url_through_preemption_scale_and_down(slurm_cluster, slurm_scratch: Path, slurm_jobs: list,
                                                   tiny_qwen2_checkpoint: Path) -> None:
    recipe = write_recipe(slurm_scratch / "recipe.yaml", {"solo": (tiny_qwen2_checkpoint, 1)},
                          slurm={"cpus_per_task": slurm_cluster.cpus_per_node})
    run_dir = slurm_scratch / "run"
    podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    expected = hf_oracle_logprobs(tiny_qwen2_checkpoint, np.array([ROW]), np.array([len(ROW)])).numpy()[0, 1:]
    token = read_token(run_dir / "auth_token")
    front = FrontThread(run_dir, refresh_s=1.0).start()
    caller = Caller(f"{front.url}/solo", token, expected).start()
    try:
        wait_for(lambda: caller.answers >= 2, "answers through the front", timeout_s=COMEBACK_S,
                 interval_s=SLOW_POLL_S)
        replicas = replicas_of(run_dir)
        gen = generation(replicas[0])
        job = gen.split(":")[0]
        slurm_jobs.append(job)
        watcher = RecordWatcher(replicas[0].endpoint).start()
        try:  # 1. preempted for real: held, then answered by the next generation
            slurm_jobs.append(preempt(slurm_cluster.scontrol_job(job)["NodeList"], slurm_scratch))
            watcher.wait_for(gen, "stopped", 60)
            nxt = f"{job}:{int(gen.split(':')[1]) + 1}"
            watcher.wait_for(nxt, "ready", COMEBACK_S)
        finally:
            watcher.stop()
        done = caller.answers
        wait_for(lambda: caller.answers >= done + 2, "answers from the next generation", timeout_s=COMEBACK_S,
                 interval_s=SLOW_POLL_S)
        podium("scale", str(run_dir), "solo", "2", timeout=120)  # 2. a second replica
        replicas = replicas_of(run_dir)
        slurm_jobs.append(json.loads(replicas[1].job.read_text())["job_id"])
        wait_for(lambda: replicas[1].endpoint.exists() and requests_served(replicas[1]) >= 2,
                 "calls through the front on replica 1", timeout_s=COMEBACK_S, interval_s=SLOW_POLL_S)
        caller.stop()
        assert caller.errors == [], caller.errors[:3]
        podium("down", str(run_dir))  # 3. stopped: fails at once, naming it
        gone = requests.post(f"{front.url}/solo/generate", json={"input_ids": ROW, "return_logprob": True},
                             timeout=120, headers={"Authorization": f"Bearer {token}"})
        assert gone.status_code == 410, gone.text
        assert "'solo'" in gone.json()["error"]["message"] and "was stopped at" in gone.json()["error"]["message"]
    finally:
        caller.stop()
        front.stop()
        podium("down", str(run_dir), check=False)
