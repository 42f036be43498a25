"""One teacher served by several replicas on the real Slurm test cluster, with a trainer's client
calling all along and every answer checked against the HF oracle.

The teacher (tiny Qwen2, the real teacher group, each replica one node holding all its CPU slots in
partition ``low``) starts with ``podium.replicas: 2``:

1. ``podium up --wait``: two jobs, two generation-fenced records, the rendezvous lists both, and
   the client's calls reach both (each endpoint's ``/metrics`` counts requests);
2. replica 1 is preempted for real (a job in ``high`` needs its node): it drains, requeues itself
   and comes back as its next generation, while replica 0 answers every call; once back it takes
   calls again;
3. ``podium scale RUN solo 3``: replica 2 is submitted, replicas 0 and 1 are left as they are
   (same jobs, same generations), the rendezvous lists three and the client calls the new one;
4. ``podium scale RUN solo 1``: replicas 1 and 2 leave the rendezvous, then stop; the client goes
   on with replica 0;
5. ``podium down``: a call through the front fails at once, with 410 naming the teacher.

All along, beside the client, a trainer that pins one URL calls SGLang's ``/generate`` through
``podium front``'s base URL for the alias: the front follows the replicas, the preemption and the
scaling as the client does. Neither sees an error, and every answer equals the oracle's.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from fixtures.checkpoints import hf_oracle_logprobs
from harness.cli import podium
from harness.client_loop import COMEBACK_S
from harness.faults import RecordWatcher, preempt, serve_with_client
from harness.front_caller import ROW, generate_caller
from harness.poll import SLOW_POLL_S, wait_for
from harness.recipes import write_recipe

from podium.front.serve import FrontThread
from podium.launcher.common.files import TeacherFiles
from podium.launcher.login.run_dir import known_teachers
from podium.rendezvous import read_rendezvous
from podium.rendezvous.token import read_token
from podium.teacher.endpoint.metrics import summary


def replicas_of(run_dir: Path) -> dict[int, TeacherFiles]:
    return {spec.replica: files for spec, files in known_teachers(run_dir)}


def record(files: TeacherFiles) -> dict[str, Any]:
    return json.loads(files.endpoint.read_text())


def generation(files: TeacherFiles) -> str:
    gen = record(files)["generation"]
    return f"{gen['job_id']}:{gen['restart']}"


def requests_served(files: TeacherFiles) -> float:
    """Requests the replica's current endpoint has answered (its ``/metrics``; 0 when not serving)."""
    data = record(files)
    if data["status"] != "ready" or not data.get("url"):
        return 0.0
    with urllib.request.urlopen(f"{data['url']}/metrics", timeout=10) as resp:
        return summary(resp.read().decode())["requests"]


def status_rows(run_dir: Path) -> list[dict[str, Any]]:
    return json.loads(podium("status", str(run_dir), "--json", check=False).stdout)


