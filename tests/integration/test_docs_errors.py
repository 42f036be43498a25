"""The errors ``docs/troubleshooting.md`` quotes are the errors the code prints.

Each quoted error is a ```text block after a marker ``<!-- error: ID -->``. For an ID the test
*triggers* the error in the code (a real ``ray start``, real ports bound, a real ``ip`` call, a
real ``sacct`` against the Slurm test cluster with accounting off, the sbatch answers captured
from that cluster) and matches the page's text against it, ``<...>`` standing for anything. For
``<!-- error: source FILE -->`` (messages only a running job prints: the head's log, the wrapper
lines) every literal piece of the text must be in FILE. Every trigger here has its block on the
page and every block its trigger, so neither side can drift alone. The table of sbatch refusals
on the page holds every row of ``podium.launcher.login.sbatch_errors.REFUSALS``, fix word for word.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "troubleshooting.md"
MARKER = re.compile(r"<!-- error: (?P<id>[^>]+?) -->\n```text\n(?P<text>.*?)\n```", re.S)
PLACEHOLDER = re.compile(r"'?<[^<>\s][^<>]*>'?")
CAPTURED = REPO / "tests" / "launcher" / "data" / "sbatch_refusals.json"


def blocks() -> list[tuple[str, str]]:
    return [(m["id"].strip(), m["text"]) for m in MARKER.finditer(PAGE.read_text())]


def template_regex(text: str) -> re.Pattern[str]:
    """The page's text as a pattern: ``<...>`` matches anything, the rest literally."""
    parts = re.split(r"(<[^<>\s][^<>]*>)", text)
    return re.compile("".join(".+?" if p.startswith("<") and p.endswith(">") else re.escape(p) for p in parts), re.S)


# ---------------------------------------------------------------------------------------------- triggers

def _ray_start_died(tmp: Path) -> str:
    from podium.launcher.job.exits import describe_death
    from podium.launcher.job.ray_bootstrap import ray_executable

    log = tmp / "ray-start.log"
    with open(log, "wb") as out:
        proc = subprocess.run([*ray_executable(), "start", "--head", "--num-gpus=two"], stdout=out,
                              stderr=subprocess.STDOUT, timeout=120)
    return describe_death("`ray start`", 4242, proc.returncode, log)


def _probe_report(tmp: Path, **changes) -> str:
    import podium
    from podium.launcher.login.doctor.probe import PROBE_MARK

    report = {"token": "3f2a9c1b7d4e", "host": "n1", "python": sys.executable, "version": list(sys.version_info[:3]),
              "podium": {"file": podium.__file__, "version": podium.__version__}, "checks": [], **changes}
    return PROBE_MARK + json.dumps(report)


def _run_dir_not_shared(tmp: Path) -> str:
    from podium.launcher.login.doctor.probe_job import _judge_probe

    out = Path("/shared/me/mopd-run/.doctor/3f2a9c1b7d4e.json")  # written on the node, absent here
    rows = _judge_probe(0, _probe_report(tmp), "", out, "in partition 'batch'", ())
    return next(r.detail for r in rows if r.name == "run dir")


def _podium_not_on_node(tmp: Path) -> str:
    from podium.launcher.login.doctor.probe_job import _judge_probe

    out = tmp / "probe.json"
    out.write_text(json.dumps({"token": "3f2a9c1b7d4e"}))
    report = _probe_report(tmp, import_error="ModuleNotFoundError: No module named 'podium'")
    return next(r.detail for r in _judge_probe(0, report, "", out, "here", ()) if r.name == "podium")


def _free_range(width: int, start: int = 24000) -> int:
    from podium.net import port_free

    lo = start
    while not all(port_free(p) for p in range(lo, lo + width)):
        lo += width
    return lo


def _ray_ports(tmp: Path) -> str:
    from podium.launcher.common.ray_ports import BLOCK_SIZE, RayStartError, choose_ports

    lo = _free_range(2 * BLOCK_SIZE)
    held = [socket.socket() for _ in range(2)]
    try:
        for sock, port in zip(held, (lo, lo + BLOCK_SIZE), strict=True):  # one port of each block taken
            sock.bind(("", port))
        with pytest.raises(RayStartError) as err:
            choose_ports((lo, lo + 2 * BLOCK_SIZE - 1), 1, 0, 0)
    finally:
        for sock in held:
            sock.close()
    return str(err.value)


def _ray_range_small(tmp: Path) -> str:
    from podium.launcher.common.ray_ports import RayStartError, choose_ports

    with pytest.raises(RayStartError) as err:
        choose_ports((24000, 24010), 1, 0, 0)
    return str(err.value)


