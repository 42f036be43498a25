"""Hub ids, as NeMo RL's recipes name them, resolved on the login node as the nodes will, the way a
user meets it: the CLI as a subprocess in a Python that cannot import huggingface_hub, torch,
megatron-core, transformers or Ray (a login node's ``pip install podium``), on NeMo RL's Qwen3 MOPD
recipe (its teacher is ``Qwen/Qwen3-1.7B``), with a real HF cache layout made here (never a
download: ``fixtures.hub_cache.write_snapshot``).

- in the cache: ``plan`` shows the id with the snapshot it pinned and the needs of that checkpoint;
  the spec carries the commit (``revision``), part of the teacher's key;
- not in the cache: ``plan`` and ``up --dry-run`` refuse (exit 2, the same words) naming the key
  path, the id, the cache searched and the command that fetches it; ``doctor`` fails its row with
  it; ``HF_HUB_OFFLINE`` is said and turned off in the command;
- ``main`` moving after the plan: the spec keeps the pinned snapshot, a new plan pins the new one
  (another key); local paths keep the keys they had;
- a checkpoint folder with a ``config.json`` but no weights (or only some shards) is refused naming
  what is missing;
- the cache folder and the snapshot are where huggingface_hub itself finds them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.hub_cache import commit_of, write_snapshot

from podium.config.checkpoints import hub_cache_dir, hub_offline, hub_snapshot
from podium.config.plan import load_plan
from podium.config.spec import TeacherSpec

OPD = "on_policy_distillation"
BLOCK = f"{OPD}.non_colocated_teachers.default_teacher_cfg"
ENTRY = f"{OPD}.teacher_model_by_agent_name.default_teacher"
QWEN3 = Path("examples/configs/recipes/llm/mopd-qwen3-1.7b-3n8g-megatron-pack.yaml")
HUB_ID = "Qwen/Qwen3-1.7B"
FOLDER = "models--Qwen--Qwen3-1.7B"
WITHOUT = ("huggingface_hub", "torch", "megatron", "megatron.core", "transformers", "ray")
HF_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
           "XDG_CACHE_HOME")


def login_env(hf_home: Path, **extra: str) -> dict[str, str]:
    """This environment with ``HF_HOME`` (only) naming the cache: what a login node's shell exports."""
    env = {k: v for k, v in os.environ.items() if k not in HF_VARS}
    return {**env, "HF_HOME": str(hf_home), "COLUMNS": "250", **extra}


def podium(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess:
    """``podium *args`` in a Python without huggingface_hub, torch, megatron-core, transformers, Ray."""
    code = (f"import sys; sys.modules.update(dict.fromkeys({WITHOUT!r})); "
            "from podium.cli import main; sys.argv[0] = 'podium'; main()")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=240, env=env)


def recipe(tmp_path: Path, nemo_rl_configs: Path, text: str = "") -> Path:
    """NeMo RL's Qwen3 MOPD recipe (its teacher: Qwen/Qwen3-1.7B), ``text`` over it."""
    path = tmp_path / "recipe.yaml"
    path.write_text(f"defaults: {nemo_rl_configs / QWEN3}\n" + textwrap.dedent(text))
    return path


@pytest.fixture
def hf_home(tmp_path: Path, tiny_qwen3_checkpoint: Path) -> Path:
    """An HF_HOME whose hub cache holds Qwen/Qwen3-1.7B: the tiny Qwen3 (4 heads, 2 KV groups)."""
    home = tmp_path / "hf"
    write_snapshot(home / "hub", HUB_ID, tiny_qwen3_checkpoint)
    return home