@pytest.mark.slurm
def test_two_replicas_one_preempted_then_scaled_up_and_down(
    slurm_cluster, slurm_scratch: Path, slurm_jobs: list, tiny_qwen2_checkpoint: Path
) -> None:
    recipe = write_recipe(slurm_scratch / "recipe.yaml", {"solo": (tiny_qwen2_checkpoint, 1)},
                          slurm={"cpus_per_task": slurm_cluster.cpus_per_node}, teachers={"solo": {"replicas": 2}})
    run_dir = slurm_scratch / "run"
    served = serve_with_client(recipe, run_dir, "solo", tiny_qwen2_checkpoint)
    token = read_token(run_dir / "auth_token")
    expected = hf_oracle_logprobs(tiny_qwen2_checkpoint, np.array([ROW]), np.array([len(ROW)])).numpy()[0, 1:]
    front = FrontThread(run_dir, refresh_s=1.0).start()
    caller = generate_caller(f"{front.url}/solo", token, expected).start()
    try:
        # 1. Two replicas, two jobs, both listed and both called.
        replicas = replicas_of(run_dir)
        assert sorted(replicas) == [0, 1]
        jobs = {i: generation(f).split(":")[0] for i, f in replicas.items()}
        slurm_jobs.extend(jobs.values())
        assert jobs[0] != jobs[1]
        entry = read_rendezvous(run_dir).teachers[record(replicas[0])["teacher_key"]]
        assert [Path(p).parent.name for p in entry.replicas] == [replicas[0].folder.name, replicas[1].folder.name]
        assert [record(f)["replica"] for f in (replicas[0], replicas[1])] == [0, 1]
        rows = status_rows(run_dir)
        assert [(r["replica"], r["job_id"], r["ready"]) for r in rows] == [(0, jobs[0], True), (1, jobs[1], True)]
        wait_for(lambda: all(requests_served(f) >= 2 for f in replicas.values()), "calls on both replicas",
                 timeout_s=120, interval_s=SLOW_POLL_S)

        # 2. Replica 1 preempted: replica 0 answers meanwhile; replica 1 comes back and is called again.
        watcher = RecordWatcher(replicas[1].endpoint).start()
        try:
            gen = generation(replicas[1])
            slurm_jobs.append(preempt(slurm_cluster.scontrol_job(jobs[1])["NodeList"], slurm_scratch))
            t_stopped, _ = watcher.wait_for(gen, "stopped", 60)
            on_zero = requests_served(replicas[0])
            wait_for(lambda: requests_served(replicas[0]) >= on_zero + 3, "replica 0 answering alone",
                     timeout_s=120, interval_s=SLOW_POLL_S)
            t_ready, _ = watcher.wait_for(served.next_generation(gen), "ready", COMEBACK_S)
            wait_for(lambda: requests_served(replicas[1]) >= 2, "calls on replica 1's next generation",
                     timeout_s=120, interval_s=SLOW_POLL_S)
        finally:
            watcher.stop()
        assert served.client.answered_after(t_ready) >= 1
        served.assert_client_clean(0)

        # 3. Scaled up to three: the two that run are left as they are.
        out = podium("scale", str(run_dir), "solo", "3", timeout=120).stdout
        assert f"solo: reattached job {jobs[0]}" in out and f"solo#1: reattached job {jobs[1]}" in out, out
        assert "solo#2: submitted job" in out and "lists 3 replica(s) of solo (was 2)" in out, out
        replicas = replicas_of(run_dir)
        jobs[2] = json.loads(replicas[2].job.read_text())["job_id"]
        slurm_jobs.append(jobs[2])
        assert len(read_rendezvous(run_dir).teachers[entry_key(run_dir)].replicas) == 3
        wait_for(lambda: replicas[2].endpoint.exists() and record(replicas[2])["status"] == "ready", "replica 2 ready",
                 timeout_s=COMEBACK_S, interval_s=SLOW_POLL_S)
        wait_for(lambda: requests_served(replicas[2]) >= 2, "calls on replica 2", timeout_s=120, interval_s=SLOW_POLL_S)
        assert generation(replicas[0]) == f"{jobs[0]}:0"  # untouched
        podium("wait", str(run_dir), "--timeout", "60")

        # 4. Scaled down to one: replicas 1 and 2 leave the rendezvous, then stop.
        out = podium("scale", str(run_dir), "solo", "1", timeout=180).stdout
        assert "solo#1: stopped" in out and "solo#2: stopped" in out and "(was 3)" in out, out
        assert len(read_rendezvous(run_dir).teachers[entry_key(run_dir)].replicas) == 1
        for i in (1, 2):
            slurm_cluster.wait_for_state(jobs[i], "CANCELLED", timeout_s=60)
            assert record(replicas[i])["status"] == "stopped"
        rows = status_rows(run_dir)
        assert [(r["replica"], r["in_plan"]) for r in rows] == [(0, True), (1, False), (2, False)], rows
        assert podium("status", str(run_dir), check=False).returncode == 0  # the listed replica is ready
        on_zero = requests_served(replicas[0])
        wait_for(lambda: requests_served(replicas[0]) >= on_zero + 3, "replica 0 answering alone",
                 timeout_s=120, interval_s=SLOW_POLL_S)
        calls = served.assert_client_clean(0)
        caller.stop()
        assert caller.errors == [] and caller.answers >= 10, (caller.answers, caller.errors[:3])
        podium("down", str(run_dir))  # 5. stopped: a call through the front fails at once, naming it
        gone = requests.post(f"{front.url}/solo/generate", json={"input_ids": ROW, "return_logprob": True},
                             timeout=120, headers={"Authorization": f"Bearer {token}"})
        assert gone.status_code == 410, gone.text
        assert "'solo'" in gone.json()["error"]["message"] and "was stopped at" in gone.json()["error"]["message"]
    finally:
        caller.stop()
        front.stop()
        served.client.stop()
        served.watcher.stop()
        podium("down", str(run_dir), check=False)
    print(json.dumps({"replicas_test": {"calls": calls, "front_calls": caller.answers,
                                        "retried": served.client.retries,
                                        "replica1_away_s": round(t_ready - t_stopped, 1)}}))