def _server_ports(tmp: Path) -> str:
    from podium.net import listen_on_free_port

    lo = _free_range(2, 18500)
    held = [socket.socket() for _ in range(2)]
    try:
        for sock, port in zip(held, (lo, lo + 1), strict=True):
            sock.bind(("127.0.0.1", port))
            sock.listen()
        with pytest.raises(OSError, match="no free port") as err:
            listen_on_free_port("127.0.0.1", (lo, lo + 1))
    finally:
        for sock in held:
            sock.close()
    return str(err.value)


def _interface(tmp: Path) -> str:
    from podium.launcher.common.ray_ports import RayStartError, node_ip

    with pytest.raises(RayStartError) as err:
        node_ip("eth9")
    return str(err.value)


def _tokenizer(tmp: Path) -> str:
    from podium.client import TokenizerMismatchError
    from podium.client.teacher import check_tokenizer_against

    with pytest.raises(TokenizerMismatchError) as err:
        check_tokenizer_against("math_agent", "4711:0",
                                {"vocab_size": 256, "tokenizer_fingerprint": "vocab-sha256:1a2b"},
                                "vocab-sha256:9f8e", 256)
    return str(err.value)


def _local_cpu(tmp: Path) -> str:
    from podium.launcher.backends.local.environment import local_gpu_use

    return str(local_gpu_use("math", 2, 0)[1])


def _local_too_few(tmp: Path) -> str:
    from podium.launcher.backends import SubmitError
    from podium.launcher.backends.local.environment import local_gpu_use

    with pytest.raises(SubmitError) as err:
        local_gpu_use("math", 8, 2)
    return str(err.value)


# A Python without the packages of podium's extras (a trainer's light install): each raises
# ModuleNotFoundError on import, as when not installed; prints the error the code raises.
_WITHOUT_EXTRAS = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"torch", "megatron", "ray", "transformers", "safetensors", "aiohttp",
                                      "prometheus_client", "psutil", "submitit", "einops"}:
            raise ModuleNotFoundError(name)
        return None

sys.meta_path.insert(0, NotInstalled())
try:
    %s
except Exception as exc:
    print(exc)
