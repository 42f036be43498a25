"""``podium up / status / wait / down`` end to end on the real Slurm test cluster.

One run of two teachers (math+code on a 2-node teacher, chat on a 1-node teacher; workers are CPU
slots), named by a teachers file (podium's short form: a user without a NeMo RL recipe), is brought
up once per module and shared; tests that need their own run (two concurrent
``up``, a failing node, ``up`` from inside sbatch, a plain-sbatch teacher, a trainer whose time
limit takes its teacher down) bring up small ones; those that do not need the shared run come
after its ``down``, so they do not compete with it for the cores. Last, one run of two
expert-parallel teachers (Qwen3-MoE and Nemotron-H, each EP2 over two nodes), named by a NeMo RL
recipe, serves the MoE and the Nemotron-H tests.
The jobs build the real Megatron teacher group; the oracle is transformers in the test process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.cli import podium
from harness.recipes import write_recipe, write_teachers_file
from harness.slurm_run import check_logprobs, job_ids, ray_processes_of

from podium.launcher.common.slurm_state import query_states
from podium.launcher.job.ray_bootstrap import START_LIMIT_MARK
from podium.poll import poll_until
from podium.protocol.names import OPENAI_BASE

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def checkpoints(tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> dict[str, Path]:
    return {"llama": tiny_llama_checkpoint, "qwen2": tiny_qwen2_checkpoint}


@pytest.fixture(scope="module")
def two_teachers(slurm_cluster, checkpoints, tmp_path_factory) -> Iterator[tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("launcher")
    recipe = write_teachers_file(root / "teachers.yaml", {"math": (checkpoints["llama"], 2),
                                                          "code": (checkpoints["llama"], 2),
                                                          "chat": (checkpoints["qwen2"], 1)})
    run_dir = root / "run"
    try:
        # The 2-node teacher's worker gets a first `ray start` that misses Ray's start limits (a
        # starved node's, injected; the node starts its Ray again): what a loaded node does at
        # random, here on purpose. Every head's first `ray start` finds a port of its block taken
        # (another user's process could take one after the block's check; injected): the head
        # starts its Ray again on another block. The wait allows that and a requeue or two of a
        # node that misses Ray's limits on every try (the CI machine's load, 2 cores, reaches 30-70).
        podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", "420",
               env={"PODIUM_FAULTS": "slow_ray_agent_rank=1,take_ray_port_rank=0"}, timeout=480)
        yield recipe, run_dir
    finally:
        podium("down", str(run_dir), check=False)


def test_up_wait_ready_and_logprobs_per_alias(two_teachers, checkpoints) -> None:
    _, run_dir = two_teachers
    check_logprobs(run_dir, {"math": checkpoints["llama"], "code": checkpoints["llama"],
                             "chat": checkpoints["qwen2"]})


def test_status_shows_both(two_teachers) -> None:
    """Both teachers of the teachers file (its two aliases on one checkpoint: one teacher), ready,
    each with the OpenAI base URL other trainers are given, in --json and in the table."""
    _, run_dir = two_teachers
    proc = podium("status", str(run_dir), "--json")
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {"math", "chat"}
    assert rows["math"]["aliases"] == ["math", "code"]
    table = podium("status", str(run_dir), env={"COLUMNS": "200"}).stdout
    for name, row in rows.items():
        assert row["base_url"] == row["url"] + OPENAI_BASE, row
        assert f"{name} OpenAI base_url: {row['base_url']}" in table, table
    for row in rows.values():
        assert row["ready"] and row["slurm_state"] == "RUNNING" and row["health"] is True
        # job:restart -- a restart count, not 0: a node whose every try of `ray start` misses
        # Ray's fixed start limits (a loaded machine) fails its generation, and the job is then
        # requeued by its restart policy and serves
        assert re.fullmatch(rf"{row['job_id']}:\d+", row["generation"]), row
    assert len({r["url"] for r in rows.values()}) == 2


def test_a_worker_node_whose_ray_missed_rays_start_limits_started_it_again(two_teachers) -> None:
    """The serving generation of the 2-node teacher: its worker's first ``ray start`` missed Ray's
    start limits (injected: its dashboard agent too slow for the raylet's fixed 15 s), and the node
    started its Ray again in the same generation and joined (the teacher serves: the tests above);
    its log says why, naming the raylet's cause."""
    _, run_dir = two_teachers
    (row,) = [r for r in json.loads(podium("status", str(run_dir), "--json").stdout) if r["name"] == "math"]
    job, restart = row["generation"].split(":")
    (generation,) = run_dir.glob(f"teachers/*/nodes/{job}-{restart}")
    assert json.loads((generation / "1.json").read_text())["ray_attempt"] == 2
    assert START_LIMIT_MARK in (generation / "1.ray-start.log").read_text()
    logs = "".join(path.read_text(errors="replace") for path in run_dir.glob(f"teachers/*/**/{job}_1_log.*"))
    lines = [line for line in logs.splitlines() if "(rank 1)" in line and "starting its Ray again (try 2 of" in line]
    assert lines and "its raylet gave up waiting for the node's dashboard agent" in lines[-1], logs[-3000:]


def test_a_head_whose_port_was_taken_under_ray_started_it_on_another_block(two_teachers) -> None:
    """Each teacher's serving generation: its head's first ``ray start`` found its node-manager port
    taken (injected), and the head started Ray again on another block of ports, which its record,
    its head file and the Ray it serves on name (the teachers serve: the tests above)."""
    _, run_dir = two_teachers
    for row in json.loads(podium("status", str(run_dir), "--json").stdout):
        job, restart = row["generation"].split(":")
        (generation,) = run_dir.glob(f"teachers/*/nodes/{job}-{restart}")
        head = json.loads((generation / "0.json").read_text())
        assert head["ray_attempt"] >= 2, head
        first = generation / "0.ray-start.log"
        assert f"--node-manager-port={head['ports']['node_manager']}" not in first.read_text()
        assert json.loads((generation / "head.json").read_text())["ports"] == head["ports"]
        logs = "".join(path.read_text(errors="replace") for path in run_dir.glob(f"teachers/*/**/{job}_0_log.*"))
        lines = [line for line in logs.splitlines() if "starting its Ray again on another block of ports" in line]
        assert lines and "a port of its block was taken" in lines[0], logs[-3000:]


def test_scoring_fronts_of_a_teachers_file_equal_transformers(two_teachers, checkpoints) -> None:
    """Issue 30's done-when: a teacher brought up from a teachers file answers, at the base URL
    ``podium status --json`` gives, vLLM's ``prompt_logprobs`` (single and batched prompts, T = 1 and
    T = 0.7) and echo forms through the real ``openai`` client and SGLang's ``/generate`` by plain
    HTTP, equal to transformers fp32; the same through the teacher's token URL without a header (as
    TRL and slime call); 401 without the run's token."""
    import openai
    import requests
    from harness.scoring_oracle import check_echo_logprobs, check_generate, check_prompt_logprobs, oracle

    from podium.protocol.names import OPENAI_COMPLETIONS, PLAIN_HEALTH, SGLANG_GENERATE, TOKEN_PATH
    from podium.rendezvous.token import read_token

    _, run_dir = two_teachers
    row = {r["name"]: r for r in json.loads(podium("status", str(run_dir), "--json").stdout)}["math"]
    token, ckpt, k = read_token(run_dir / "auth_token"), checkpoints["llama"], 3
    prompts = [[5, 17, 99, 3, 200, 41, 7], [12, 250, 33, 90]]
    client = openai.OpenAI(base_url=row["base_url"], api_key=token, max_retries=0)
    for temperature in (1.0, 0.7):
        expected = oracle(ckpt, prompts, temperature)
        batched = client.completions.create(model="code", prompt=prompts, max_tokens=1, temperature=temperature,
                                            extra_body={"prompt_logprobs": k})
        for choice, prompt, exp in zip(batched.choices, prompts, expected, strict=True):
            check_prompt_logprobs(choice.model_extra["prompt_logprobs"], exp, prompt, k)
        single = client.completions.create(model="math", prompt=prompts[1], max_tokens=1, temperature=temperature,
                                           extra_body={"prompt_logprobs": k})
        check_prompt_logprobs(single.choices[0].model_extra["prompt_logprobs"], expected[1], prompts[1], k)
    expected = oracle(ckpt, prompts, 1.0)
    echo = client.completions.create(model="math", prompt=prompts[0], max_tokens=0, echo=True, logprobs=k)
    check_echo_logprobs(echo.choices[0].logprobs, expected[0], prompts[0], k)
    body = {"input_ids": prompts, "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": k,
            "sampling_params": {"temperature": 0, "max_new_tokens": 0}}
    answer = requests.post(row["url"] + SGLANG_GENERATE, json=body, timeout=60,
                           headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    for result, prompt, exp in zip(answer.json(), prompts, expected, strict=True):
        check_generate(result, exp, prompt, k)
    # TRL's and slime's clients send no header: through the teacher's token URL
    token_url = f"{row['url']}{TOKEN_PATH}/{token}"
    assert requests.get(token_url + PLAIN_HEALTH, timeout=30).status_code == 200
    trl = requests.post(token_url + OPENAI_COMPLETIONS, timeout=60, json={
        "model": "math", "prompt": prompts, "max_tokens": 1, "temperature": 1.0, "prompt_logprobs": k})
    assert trl.status_code == 200, trl.text
    for choice, prompt, exp in zip(trl.json()["choices"], prompts, expected, strict=True):
        check_prompt_logprobs(choice["prompt_logprobs"], exp, prompt, k)
    slime = requests.post(token_url + SGLANG_GENERATE, json=body, timeout=60)
    assert slime.status_code == 200, slime.text
    check_generate(slime.json()[0], expected[0], prompts[0], k)
    basic = requests.post(row["url"].replace("://", f"://podium:{token}@", 1) + SGLANG_GENERATE, json=body,
                          timeout=60)  # the token as HTTP Basic's password: what the docs now show
    assert basic.status_code == 200, basic.text
    check_generate(basic.json()[1], expected[1], prompts[1], k)
    for path, request in ((OPENAI_COMPLETIONS, {"prompt": prompts[0], "max_tokens": 0}), (SGLANG_GENERATE, body)):
        assert requests.post(row["url"] + path, json=request, timeout=30).status_code == 401
        assert requests.post(f"{row['url']}{TOKEN_PATH}/not-the-token{path}", json=request,
                             timeout=30).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=row["base_url"], api_key="not-the-token", max_retries=0).completions.create(
            model="math", prompt=prompts[0], max_tokens=0)


def test_second_up_reattaches(two_teachers) -> None:
    recipe, run_dir = two_teachers
    before = job_ids(run_dir)
    proc = podium("up", str(recipe), "--run-dir", str(run_dir))
    assert proc.stdout.count("reattached") == 2, proc.stdout
    assert job_ids(run_dir) == before


def test_concurrent_up_submit_once_and_two_runs_side_by_side(two_teachers, checkpoints, tmp_path) -> None:
    """Two `up` at once on a new run dir submit once; that second run shares the nodes with the
    module's run (no port or temp-dir collision), and taking it down leaves the first serving."""
    _, run_a = two_teachers
    recipe = write_recipe(tmp_path / "recipe.yaml", {"solo": (checkpoints["qwen2"], 1)})
    run_b = tmp_path / "run"
    results: list[subprocess.CompletedProcess] = []
    threads = [threading.Thread(target=lambda: results.append(
        podium("up", str(recipe), "--run-dir", str(run_b), "--wait", "--timeout", "420", timeout=480)))
        for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        outs = "".join(r.stdout for r in results)
        assert outs.count("submitted job") == 1 and outs.count("reattached job") == 1, outs
        assert len(job_ids(run_b)) == 1
        check_logprobs(run_b, {"solo": checkpoints["qwen2"]})
        check_logprobs(run_a, {"math": checkpoints["llama"], "chat": checkpoints["qwen2"]})
    finally:
        podium("down", str(run_b))
    check_logprobs(run_a, {"math": checkpoints["llama"], "chat": checkpoints["qwen2"]})


def test_down_ends_both(two_teachers, slurm_cluster) -> None:
    """Last of the shared run's tests: `down` cancels both jobs and leaves no Ray process of them (repeatable)."""
    _, run_dir = two_teachers
    jobs = list(job_ids(run_dir).values())
    podium("down", str(run_dir))
    for job in jobs:
        slurm_cluster.wait_for_state(job, "CANCELLED", timeout_s=60)
    deadline = time.monotonic() + 20
    while ray_processes_of(jobs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not ray_processes_of(jobs)
    proc = podium("status", str(run_dir), "--json", check=False)
    assert proc.returncode == 1
    assert all(r["status"] in ("stopped", "draining") for r in json.loads(proc.stdout))
    assert "stopped" in podium("down", str(run_dir)).stdout  # safe to repeat


def test_node_failing_at_start_fails_fast_naming_it(slurm_cluster, checkpoints, tmp_path) -> None:
    """`up --wait` ends with the node's failure, not its own --timeout: stderr names the rank, the
    node and the injected fault (a wait that timed out would say none of that). One failure is
    final here (``restart.max_consecutive_failures: 1``); by default the start is retried, see
    ``test_faults.py``."""
    recipe = write_recipe(tmp_path / "recipe.yaml", {"wide": (checkpoints["llama"], 2)},
                          restart={"max_consecutive_failures": 1})
    run_dir = tmp_path / "run"
    proc = podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", "300",
                  env={"PODIUM_FAULTS": "fail_node_rank=1"}, check=False, timeout=420)
    try:
        assert proc.returncode != 0
        assert "not ready after" not in proc.stderr, proc.stderr[-3000:]  # ended by the failure, not the wait
        assert "rank 1" in proc.stderr and "fault injected" in proc.stderr, proc.stderr[-3000:]
        assert any(f"node {n} (rank 1)" in proc.stderr for n in slurm_cluster.nodes), proc.stderr[-3000:]
    finally:
        podium("down", str(run_dir), check=False)


def test_up_from_inside_sbatch_and_plain_sbatch_teacher(slurm_cluster, checkpoints, tmp_path) -> None:
    """sbatch/trainer.sbatch submits its teacher from inside a job; sbatch/teacher_plain.sh starts one
    from a rendered script; the toy trainer step reaches both."""
    repo = Path(__file__).resolve().parents[2]
    recipe = write_recipe(tmp_path / "recipe.yaml", {"inner": (checkpoints["qwen2"], 1)})
    run_dir = tmp_path / "run"
    plain_recipe = write_recipe(tmp_path / "plain.yaml", {"plain": (checkpoints["llama"], 1)})
    plain_run = tmp_path / "plain-run"
    env = {**os.environ, "PODIUM": f"{sys.executable} -m podium.cli"}
    plain = subprocess.run(["bash", str(repo / "sbatch" / "teacher_plain.sh"), str(plain_recipe), "plain",
                            str(plain_run)], capture_output=True, text=True, env=env, timeout=60)
    assert plain.returncode == 0, plain.stderr
    plain_job = plain.stdout.strip().splitlines()[-1]
    out = tmp_path / "trainer.out"
    sub = subprocess.run(["sbatch", "--parsable", f"--output={out}",
                          f"--export=ALL,RECIPE={recipe},RUN_DIR={run_dir},PODIUM_WAIT_S=420",
                          str(repo / "sbatch" / "trainer.sbatch")],
                         capture_output=True, text=True, env=env, timeout=30)
    assert sub.returncode == 0, sub.stderr
    trainer_job = sub.stdout.strip()
    try:
        slurm_cluster.wait_for_state(trainer_job, "COMPLETED", timeout_s=480)
        text = out.read_text()
        assert '"toy_trainer"' in text and "inner" in text, text[-3000:]
        inner_job = job_ids(run_dir)["inner"]
        assert inner_job != trainer_job
        slurm_cluster.wait_for_state(inner_job, "CANCELLED", timeout_s=60)  # the trainer took it down
        podium("wait", str(plain_run), "--timeout", "420", timeout=480)
        check_logprobs(plain_run, {"plain": checkpoints["llama"]})
    finally:
        podium("down", str(plain_run), check=False)
        subprocess.run(["scancel", plain_job, trainer_job], check=False)
    slurm_cluster.wait_for_state(plain_job, "CANCELLED", timeout_s=60)


def test_trainer_sbatch_at_its_time_limit_leaves_no_teacher(slurm_cluster, slurm_jobs: list,
                                                            tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    recipe = write_recipe(tmp_path / "recipe.yaml", {"inner": (tiny_llama_checkpoint, 1)})
    run_dir = tmp_path / "run"
    out = tmp_path / "trainer.out"
    env = {**os.environ, "PODIUM": f"{sys.executable} -m podium.cli", "TRAINER": "sleep 600"}
    # A 2-minute limit, its warning 60 s ahead: the trainer is still waiting for its teacher or
    # "training" (sleep) when it comes. (With 1 minute and 30 s, a machine at load 70 had not
    # finished importing `podium up` when the warning came: no teacher was ever submitted.)
    sub = subprocess.run(["sbatch", "--parsable", "--time=2", "--signal=B:USR1@60", f"--output={out}",
                          f"--export=ALL,RECIPE={recipe},RUN_DIR={run_dir}", str(repo / "sbatch" / "trainer.sbatch")],
                         capture_output=True, text=True, env=env, timeout=30)
    assert sub.returncode == 0, sub.stderr
    trainer = sub.stdout.strip().split(";")[0]
    slurm_jobs.append(trainer)
    try:
        teacher = poll_until(lambda: job_ids(run_dir).get("inner"), timeout_s=120, interval_s=1,
                             what="the trainer's teacher job")
        slurm_jobs.append(teacher)
        poll_until(lambda: trainer in query_states([trainer]) and not query_states([trainer])[trainer].alive,
                   timeout_s=210, interval_s=1, what=f"trainer job {trainer} to end")
        states = query_states([teacher])
        assert teacher in states and not states[teacher].alive, (states, out.read_text()[-3000:])
    finally:
        podium("down", str(run_dir), check=False)


@pytest.fixture(scope="module")
def expert_teachers(slurm_cluster, tiny_qwen3_moe_checkpoint, tiny_nemotron_h_checkpoint,
                    tmp_path_factory) -> Iterator[Path]:
    """One run, brought up last: a Qwen3-MoE and a Nemotron-H teacher, each at TP1·EP2 over 2 Slurm
    nodes (one worker each: each node holds half the experts and takes its own rows), from one
    NeMo RL-style recipe, side by side on the 4 nodes."""
    root = tmp_path_factory.mktemp("experts")
    recipe = write_recipe(root / "recipe.yaml", {"moe": (tiny_qwen3_moe_checkpoint, 2),
                                                 "nemotron": (tiny_nemotron_h_checkpoint, 2)},
                          teacher_cfg={"expert_model_parallel_size": 2})
    run_dir = root / "run"
    try:
        podium("up", str(recipe), "--run-dir", str(run_dir), "--wait", "--timeout", "300")
        yield run_dir
    finally:
        podium("down", str(run_dir), check=False)


def test_moe_teacher_with_experts_on_two_nodes(expert_teachers, tiny_qwen3_moe_checkpoint) -> None:
    """A Qwen3-MoE teacher at EP2 over 2 Slurm nodes, called by podium's client and by tritonclient."""
    import tritonclient.http as triton
    from fixtures.checkpoints import hf_oracle_logprobs, random_batch

    from podium.rendezvous.records import read_record
    from podium.rendezvous.token import read_token

    run_dir = expert_teachers
    check_logprobs(run_dir, {"moe": tiny_qwen3_moe_checkpoint})
    record = read_record(next(run_dir.glob("teachers/moe-*/endpoint.json")))
    assert record.model.parallel_sizes["expert_model_parallel_size"] == 2 and record.model.data_parallel_size == 2
    data = random_batch(256, [9, 4], seed=8)
    ids = data["input_ids"].numpy()
    inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"),
              triton.InferInput("input_lengths", [2], "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(data["input_lengths"].numpy())
    http = triton.InferenceServerClient(record.url.split("//", 1)[1])
    result = http.infer("moe", inputs, headers={"Authorization": f"Bearer {read_token(run_dir / 'auth_token')}"})
    http.close()
    expected = hf_oracle_logprobs(tiny_qwen3_moe_checkpoint, data["input_ids"], data["input_lengths"]).numpy()
    assert float(abs(result.as_numpy("logprobs") - expected).max()) < 2e-3


def test_nemotron_h_teacher_serves_both_clients_equal_to_transformers(expert_teachers,
                                                                      tiny_nemotron_h_checkpoint) -> None:
    """A Nemotron-H teacher (Mamba-2, latent MoE with its expert bias, attention, MLP) at TP1·EP2 over
    2 Slurm nodes: logprobs, top-k logprobs, top-k logits and candidate logprobs through podium's
    client and through tritonclient, each within 1e-4 of transformers in fp32."""
    import torch
    import tritonclient.http as triton
    from fixtures.checkpoints import hf_oracle_log_softmax, hf_oracle_logits, random_batch

    import podium.client as pc
    from podium.rendezvous.records import read_record
    from podium.rendezvous.token import read_token

    ckpt, k, temperature, tol = tiny_nemotron_h_checkpoint, 4, 0.8, 1e-4
    run_dir = expert_teachers
    batch = random_batch(256, [13, 6, 1, 10], seq_len=13, seed=19)
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    cands = torch.randint(0, 256, (4, 13, 5), generator=torch.Generator().manual_seed(4))
    errors: dict[str, float] = {}

    def as_torch(value: Any, dtype: torch.dtype) -> torch.Tensor:  # podium's tensors or tritonclient's arrays
        return (value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value))).to(dtype)

    def check(what: str, got: Any, want: torch.Tensor, where: torch.Tensor) -> None:
        errors[what] = float((as_torch(got, torch.float32) - want)[where].abs().max())
        assert errors[what] < tol, f"{what}: max |error| {errors[what]} vs transformers fp32"

    def check_all(client: str, out: dict[str, Any], temp: float) -> None:
        """logprobs / top-k logprobs (+ their ids) in NeMo RL's alignment, top-k logits / candidate
        logprobs in the next-token one, at ``temp``; only the positions each defines."""
        full = hf_oracle_log_softmax(ckpt, ids, lengths, temperature=temp)
        scored = (torch.arange(13)[None, :] < lengths[:, None]) & (torch.arange(13)[None, :] > 0)
        nxt = torch.arange(13)[None, :] < (lengths[:, None] - 1)
        if "logprobs" in out:
            check(f"{client} logprobs", out["logprobs"], full.gather(-1, ids[..., None])[..., 0], scored)
        if "topk_logprobs" in out:
            check(f"{client} top-k logprobs", out["topk_logprobs"], torch.topk(full, k, dim=-1).values, scored)
            picked = full.gather(-1, as_torch(out["topk_indices"], torch.long))
            check(f"{client} top-k logprobs' ids", out["topk_logprobs"], picked, scored)
        if "topk_logits" in out:
            logits = hf_oracle_logits(ckpt, ids, lengths, temperature=temp)
            check(f"{client} top-k logits", out["topk_logits"], torch.topk(logits, k, dim=-1).values, nxt)
            picked = logits.gather(-1, as_torch(out["topk_logit_indices"], torch.long))
            check(f"{client} top-k logits' ids", out["topk_logits"], picked, nxt)
            check(f"{client} candidate logprobs", out["candidate_logprobs"],
                  torch.log_softmax(logits, dim=-1).gather(-1, cands), nxt)

    record = read_record(next(run_dir.glob("teachers/nemotron-*/endpoint.json")))
    assert record.model.parallel_sizes["expert_model_parallel_size"] == 2 and record.model.data_parallel_size == 2
    with pc.connect(run_dir / "rendezvous.json") as client:
        check_all("podium", client.get_logprobs("nemotron", batch, top_k=k), 1.0)
        top = client.get_topk_logits("nemotron", batch, k, temperature=temperature)
        check_all("podium", {"topk_logits": top["topk_logits"], "topk_logit_indices": top["topk_indices"],
                             **client.get_candidate_logprobs("nemotron", batch, cands, temperature=temperature)},
                  temperature)

    inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"),
              triton.InferInput("input_lengths", [4], "INT64"),
              triton.InferInput("candidate_ids", list(cands.shape), "INT64")]
    for tensor, value in zip(inputs, (ids, lengths, cands), strict=True):
        tensor.set_data_from_numpy(value.numpy())
    names = ("logprobs", "topk_logprobs", "topk_indices", "topk_logits", "topk_logit_indices", "candidate_logprobs")
    http = triton.InferenceServerClient(record.url.split("//", 1)[1])
    result = http.infer("nemotron", inputs, outputs=[triton.InferRequestedOutput(n) for n in names],
                        parameters={"top_k": k, "temperature": temperature},
                        headers={"Authorization": f"Bearer {read_token(run_dir / 'auth_token')}"})
    http.close()
    check_all("tritonclient", {n: result.as_numpy(n) for n in names}, temperature)
    print("Nemotron-H through podium up, max |error| vs transformers fp32:", errors)
    assert len(errors) == 12