def entry_key(run_dir: Path) -> str:
    (key,) = read_rendezvous(run_dir).teachers
    return key


FAKE_SBATCH = """#!/bin/bash
# sbatch of a site whose QOS takes one more job: the first submission is accepted (no job is
# started: this test needs none), every later one refused as Slurm 22.05 refuses it
n=$(cat "{count}" 2>/dev/null || echo 0); echo $((n + 1)) > "{count}"
if [ "$n" = 0 ]; then echo "Submitted batch job 999001"; exit 0; fi
echo "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy \
(job submit limit, user's size and/or time limits)" >&2
exit 1
"""


@pytest.mark.slurm
def test_scale_refused_halfway_lists_what_was_submitted_and_stops_nothing(
    slurm_cluster, slurm_scratch: Path, slurm_jobs: list, tiny_qwen2_checkpoint: Path
) -> None:
    """``podium scale`` to 3 where the site takes one more job: replica 0 has a live job (a stand-in),
    replica 1 is submitted, replica 2 is refused; the error names the refusal, its fix and what
    has jobs; the rendezvous lists what was submitted (clients use it once it serves), and nothing
    is stopped or left half-submitted."""
    import os
    import subprocess

    from podium.config.plan import load_plan
    from podium.launcher.login.run_dir import prepare_run_dir

    recipe = write_recipe(slurm_scratch / "recipe.yaml", {"solo": (tiny_qwen2_checkpoint, 1)})
    run_dir = slurm_scratch / "run"
    prepare_run_dir(load_plan(recipe), run_dir)
    (replica0,) = replicas_of(run_dir).values()
    running = subprocess.run(["sbatch", "--parsable", "-p", "low", "-c", "1", "--output=/dev/null", "--wrap",
                              "sleep 300"], capture_output=True, text=True, check=True).stdout.strip()
    slurm_jobs.append(running)
    replica0.job.write_text(json.dumps({"teacher_key": entry_key(run_dir), "teacher_name": "solo",
                                        "job_id": running, "cluster": "slurm", "submitted_at": 0.0,
                                        "folder": str(replica0.submitit)}))
    bin_dir = slurm_scratch / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH.format(count=slurm_scratch / "sbatch.count"))
    (bin_dir / "sbatch").chmod(0o755)
    proc = podium("scale", str(run_dir), "solo", "3", check=False,
                  env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "sbatch refused" in err and "Job violates accounting/QOS policy" in err and "podium.slurm.qos" in err, err
    assert (f"replicas with jobs: solo job {running}, solo#1 job 999001; the rendezvous lists 2; "
            "nothing was stopped") in err, err
    replicas = replicas_of(run_dir)
    listed = read_rendezvous(run_dir).teachers[entry_key(run_dir)].replicas
    assert [Path(p).parent.name for p in listed] == [replicas[0].folder.name, replicas[1].folder.name]
    assert not replicas[2].job.exists() and not replicas[2].submitting.exists()
    assert slurm_cluster.scontrol_job(running)["JobState"] in ("PENDING", "RUNNING")  # not stopped