def test_a_hub_id_in_the_cache_is_planned_with_its_pinned_snapshot_and_its_needs(
        nemo_rl_configs: Path, tmp_path: Path, hf_home: Path) -> None:
    commit = commit_of(HUB_ID)
    snapshot = hf_home / "hub" / FOLDER / "snapshots" / commit
    at_tp4 = recipe(tmp_path, nemo_rl_configs, f"""\
        {OPD}:
          non_colocated_teachers:
            default_teacher_cfg: {{tensor_model_parallel_size: 4}}
        """)
    shown = podium(login_env(hf_home), "plan", at_tp4)
    assert shown.returncode == 0, shown.stderr
    assert f"{HUB_ID} (HF cache @ {commit[:12]})" in shown.stdout, shown.stdout
    assert f"checkpoint: {HUB_ID} pinned at snapshot {commit} ({snapshot})" in shown.stdout, shown.stdout
    # what the tiny Qwen3's config.json asks of TP4, as `plan` says it for a local directory
    needs = "attention: 2 KV group(s) (num_key_value_heads) for TP4: supported"
    assert f"needs: {needs}" in shown.stdout, shown.stdout
    (teacher,) = json.loads(podium(login_env(hf_home), "plan", at_tp4, "--json").stdout)["teachers"]
    assert teacher["model_name"] == HUB_ID and teacher["revision"] == commit
    assert any(line.startswith(needs) for line in teacher["needs"]), teacher["needs"]
    run = tmp_path / "run"
    dry = podium(login_env(hf_home), "up", at_tp4, "--dry-run", "--run-dir", run)
    assert dry.returncode == 0 and not run.exists(), dry.stderr


def test_a_hub_id_not_in_the_cache_is_refused_naming_it_the_cache_and_the_command(
        nemo_rl_configs: Path, tmp_path: Path) -> None:
    home = tmp_path / "hf"
    env = login_env(home)
    expected = (f"podium: error: {ENTRY}: checkpoint {HUB_ID}: a hub id not in the local HF cache {home}/hub "
                f"(no {FOLDER}); podium does not download weights: fetch it into the cache the nodes read, on a "
                f"login node with network access: `HF_HOME={home} hf download {HUB_ID}`\n")
    plan = podium(env, "plan", nemo_rl_configs / QWEN3)
    up = podium(env, "up", nemo_rl_configs / QWEN3, "--dry-run", "--run-dir", tmp_path / "run")
    assert plan.returncode == up.returncode == 2, (plan.stderr, up.stderr)
    assert up.stdout == "" and plan.stderr == up.stderr == expected, plan.stderr
    # the plan is still shown (a run can be sized before terabytes are copied), the hub id marked
    assert f"{HUB_ID} (hub id, not in the HF cache)" in plan.stdout, plan.stdout
    # with the other problems of a recipe: all at once
    typo = recipe(tmp_path, nemo_rl_configs, f"{OPD}:\n  non_colocated_teachers:\n    default_teacher_cfg:\n"
                                             "      precison: fp32\n")
    both = podium(env, "plan", typo).stderr
    assert both.startswith("podium: error: 2 problems:\n") and f"  {expected.removeprefix('podium: error: ')}" in both
    # doctor: the checkpoints row fails with the same words and says how to fix it
    local = recipe(tmp_path, nemo_rl_configs, "podium: {cluster: local}\n")
    doctor = podium(env, "doctor", local, f"{BLOCK}.gpus_per_node=1", f"{BLOCK}.tensor_model_parallel_size=1",
                    "--run-dir", tmp_path / "run", "--json")
    assert doctor.returncode == 1, doctor.stderr
    (row,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "checkpoints"]
    assert row["state"] == "fail" and row["detail"] == expected.removeprefix("podium: error: ").rstrip("\n")
    assert "fetch its hub ids into the HF cache the nodes read" in row["fix"]
    # a cache with the repo but no refs/main (fetched at a commit) says what it has
    write_snapshot(home / "hub", HUB_ID, commit="0" * 40)
    (home / "hub" / FOLDER / "refs" / "main").unlink()
    assert f"(no {FOLDER}/refs/main (snapshots: {'0' * 40})); " in podium(env, "plan", nemo_rl_configs / QWEN3).stderr


