"""``cluster: local`` end to end, as a user runs it: ``podium up --wait`` from a script that captures
its output (with a NeMo RL recipe's ``gpus_per_node: 2`` on a machine without CUDA, GPUs hidden on a
GPU node: on CPU, said once), ``status``, a trainer call checked against transformers (at the recipe's
temperature) and NeMo RL's MOPD fan-out on ``podium.nemo_rl``'s groups, ``logs``, ``down``; a Qwen3-MoE
teacher at EP2 called by podium's client and by ``tritonclient``; and the README's first command,
``podium demo``.

No Slurm: submitit's local controller runs the same node entry, Ray head and Megatron group.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from fixtures.checkpoints import hf_oracle_logprobs, random_batch
from harness.cli import podium as cli
from harness.cli import podium_cli
from harness.nemo_rl_callers import TrajectoryCollector, pad_to_multiple
from harness.recipes import RAY_PORTS
from omegaconf import OmegaConf

import podium.nemo_rl
from podium.launcher.common.cleanup import run_processes
from podium.launcher.common.devices import cuda_device_count
from podium.launcher.job.ray_bootstrap import START_LIMIT_MARK, STARTED_MARK
from podium.launcher.login.run_dir import known_teachers
from podium.rendezvous.token import read_token

TOL = 2e-3
TEMPERATURE = 0.9


def _pipe_inodes(proc: subprocess.Popen) -> set[str]:
    """``pipe:[inode]`` of the pipes this test handed ``proc`` as its stdin/stdout/stderr."""
    return {os.readlink(f"/proc/self/fd/{stream.fileno()}") for stream in (proc.stdin, proc.stdout, proc.stderr)}


def _holders(links: set[str]) -> list[str]:
    """Processes other than this one with a descriptor on one of ``links`` (``pipe:[inode]``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in links:
                    found.append(f"{pid} ({Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}) fd {fd}")
            except OSError:
                pass
    return found


def podium_up_through_pipes(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``podium up --wait`` with pipes on stdin, stdout and stderr (``out=$(podium up --wait ...)``,
    a Python script's ``capture_output``): it must return and its pipes reach end of file (the
    timeout turns a regression into a failure, not a hang). Also returns the processes that still
    hold one of the three pipes afterwards (the teachers it started must hold none)."""
    proc = subprocess.Popen([sys.executable, "-m", "podium.cli", "up", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    links = _pipe_inodes(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"`podium up` through pipes did not return (or its pipes did not close) within "
                             f"{timeout:.0f}s; still holding them: {_holders(links)}\n{out}\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), _holders(links)


CPU_NOTICE = "runs on CPU: no CUDA device found on this machine"


def test_local_up_wait_through_pipes_status_logs_down(no_cuda: None, tiny_llama_checkpoint: Path,
                                                      tmp_path: Path) -> None:
    """A NeMo RL recipe as shipped (``gpus_per_node: 2``, GPUs requested) on ``cluster: local`` on a
    machine without CUDA: the teacher runs on two CPU workers, ``up`` says so once, and ``up --wait``
    through pipes returns with nothing it started holding them.

    ``no_cuda`` hides the GPUs of a GPU node, as on a machine that has none: ``CUDA_VISIBLE_DEVICES``
    empty, which ``up``, its node task and Ray inherit. Ray refuses ``--num-gpus=2`` then (unset, it
    would fake two GPUs), so the recipe's GPUs must not reach ``ray start``."""
    assert cuda_device_count() == 0, "no_cuda hides every CUDA device from what this test starts"
    run_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""\
policy:
  generation: {{temperature: {TEMPERATURE}}}
on_policy_distillation:
  teacher_model_by_agent_name: {{math: {tiny_llama_checkpoint}, code: {tiny_llama_checkpoint}}}
  non_colocated_teachers:
    default_teacher_cfg: {{num_nodes: 1, gpus_per_node: 2, precision: fp32}}
podium:
  cluster: local
  run_dir: {run_dir}
  ray: {{port_range: {RAY_PORTS}, object_store_memory_mb: 100}}
  server: {{heartbeat_s: 2, stale_after_s: 10}}
""")
    try:
        up, holders = podium_up_through_pipes(str(recipe), "--wait", "--timeout", "300", timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        assert "math: submitted job" in up.stdout and "all teachers ready" in up.stdout
        assert holders == []  # stdin included: the teachers hold none of their caller's pipes
        assert up.stderr.count(CPU_NOTICE) == 1, up.stderr[-3000:]
        print(next(line for line in up.stderr.splitlines() if CPU_NOTICE in line))  # shown with -rP

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
        # the load figures come from the endpoint's /metrics: the 3 + 3 rows served above
        load = row["load"]
        assert load["requests"] == 2 and load["errors"] == 0 and load["queue_depth"] == 0, load
        assert load["tokens_per_s_1m"] > 0 and 0 <= load["padding_share"] < 0.5, load
        assert load["bytes_out_per_s_1m"] > 0, load  # the answers' bytes per second, per teacher

        logs = podium_cli("logs", str(run_dir), "math")
        assert logs.returncode == 0, logs.stderr
        assert f"teacher 'math' ready at {row['url']}" in logs.stdout  # the node task's own log
        assert "--num-gpus=0" in logs.stdout  # Ray was offered no GPU: two CPU worker slots
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
        inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"),
                  triton.InferInput("input_lengths", [3], "INT64")]
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


def _math_recipe(path: Path, checkpoint: Path, run_dir: Path, settings: str = "") -> Path:
    """A one-teacher local recipe (alias ``math``, one node, CPU) with its run dir (``settings``:
    more lines of its ``podium:`` section)."""
    path.write_text(f"""\
on_policy_distillation:
  teacher_model_by_agent_name: {{math: {checkpoint}}}
  non_colocated_teachers:
    default_teacher_cfg: {{num_nodes: 1, gpus_per_node: 1, precision: fp32}}
podium:
  cluster: local
  run_dir: {run_dir}
  slurm: {{gpus: false}}
  ray: {{port_range: {RAY_PORTS}}}
{settings}""")
    return path


def test_a_teacher_whose_warm_up_forward_hangs_never_becomes_ready_and_its_record_names_the_rank(
        tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """Its worker freezes in the warm-up forward that comes before ready (injected: the rank stops
    itself): the watch fails the start after ``server.stuck_after_s``, the teacher is never ready,
    and the record (what ``status`` shows) names the rank and the setting to raise."""
    run_dir = tmp_path / "run"
    recipe = _math_recipe(tmp_path / "recipe.yaml", tiny_llama_checkpoint, run_dir,
                          "  server: {stuck_after_s: 10}\n  restart: {max_consecutive_failures: 1}\n")
    env = {**os.environ, "PODIUM_FAULTS": "freeze_call_rank=0"}
    try:
        up = subprocess.run([sys.executable, "-m", "podium.cli", "up", str(recipe), "--wait", "--timeout", "300"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=env)
        assert up.returncode == 1, up.stdout + up.stderr[-3000:]
        assert "ready" not in [line.split(": ")[-1].split(" ")[0] for line in up.stdout.splitlines()], up.stdout
        (row,) = json.loads(podium_cli("status", str(run_dir), "--json").stdout)
        print(row["reason"])
        assert row["status"] == "failed" and not row["ready"] and "ready" not in row["timings"], row
        assert "stuck warm-up forward: no progress for" in row["reason"], row["reason"]
        assert re.search(r"rank 0 \([0-9.]+, pid \d+\) has not finished micro-batch 1 of 1", row["reason"])
        assert "server.stuck_after_s is 10 s: raise it" in row["reason"], row["reason"]
    finally:
        down = podium_cli("down", str(run_dir))
    assert down.returncode == 0, down.stderr
    for _, files in known_teachers(run_dir):
        assert run_processes(files) == {}


def test_local_ray_start_dies_up_prints_its_cause_and_log(tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """The head's own ``ray start`` dies (an argument it refuses, injected): the head notices at
    once, and what ``up --wait`` prints in one line is the cause from that process's log with the
    log's path, not a timeout."""
    run_dir = tmp_path / "run"
    recipe = _math_recipe(tmp_path / "recipe.yaml", tiny_llama_checkpoint, run_dir)
    # Ray's own refusal of a 1 MiB object store, from deep in a traceback of `ray start`
    cause = "ValueError: Attempting to cap object store memory usage at 1048576 bytes"
    env = {**os.environ, "PODIUM_FAULTS": "ray_start_args=--object-store-memory=1048576"}
    try:
        up = subprocess.run([sys.executable, "-m", "podium.cli", "up", str(recipe), "--wait", "--timeout", "300"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=env)
        assert up.returncode == 1, up.stdout + up.stderr[-3000:]
        (ray_log,) = run_dir.glob("teachers/*/nodes/*/0.ray-start.log")
        (error,) = [line for line in up.stderr.splitlines() if line.startswith("podium: error:")]
        print(error)  # what a user reads (shown with -rP)
        assert cause in error and f"log {ray_log}" in error, up.stderr[-3000:]
        assert "`ray start` (pid " in error and "exited with 1" in error  # what died, not a timeout
        assert "within" not in error and "timed out" not in error.lower()
        (row,) = json.loads(podium_cli("status", str(run_dir), "--json").stdout)
        assert row["status"] == "failed" and cause in row["reason"] and "\n" not in row["reason"]
    finally:
        down = podium_cli("down", str(run_dir))
    assert down.returncode == 0, down.stderr
    for _, files in known_teachers(run_dir):
        assert run_processes(files) == {}


def test_a_head_whose_ray_missed_rays_start_limits_starts_it_again(tiny_llama_checkpoint: Path,
                                                                   tmp_path: Path) -> None:
    """The head's first ``ray start`` has a dashboard agent too slow for the raylet's fixed 15 s
    wait (a starved node's, injected: the agent sleeps 20 s before it starts), and so ends as Ray's
    start limits end it. The node ends that try and starts Ray again, in the same generation (no
    requeue, no failure counted), and serves; its log says why in one line, naming the raylet's
    cause that ``ray start`` alone hides."""
    run_dir = tmp_path / "run"
    recipe = _math_recipe(tmp_path / "recipe.yaml", tiny_llama_checkpoint, run_dir)
    env = {**os.environ, "PODIUM_FAULTS": "slow_ray_agent_rank=0"}
    try:
        up = subprocess.run([sys.executable, "-m", "podium.cli", "up", str(recipe), "--wait", "--timeout", "400"],
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600, env=env)
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        (row,) = json.loads(podium_cli("status", str(run_dir), "--json").stdout)
        assert row["ready"] and not row["restarts"] and row["generation"].endswith(":0"), row
        (generation,) = run_dir.glob("teachers/*/nodes/*-0")
        assert json.loads((generation / "0.json").read_text())["ray_attempt"] == 2
        assert START_LIMIT_MARK in (generation / "0.ray-start.log").read_text()
        assert STARTED_MARK in (generation / "0.ray-start-2.log").read_text()
        logs = "".join(path.read_text(errors="replace") for path in run_dir.glob("teachers/*/**/*_0_log.*"))
        (line,) = [line for line in logs.splitlines() if "starting its Ray again" in line]
        print(line)  # what a user reads in the task's log (shown with -rP)
        assert "(try 2 of 3)" in line and "Exception: The current node timed out during startup" in line
        assert "its raylet gave up waiting for the node's dashboard agent" in line
        assert f"log {generation / '0.ray-start.log'}" in line
    finally:
        down = podium_cli("down", str(run_dir))
    assert down.returncode == 0, down.stderr
    for _, files in known_teachers(run_dir):
        assert run_processes(files) == {}


def test_a_recipe_names_its_run_and_every_alias_its_teacher(tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """What a user types after ``up``, on a real local teacher: the recipe stands for its run dir
    (``status``, ``logs``, ``down`` of the recipe; the default run dir, no ``--run-dir``), a second
    alias names the teacher, ``status`` at 100 columns keeps the URL and the aliases whole, the
    CLI's output is its own (no INFO log lines), ``status --watch`` works as a flag, and ``down`` of
    a path that holds no run is an error, not "stopped: nothing"."""
    recipe = tmp_path / "mopd.yaml"
    recipe.write_text(f"""\
on_policy_distillation:
  teacher_model_by_agent_name: {{math_with_judge_simple_agent: {tiny_llama_checkpoint}, code: {tiny_llama_checkpoint}}}
  non_colocated_teachers:
    default_teacher_cfg: {{num_nodes: 1, gpus_per_node: 1, precision: fp32}}
podium:
  cluster: local
  slurm: {{gpus: false}}
  ray: {{port_range: {RAY_PORTS}, object_store_memory_mb: 100}}
  server: {{heartbeat_s: 2, stale_after_s: 10}}
""")
    env = {"PODIUM_RUNS_DIR": str(tmp_path / "runs"), "COLUMNS": "100"}
    try:
        up = cli("up", str(recipe), "--wait", "--timeout", "300", env=env, check=False)
        assert up.returncode == 0, up.stdout + up.stderr[-3000:]
        assert not [line for line in up.stderr.splitlines() if line.startswith("INFO ")], up.stderr
        (run_dir,) = (tmp_path / "runs").iterdir()

        status = cli("status", str(recipe), env=env)
        print(status.stdout)  # what a user reads at 100 columns (shown with -rP)
        assert f"its run dir is {run_dir}" in status.stderr
        (row,) = json.loads(cli("status", str(recipe), "--json", env=env).stdout)
        lines = status.stdout.splitlines()
        assert any(row["url"] in line for line in lines), status.stdout
        assert "math_with_judge_simple_agent serves: math_with_judge_simple_agent, code" in lines, status.stdout

        logs = cli("logs", str(recipe), "code", env=env)  # the teacher's second alias
        assert "teacher 'math_with_judge_simple_agent' ready at" in logs.stdout

        watch = subprocess.Popen([sys.executable, "-m", "podium.cli", "status", str(run_dir), "--watch"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, **env})
        time.sleep(5)
        watch.send_signal(signal.SIGINT)
        out, err = watch.communicate(timeout=60)
        assert watch.returncode == 0 and out.count("podium status (") >= 2, out + err  # a table every 2 s

        nothing = cli("down", str(tmp_path / "no" / "such" / "dir"), check=False)
        assert nothing.returncode == 2 and "is not a podium run dir" in nothing.stderr, nothing.stdout
    finally:
        down = cli("down", str(recipe), env=env, check=False)
    assert down.returncode == 0 and down.stdout == "stopped: math_with_judge_simple_agent\n", down.stdout + down.stderr
    for _, files in known_teachers(run_dir):
        assert run_processes(files) == {}  # every process the job started has ended
    (row,) = json.loads(cli("status", str(run_dir), "--json", check=False).stdout)
    assert row["status"] == "stopped" and row["slurm_state"] == "COMPLETED", row
