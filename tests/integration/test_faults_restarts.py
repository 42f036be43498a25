"""The restart policy on the real Slurm test cluster, with teachers of its own (after
``test_faults.py``, whose 2-node teacher is down by then), each with a client loop calling:

- two 1-node teachers reach a short time limit, one warned by ``--signal=USR2``, one by
  ``--signal=TERM``: both requeue and serve again;
- with the default ``restart.at_time_limit: stop``, a time limit ends a teacher: no requeue;
- a checkpoint broken under a running teacher makes exactly ``restart.max_consecutive_failures``
  generations fail, then ``failed`` for good with the error in ``podium status``; fixed, ``podium
  up`` brings it back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from harness.cli import podium
from harness.client_loop import COMEBACK_S
from harness.faults import Served, serve_with_client
from harness.poll import SLOW_POLL_S, wait_for
from harness.recipes import write_recipe
from harness.slurm_run import job_ids

from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.restarts import RestartLedger
from podium.launcher.common.slurm_state import query_states
from podium.launcher.login.run_dir import known_teachers
from podium.poll import poll_until
from podium.rendezvous.records import Status, read_record

pytestmark = pytest.mark.slurm


def test_time_limit_requeues_with_user_signal_and_with_term(slurm_cluster, tiny_llama_checkpoint: Path,
                                                             tiny_qwen2_checkpoint: Path, tmp_path: Path) -> None:
    """``time: 9 min`` with the signal 270 s ahead: each teacher is warned ~270 s after it starts,
    requeues and serves again as a next generation. A generation must be ready before its warning
    for the next one to be: on 2 cores at load 40-60 a start took up to ~200 s (a first `ray start`
    missing Ray's start limits and tried again, ~40-110 s in all, then ~60-80 s of model load), and
    with a warning at ~140 s (a 7-minute limit) no generation of one teacher was ever ready; a
    warning that comes while the group loads is heeded once it has loaded."""
    recipe = write_recipe(tmp_path / "recipe.yaml",
                          {"usr2": (tiny_llama_checkpoint, 1), "term": (tiny_qwen2_checkpoint, 1)},
                          slurm={"time": "00:09:00", "signal_lead_s": 270},
                          restart={"at_time_limit": "requeue"},  # the default, stop: test_a_time_limit_ends_the_teacher
                          teachers={"usr2": {"slurm": {"signal": "USR2"}}, "term": {"slurm": {"signal": "TERM"}}})
    run_dir = tmp_path / "run"
    served = {}
    try:
        # No `--wait`: both teachers ready at once is not what is tested, and under load a
        # generation's ~270 s can pass with the other one still starting (each then requeues at its
        # time limit; a loaded node's first `ray start` may miss Ray's start limits and be tried again).
        podium("up", str(recipe), "--run-dir", str(run_dir))
        # The warning may come before a client's first answer (a slow start leaves little of the
        # 270 s): the loops only start here, each waiting for its teacher; every call they make,
        # before or after, is checked. A call waits as long as the test waits for a generation (on
        # a loaded machine a teacher warned, requeued and restarted, its first `ray start` retried,
        # was away 4 min; podium's own client waits 30).
        for alias, checkpoint in (("usr2", tiny_llama_checkpoint), ("term", tiny_qwen2_checkpoint)):
            served[alias] = serve_with_client(recipe, run_dir, alias, checkpoint, up=False, first_answers=False,
                                              patience_s=COMEBACK_S * 3)
        measured = {}
        for alias, s in served.items():
            # A generation that served is warned, requeues and the next one serves. Which generation
            # that is depends on the load (a first start may fail and be retried): the ledger says
            # how each ended, the watcher that the next one served.
            def warned(s: Served = s) -> object:  # (bound: the wait ends within this iteration)
                return next((o for o in RestartLedger.read(s.files).outcomes if o.outcome == "time_limit"), None)

            limit = wait_for(warned, f"{alias} reaching its time limit",
                             timeout_s=COMEBACK_S * 3, interval_s=SLOW_POLL_S)
            assert "near its time limit" in limit.reason, limit.reason
            # the next generation, or (a start failing under load, and retried) the one after it
            t_ready, ready = wait_for(lambda s=s, limit=limit: s.watcher.ready_after(limit.generation),
                                      f"a generation after {limit.generation} ready",
                                      timeout_s=COMEBACK_S * 2, interval_s=SLOW_POLL_S)
            wait_for(lambda s=s, t_ready=t_ready: s.client.answered_after(t_ready) >= 2,
                     f"answers after {limit.generation} (records seen: {s.watcher.summary()})",
                     timeout_s=COMEBACK_S, interval_s=SLOW_POLL_S)
            measured[alias] = {"generation": f"{ready['generation']['job_id']}:{ready['generation']['restart']}",
                               "first_reason": limit.reason,
                               "task_start_to_ready_s": round(ready["timings"]["ready"]
                                                              - ready["timings"]["task_start"], 1)}
        assert "SIGUSR2" in measured["usr2"]["first_reason"] and "SIGTERM" in measured["term"]["first_reason"]
        for alias, s in served.items():
            measured[alias]["calls"] = s.assert_client_clean(0)
        print(json.dumps({"time_limit": measured}))
    finally:
        for s in served.values():
            s.client.stop()
            s.watcher.stop()
        podium("down", str(run_dir), check=False)


def test_a_time_limit_ends_the_teacher(slurm_cluster, tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """A 1-minute time limit, warned 40 s ahead (the teacher need not be ready for what is checked):
    the generation stops at ``at_time_limit: stop`` and Slurm does not requeue the job."""
    recipe = write_recipe(tmp_path / "recipe.yaml", {"solo": (tiny_llama_checkpoint, 1)},
                          slurm={"time": "00:01:00", "signal_lead_s": 40})
    run_dir = tmp_path / "run"
    try:
        podium("up", str(recipe), "--run-dir", str(run_dir))
        job = job_ids(run_dir)["solo"]
        [(_, files)] = known_teachers(run_dir)

        def ended() -> RestartLedger | None:
            states = query_states([job])
            ledger = RestartLedger.read(files)
            return ledger if job in states and not states[job].alive and ledger.outcomes else None

        # a 1-minute job: the wait is the job's start (the nodes of the test before are freed first) and its minute
        ledger = poll_until(ended, timeout_s=300, interval_s=1, what=f"job {job} to end at its time limit")
        assert [o.outcome for o in ledger.outcomes] == ["time_limit"]
        assert "near its time limit" in ledger.outcomes[0].reason
        record = read_record(files.endpoint)
        assert record.status is Status.STOPPED and record.will_retry is False and record.final is False
        assert record.restart is not None and "at_time_limit=stop" in record.restart.why
        assert slurm_cluster.sacct(job)[0]["State"] in ("COMPLETED", "TIMEOUT")  # not requeued
        assert int(slurm_cluster.scontrol_job(job).get("Restarts", "0")) == 0
    finally:
        podium("down", str(run_dir), check=False)


def test_a_broken_checkpoint_fails_for_good_after_max_consecutive_failures(slurm_cluster, slurm_jobs: list,
                                                                          tiny_llama_checkpoint: Path,
                                                                          tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_llama_checkpoint, checkpoint)
    recipe = write_recipe(tmp_path / "recipe.yaml", {"solo": (checkpoint, 1)},
                          restart={"max_consecutive_failures": 2, "backoff_s": 1})
    run_dir = tmp_path / "run"
    podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    job = job_ids(run_dir)["solo"]
    slurm_jobs.append(job)
    weights = checkpoint / "model.safetensors"
    weights.rename(checkpoint / "model.safetensors.moved")  # broken under the running teacher
    try:
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, timeout=30)  # a restart

        def final_failure() -> dict | None:
            (row,) = json.loads(podium("status", str(run_dir), "--json", check=False).stdout)
            return row if row["status"] == "failed" and row["final"] else None

        row = wait_for(final_failure, "the teacher failing for good", timeout_s=COMEBACK_S * 2, interval_s=SLOW_POLL_S)
        assert row["restart"]["consecutive_failures"] == 2 and "neither an HF directory" in row["reason"], row
        slurm_cluster.wait_for_state(job, "FAILED", timeout_s=60)
        ledger = RestartLedger.read(TeacherFiles.of(run_dir, "solo", row["key"]))
        failed = [o for o in ledger.outcomes if o.outcome == "failed"]
        assert [o.generation for o in failed] == [f"{job}:1", f"{job}:2"], ledger.outcomes  # exactly 2
        table = podium("status", str(run_dir), check=False, env={"COLUMNS": "400"}).stdout
        assert "final after 2/2 failures" in table, table
    finally:
        (checkpoint / "model.safetensors.moved").rename(weights)
    again = podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", str(COMEBACK_S))
    assert "solo: resubmitted job" in again.stdout, again.stdout
    new_job = job_ids(run_dir)["solo"]
    slurm_jobs.append(new_job)
    assert new_job != job
    podium("down", str(run_dir))