"""


def _without_extras(statement: str) -> Callable[[Path], str]:
    def trigger(tmp: Path) -> str:
        proc = subprocess.run([sys.executable, "-c", _WITHOUT_EXTRAS % statement], capture_output=True, text=True,
                              cwd=REPO, timeout=120, check=True)
        return proc.stdout.strip()

    return trigger


def _not_a_run_dir(tmp: Path) -> str:
    from podium.launcher.login.run_dir import NotARunDirError, locate_run_dir

    with pytest.raises(NotARunDirError) as err:
        locate_run_dir(tmp / "mopd-rnu")
    return str(err.value)


def _spec(tmp: Path, slurm: dict, gpus_per_node: int):
    from harness.recipes import write_recipe

    from podium.config.plan import load_plan

    recipe = write_recipe(tmp / "recipe.yaml", {"math": (Path("/ckpt/math"), 1)}, slurm=slurm,
                          teacher_cfg={"gpus_per_node": gpus_per_node})
    (spec,) = load_plan(recipe).teachers
    return spec


def _sbatch(option: str, slurm: dict, gpus_per_node: int) -> Callable[[Path], str]:
    def trigger(tmp: Path) -> str:
        from podium.launcher.login.sbatch_errors import explain

        said = json.loads(CAPTURED.read_text())[option]  # what the test cluster's sbatch answers
        return "podium: error: " + explain(said, _spec(tmp, slurm, gpus_per_node))
    return trigger


def _client_unavailable(tmp: Path) -> str:
    from podium.client import TeacherUnavailableError

    return str(TeacherUnavailableError("math_agent", "4711:1", 1800.0, ["4711:1 draining", "connection refused"],
                                       "call_timeout_s"))


def _client_failed(tmp: Path) -> str:
    from podium.client import TeacherFailedError
    from podium.config.launcher import RestartSettings
    from podium.launcher.common.restarts import RestartLedger, decide

    decision = decide(RestartLedger(consecutive_failures=3), "failed", RestartSettings(), can_requeue=True)
    reason = f"RayStartError: {_interface(tmp).replace(socket.gethostname(), 'n1')} ({decision.why})"
    return str(TeacherFailedError("math_agent", "4711:3", reason))


def _stuck_call(tmp: Path) -> str:
    from podium.teacher.compute.liveness import CallWatch, RankReport, RankSeat

    seats = [RankSeat(0, "10.0.0.11, pid 4242", 8), RankSeat(1, "10.0.0.12, pid 4243", 8)]
    watch = CallWatch(9, seats, allowed_s=300.0, started=0.0)
    for rank in (0, 1):
        watch.report(rank, RankReport(call=9, microbatches=8, done=2, since_s=0.4), now=1.0)
    watch.report(0, RankReport(call=9, microbatches=8, done=2, since_s=300.4), now=301.0)
    verdict = watch.stuck(302.0)
    assert verdict is not None
    return verdict


def _mamba_kernels(tmp: Path) -> str:
    from podium.config.architecture import MAMBA_KERNELS
    from podium.teacher.model.hybrid_model import MambaKernelsMissing, choose_hybrid_spec

    with pytest.raises(MambaKernelsMissing) as err:
        choose_hybrid_spec(cuda=True, transformer_engine=True, missing_kernels=MAMBA_KERNELS,
                           where="this Python (/shared/me/venv/bin/python, torch 2.13.0+cu128, CUDA 12.8)")
    return str(err.value)


BLOCK = "on_policy_distillation.non_colocated_teachers.default_teacher_cfg"


def _plan_refuses(checkpoint: str, teacher_cfg: dict, overrides: tuple[str, ...] = ()) -> Callable[[Path], str]:
    """What `podium plan` prints for a small recipe of one alias ``math`` with ``teacher_cfg``."""
    def trigger(tmp: Path) -> str:
        from harness.recipes import write_recipe

        from podium.config.errors import ConfigError
        from podium.config.plan import load_plan

        recipe = write_recipe(tmp / "recipe.yaml", {"math": (checkpoint, 1)}, teacher_cfg=teacher_cfg)
        with pytest.raises(ConfigError) as err:
            load_plan(recipe, overrides)
        return f"podium: error: {err.value}"
    return trigger


SHARED_HF_HOME = "/shared/me/hf"  # the page's HF_HOME (nothing is made there)
PINNED = "4f1b2c3d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"


def _hub_id_not_cached(tmp: Path) -> str:
    from harness.recipes import write_recipe

    from podium.config.errors import ConfigError
    from podium.config.plan import load_plan, require_checkpoints

    recipe = write_recipe(tmp / "recipe.yaml", {"math": ("Qwen/Qwen3-1.7B", 1)})
    with pytest.MonkeyPatch.context() as env:
        env.delenv("HF_HUB_CACHE", raising=False)
        env.setenv("HF_HOME", SHARED_HF_HOME)
        with pytest.raises(ConfigError) as err:
            require_checkpoints(load_plan(recipe))
    return f"podium: error: {err.value}"


def _hub_snapshot_gone(tmp: Path) -> str:
    from podium.teacher.model.checkpoint_loader import resolve_checkpoint

    with pytest.MonkeyPatch.context() as env:
        env.delenv("HF_HUB_CACHE", raising=False)
        env.setenv("HF_HOME", SHARED_HF_HOME)
        with pytest.raises(ValueError, match="pinned when the teacher was planned") as err:
            resolve_checkpoint("Qwen/Qwen3-1.7B", revision=PINNED)
    return str(err.value)


def _weights(shards: int = 0) -> Callable[[Path], str]:
    """What `plan` (and `up`) say of a checkpoint folder holding config.json and, with ``shards``,
    an index of two weight files of which only the first ``shards`` - 1 are there."""
    def trigger(tmp: Path) -> str:
        from harness.recipes import write_recipe

        from podium.config.errors import ConfigError
        from podium.config.plan import load_plan, require_checkpoints

        folder = tmp / "math"
        folder.mkdir()
        (folder / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
        if shards:
            names = [f"model-0000{i}-of-0000{shards}.safetensors" for i in range(1, shards + 1)]
            index = {"weight_map": {f"layer{i}.weight": name for i, name in enumerate(names)}}
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
            for name in names[:-1]:
                (folder / name).write_bytes(b"")
        recipe = write_recipe(tmp / "recipe.yaml", {"math": (folder, 1)})
        with pytest.raises(ConfigError) as err:
            require_checkpoints(load_plan(recipe))
        return f"podium: error: {err.value}"
    return trigger


TRIGGERS: dict[str, Callable[[Path], str]] = {
    "teacher-key-typo": _plan_refuses("Qwen/Qwen3-1.7B", {"tensor_model_paralel_size": 4}),
    "override-typo": _plan_refuses("Qwen/Qwen3-1.7B", {}, (f"{BLOCK}.tensor_model_paralel_size=4",)),
    "several-problems": _plan_refuses("/ckpt/math", {"precison": "fp32"}),
    "cross-tokenizer": _plan_refuses("Qwen/Qwen3-1.7B", {"cross_tokenizer": True}),
    "ray-start-died": _ray_start_died,
    "run-dir-not-shared": _run_dir_not_shared,
    "podium-not-on-node": _podium_not_on_node,
    "node-without-teacher-packages": _without_extras(
        "from podium.launcher.job.node_run import check_teacher_packages; check_teacher_packages('n1')"),
    "up-without-submitit": _without_extras(
        "from podium.launcher.login.submission import require_launcher_packages; require_launcher_packages()"),
    "not-a-run-dir": _not_a_run_dir,
    "ray-ports": _ray_ports,
    "ray-range-small": _ray_range_small,
    "server-ports": _server_ports,
    "interface": _interface,
    "tokenizer": _tokenizer,
    "local-cpu": _local_cpu,
    "local-too-few": _local_too_few,
    "sbatch-gres": _sbatch("--gpus-per-node=2", {"gpus": True, "partition": None}, 2),
    "sbatch-partition": _sbatch("--partition=nope", {"partition": "nope"}, 1),
    "client-unavailable": _client_unavailable,
    "client-failed": _client_failed,
    "mamba-kernels": _mamba_kernels,
    "stuck-call": _stuck_call,
    "hub-id-not-cached": _hub_id_not_cached,
    "hub-snapshot-gone": _hub_snapshot_gone,
    "no-weights": _weights(),
    "partial-weights": _weights(shards=2),
}
NEEDS_SLURM = {"sacct-disabled"}


def test_every_quoted_error_has_a_trigger_and_every_trigger_a_quote() -> None:
    ids = [i for i, _ in blocks() if not i.startswith("source ")]
    assert sorted(ids) == sorted([*TRIGGERS, *NEEDS_SLURM])


@pytest.mark.parametrize("error_id", sorted(TRIGGERS))
@pytest.mark.usefixtures("hub_cache")  # the recipes' hub ids are in the HF cache, unless a trigger says otherwise
def test_the_quoted_error_is_what_the_code_prints(error_id: str, tmp_path: Path) -> None:
    (text,) = [t for i, t in blocks() if i == error_id]
    actual = TRIGGERS[error_id](tmp_path)
    assert template_regex(text).fullmatch(actual), f"docs/troubleshooting.md ({error_id}):\n  {text}\ncode:\n  {actual}"


def test_messages_only_a_job_prints_are_in_their_source() -> None:
    for where, text in blocks():
        if not where.startswith("source "):
            continue
        source = (REPO / where.split(" ", 1)[1]).read_text()
        pieces = [p.strip() for p in PLACEHOLDER.split(text)]
        missing = [p for p in pieces if len(p) >= 4 and p not in source]
        assert not missing, f"{where}: not in the code: {missing} (docs/troubleshooting.md: {text})"


def test_the_refusals_table_holds_every_known_refusal() -> None:
    from podium.launcher.login.sbatch_errors import REFUSALS

    after = PAGE.read_text().split("<!-- refusals-table -->", 1)[1].lstrip("\n").splitlines()
    table = list(itertools.takewhile(lambda line: line.startswith("|"), after))  # this table, not a later one
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| Slurm")]
    assert len(rows) == len(REFUSALS)
    for row, refusal in zip(rows, REFUSALS, strict=True):
        said, fix = (cell.strip() for cell in row.strip("|").split(" | "))
        assert refusal.matches(said) and fix == refusal.fix, row


@pytest.mark.slurm
def test_sacct_disabled_is_what_podium_prints(slurm_cluster, tmp_path: Path) -> None:
    """sacct of a cluster without accounting: the test cluster's own config with accounting off
    (the controller still answers squeue)."""
    import os

    from podium.launcher.common.slurm_state import SlurmQueryError, query_states

    conf = tmp_path / "slurm.conf"
    text = Path(os.environ["SLURM_CONF"]).read_text()
    conf.write_text(re.sub(r"(?m)^AccountingStorageType=.*$", "AccountingStorageType=accounting_storage/none", text))
    with pytest.raises(SlurmQueryError) as err:
        query_states(["4711"], env={**os.environ, "SLURM_CONF": str(conf)})
    (text,) = [t for i, t in blocks() if i == "sacct-disabled"]
    actual = f"podium: error: {err.value}"
    assert template_regex(text).fullmatch(actual), f"docs:\n  {text}\ncode:\n  {actual}"