def test_hf_hub_cache_and_hf_hub_offline_are_respected(nemo_rl_configs: Path, tmp_path: Path, hf_home: Path) -> None:
    """HF_HUB_CACHE wins over HF_HOME (as for huggingface_hub); offline, a cached id plans as before
    (nothing is asked of the network) and the fetch command turns offline mode off."""
    elsewhere = tmp_path / "shared" / "hub"
    shutil.copytree(hf_home / "hub", elsewhere, symlinks=True)
    offline = login_env(tmp_path / "empty", HF_HUB_CACHE=str(elsewhere), HF_HUB_OFFLINE="1")
    planned = podium(offline, "plan", nemo_rl_configs / QWEN3, "--json")
    assert planned.returncode == 0, planned.stderr
    assert json.loads(planned.stdout)["teachers"][0]["revision"] == commit_of(HUB_ID)
    missing = login_env(tmp_path / "empty", HF_HUB_CACHE=str(tmp_path / "none"), HF_HUB_OFFLINE="1")
    refused = podium(missing, "plan", nemo_rl_configs / QWEN3)
    assert refused.returncode == 2 and refused.stderr.endswith(
        f"`HF_HUB_OFFLINE=0 HF_HUB_CACHE={tmp_path}/none hf download {HUB_ID}` (HF_HUB_OFFLINE is set here)\n"
    ), refused.stderr


def test_the_spec_keeps_the_pinned_snapshot_when_main_moves(
        nemo_rl_configs: Path, tmp_path: Path, hf_home: Path, tiny_qwen3_checkpoint: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    first = commit_of(HUB_ID)
    (before,) = load_plan(nemo_rl_configs / QWEN3).teachers
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(before.to_json()))  # what `up` writes for every node
    second = commit_of(HUB_ID, 1)
    write_snapshot(hf_home / "hub", HUB_ID, tiny_qwen3_checkpoint, commit=second)  # a newer download: main moves
    kept = TeacherSpec.read(spec_file)
    assert kept.revision == before.revision == first
    (after,) = load_plan(nemo_rl_configs / QWEN3).teachers
    assert after.revision == second and after.key != before.key  # other files: another teacher
    assert hub_snapshot(HUB_ID, kept.revision).path == hf_home / "hub" / FOLDER / "snapshots" / first
    # the CLI says the same: the new plan pins the new commit
    planned = json.loads(podium(login_env(hf_home), "plan", nemo_rl_configs / QWEN3, "--json").stdout)
    assert planned["teachers"][0]["revision"] == second and planned["teachers"][0]["key"] == after.key


def test_local_paths_keep_the_keys_they_had(tmp_path: Path) -> None:
    """Keys of teachers named by local paths, as podium computed them before hub ids were pinned."""
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(f"""\
        {OPD}:
          teacher_model_by_agent_name: {{math: /ckpt/math, code: /ckpt/code}}
          non_colocated_teachers:
            default_teacher_cfg: {{tensor_model_parallel_size: 2, num_nodes: 1, gpus_per_node: 8, precision: bf16}}
            teacher_overrides:
              code: {{fp32_lm_head: true}}
        podium:
          cluster: slurm
        """))
    plan = load_plan(path)
    assert [(t.name, t.key, t.revision) for t in plan.teachers] == [("math", "8032bfd4f8e7", None),
                                                                   ("code", "628f367ea4c2", None)]


