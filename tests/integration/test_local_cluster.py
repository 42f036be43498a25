"""``cluster: local`` end to end, as a user runs it: ``podium up --wait`` from a script that captures
its output, ``status``, a trainer call checked against transformers (at the recipe's temperature) and NeMo RL's
MOPD fan-out on ``podium.nemo_rl``'s groups, ``logs``, ``down``; a Qwen3-MoE teacher at EP2 called by
podium's client and by ``tritonclient``; and the
README's first command, ``podium demo``.

No Slurm: submitit's local controller runs the same node entry, Ray head and Megatron group.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

import podium.nemo_rl
from endpoint.nemo_rl_callers import TrajectoryCollector, pad_to_multiple
from fixtures.checkpoints import hf_oracle_logprobs, random_batch
from launcher_helpers import RAY_PORTS
from podium.launcher.cleanup import run_processes
from podium.launcher.run_dir import known_teachers
from podium.rendezvous.token import read_token

TOL = 2e-3
TEMPERATURE = 0.9


def podium_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The CLI with its stdout/stderr captured through pipes, as `out=$(podium ...)` does: it must
    return (and its pipes close) although the teachers it started keep running."""
    return subprocess.run([sys.executable, "-m", "podium.cli", *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def test_local_up_wait_through_pipes_status_logs_down(tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""\
policy:
  generation: {{temperature: {TEMPERATURE}}}
on_policy_distillation:
  teacher_model_by_agent_name: {{math: {tiny_llama_checkpoint}, code: {tiny_llama_checkpoint}}}
  non_colocated_teachers:
    default_teacher_cfg: {{num_nodes: 1, gpus_per_node: 1, precision: fp32}}
podium:
  cluster: local
  run_dir: {run_dir}
  slurm: {{gpus: false}}
  ray: {{port_range: {RAY_PORTS}, object_store_memory_mb: 100}}
  server: {{heartbeat_s: 2, stale_after_s: 10}}
""")
    try:
        up = podium_cli("up", str(recipe), "--wait", "--timeout", "300")
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        assert "math: submitted job" in up.stdout and "all teachers ready" in up.stdout

        status = podium_cli("status", str(run_dir), "--json")
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)
        assert row["ready"] and row["cluster"] == "local" and row["aliases"] == ["math", "code"]
        assert row["temperature"] == TEMPERATURE  # the policy's, which NeMo RL's teachers inherit

        data = random_batch(256, [5, 9, 2], seed=3)
        with podium.connect(run_dir / "rendezvous.json", ready_timeout_s=60) as client:
            got = client.get_logprobs("code", data)["logprobs"]
        expected = hf_oracle_logprobs(tiny_llama_checkpoint, data["input_ids"], data["input_lengths"], TEMPERATURE)
        assert float(np.abs(got.numpy() - expected.numpy()).max()) < TOL

        # NeMo RL's MOPD fan-out on what podium.nemo_rl hands it for this recipe
        opd = OmegaConf.load(recipe)["on_policy_distillation"]
        groups, alias_to_group_alias = podium.nemo_rl.teacher_worker_groups(run_dir / "rendezvous.json", opd)
        assert list(groups) == ["math"] and alias_to_group_alias == {"math": "math", "code": "math"}
        collector = TrajectoryCollector(groups, alias_to_group_alias, opd, policy_make_seq_div_by=4)
        ids = pad_to_multiple(data["input_ids"], collector.pad_multiple)
        out = collector.compute_teacher_logprobs(ids, ["code", "math", "code"], data["input_lengths"].int())
        assert float(np.abs(out[:, :9].numpy() - expected.numpy()).max()) < TOL and not out[:, 9:].any()

        # Still serving a few heartbeats later: nothing (the watchdog, say) takes a healthy local
        # teacher for a broken one.
        record = next(run_dir.glob("teachers/*/endpoint.json"))
        beats = {json.loads(record.read_text())["heartbeat_at"]}
        deadline = time.monotonic() + 120
        while len(beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            beats.add(json.loads(record.read_text())["heartbeat_at"])
        (row,) = json.loads(podium_cli("status", str(run_dir), "--json").stdout)
        assert len(beats) >= 3 and row["ready"] and row["status"] == "ready", row

        logs = podium_cli("logs", str(run_dir), "math")
        assert logs.returncode == 0, logs.stderr
        assert f"teacher 'math' ready at {row['url']}" in logs.stdout  # the node task's own log
        assert "_0_log.err <==" in logs.stdout
        missing = podium_cli("logs", str(run_dir), "nope")
        assert missing.returncode == 2 and "no teacher 'nope'" in missing.stderr and "math" in missing.stderr
    finally:
        down = podium_cli("down", str(run_dir))
    assert down.returncode == 0 and "stopped: math" in down.stdout, down.stderr
    for _, files in known_teachers(run_dir):
        assert run_processes(files) == {}  # every process the job started has ended


def test_local_moe_teacher_at_ep2_serves_podium_client_and_tritonclient(tiny_qwen3_moe_checkpoint: Path,
                                                                       tmp_path: Path) -> None:
    """A Qwen3-MoE teacher with its experts split over two workers (EP2), through ``podium up``."""
    import tritonclient.http as triton

    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""\
on_policy_distillation:
  teacher_model_by_agent_name: {{moe: {tiny_qwen3_moe_checkpoint}}}
  non_colocated_teachers:
    default_teacher_cfg: {{num_nodes: 1, gpus_per_node: 2, expert_model_parallel_size: 2, precision: fp32}}
podium:
  cluster: local
  run_dir: {run_dir}
  slurm: {{gpus: false}}
  ray: {{port_range: {RAY_PORTS}, object_store_memory_mb: 100}}
""")
    try:
        up = podium_cli("up", str(recipe), "--wait", "--timeout", "300")
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        data = random_batch(256, [7, 12, 3], seed=5)
        expected = hf_oracle_logprobs(tiny_qwen3_moe_checkpoint, data["input_ids"], data["input_lengths"]).numpy()
        with podium.connect(run_dir / "rendezvous.json", ready_timeout_s=60) as client:
            got = client.get_logprobs("moe", data)["logprobs"].numpy()
            record = client.teacher("moe").record
        assert float(np.abs(got - expected).max()) < TOL
        assert record.model.data_parallel_size == 2  # TP1 on 2 workers: attention data-parallel, experts split
        assert record.model.parallel_sizes["expert_model_parallel_size"] == 2
        token = read_token(run_dir / "auth_token")
        http = triton.InferenceServerClient(record.url.split("//", 1)[1])
        ids = data["input_ids"].numpy()
        inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"), triton.InferInput("input_lengths", [3], "INT64")]
        inputs[0].set_data_from_numpy(ids)
        inputs[1].set_data_from_numpy(data["input_lengths"].numpy())
        result = http.infer("moe", inputs, headers={"Authorization": f"Bearer {token}"})
        assert float(np.abs(result.as_numpy("logprobs") - expected).max()) < TOL
        http.close()
    finally:
        down = podium_cli("down", str(run_dir))
    assert down.returncode == 0, down.stderr
    for _, files in known_teachers(run_dir):
        assert run_processes(files) == {}


def test_demo_the_readme_first_command(tmp_path: Path) -> None:
    keep = tmp_path / "demo"
    demo = podium_cli("demo", "--keep", str(keep), "--timeout", "400", timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "all aliases match" in demo.stdout and "brought everything down" in demo.stdout
    for alias in ("math", "code", "chat"):
        assert f"│ {alias}" in demo.stdout  # one row per alias in the table
    for _, files in known_teachers(keep / "run"):
        assert run_processes(files) == {}