def test_a_checkpoint_folder_without_its_weights_is_refused_naming_what_is_missing(
        nemo_rl_configs: Path, tmp_path: Path, tiny_llama_sharded_checkpoint: Path, hf_home: Path) -> None:
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(tiny_llama_sharded_checkpoint / "config.json", config_only)
    binary = tmp_path / "bin"
    shutil.copytree(config_only, binary)
    (binary / "pytorch_model.bin").write_bytes(b"weights")
    partial = tmp_path / "partial"
    shutil.copytree(tiny_llama_sharded_checkpoint, partial)
    shards = sorted(p.name for p in partial.glob("model-*.safetensors"))
    (partial / shards[-1]).unlink()  # a copy that did not finish
    text = f"""\
        {OPD}:
          teacher_model_by_agent_name: {{default_teacher: {config_only}, b: {binary}, c: {partial}}}
        """
    refused = podium(login_env(hf_home), "plan", recipe(tmp_path, nemo_rl_configs, text))
    assert refused.returncode == 2, refused.stderr
    neither = ("is neither an HF directory (config.json + model.safetensors or model.safetensors.index.json) nor "
               "a Megatron torch_dist checkpoint (metadata.json, or latest_checkpointed_iteration.txt naming an "
               "iteration)")
    assert refused.stderr == "podium: error: 3 problems:\n" + "".join(f"  {line}\n" for line in (
        f"{ENTRY}: checkpoint {config_only} {neither}: it holds config.json but no weights (neither "
        "model.safetensors nor model.safetensors.index.json)",
        f"{OPD}.teacher_model_by_agent_name.b: checkpoint {binary} {neither}: it holds config.json and "
        "pytorch_model.bin, but podium reads safetensors weights only (model.safetensors or "
        "model.safetensors.index.json): save the model again with safe_serialization=True",
        f"{OPD}.teacher_model_by_agent_name.c: checkpoint {partial}: model.safetensors.index.json names 1 weight "
        f"file(s) that are not there: {shards[-1]} (a download or copy that did not finish?)",
    )), refused.stderr
    # a hub snapshot whose blob is gone (an interrupted download) is refused alike
    snapshot = hf_home / "hub" / FOLDER / "snapshots" / commit_of(HUB_ID)
    (snapshot / "model.safetensors").resolve().unlink()
    hub = podium(login_env(hf_home), "plan", nemo_rl_configs / QWEN3)
    assert hub.returncode == 2 and f"checkpoint {snapshot} {neither}: it holds config.json but no weights" in hub.stderr


@pytest.mark.parametrize("env", [
    {},
    {"HF_HOME": "~/hf"},
    {"XDG_CACHE_HOME": "/xdg"},
    {"HF_HOME": "/h", "HUGGINGFACE_HUB_CACHE": "/legacy"},
    {"HF_HOME": "/h", "HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HUB_CACHE": "/new"},
    {"HF_HUB_OFFLINE": "1"},
    {"HF_HUB_OFFLINE": "yes"},
    {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"},
    {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "true"},
])
def test_the_cache_folder_and_offline_mode_are_huggingface_hubs(env: dict[str, str]) -> None:
    """podium reads the layout itself (a light install has no huggingface_hub): its rule is the
    installed huggingface_hub's, for each way of naming the cache."""
    pytest.importorskip("huggingface_hub")
    clean = {k: v for k, v in os.environ.items() if k not in HF_VARS}
    code = "from huggingface_hub import constants as c; print(c.HF_HUB_CACHE); print(c.HF_HUB_OFFLINE)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**clean, **env}, check=True).stdout.split("\n")
    assert (str(hub_cache_dir({**clean, **env})), str(hub_offline({**clean, **env}))) == (out[0], out[1])


def test_the_snapshot_is_the_one_huggingface_hub_finds(tmp_path: Path, tiny_qwen3_checkpoint: Path) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    write_snapshot(cache, HUB_ID, tiny_qwen3_checkpoint)
    found = huggingface_hub.snapshot_download(HUB_ID, cache_dir=str(cache), local_files_only=True)
    assert hub_snapshot(HUB_ID, env={"HF_HUB_CACHE": str(cache)}).path == Path(found)
    assert huggingface_hub.try_to_load_from_cache(HUB_ID, "config.json", cache_dir=str(cache)) == str(
        Path(found) / "config.json")
