"""Replicas in the plan, the run directory and the rendezvous (pure logic; the replicas run for real
on the Slurm test cluster in ``tests/integration/test_replicas_slurm.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podium.config.errors import ConfigError
from podium.config.launcher import launcher_changes
from podium.config.needs import teacher_needs
from podium.config.plan import load_plan
from podium.launcher.login import status as status_view
from podium.launcher.login.run_dir import known_teachers, prepare_run_dir
from podium.launcher.login.scale import scale
from podium.rendezvous import read_rendezvous
from podium.rendezvous.manifest import Rendezvous, TeacherEntry

RECIPE = """\
on_policy_distillation:
  teacher_model_by_agent_name: {{math: /ckpt/math, code: /ckpt/math, chat: /ckpt/chat}}
  default_teacher_alias: math
  non_colocated_teachers:
    default_teacher_cfg: {{tensor_model_parallel_size: 1, num_nodes: 2, gpus_per_node: 4}}
podium:
  cluster: local
{podium}
"""


def plan_of(tmp_path: Path, podium: str = "", name: str = "recipe.yaml"):
    path = tmp_path / name
    path.write_text(RECIPE.format(podium=podium))
    return load_plan(path)


def test_replicas_are_counted_but_do_not_change_what_a_teacher_is(tmp_path: Path) -> None:
    one = plan_of(tmp_path, name="one.yaml")
    many = plan_of(tmp_path, "  replicas: 2\n  teachers: {chat: {replicas: 3}}", name="many.yaml")
    assert [t.key for t in one.teachers] == [t.key for t in many.teachers]
    assert [(t.name, t.launcher.replicas) for t in many.teachers] == [("math", 2), ("chat", 3)]
    # 2 nodes each: 2 + 3 replica allocations; without dedup every alias would be its own teacher
    assert many.totals == {"teachers": 2, "aliases": 3, "replicas": 5, "nodes": 10, "nodes_without_dedup": 14}
    assert one.totals["nodes"] == 4
    needs = teacher_needs(many.teachers[1])
    assert needs[1].startswith("3 replicas: 3 such allocations (6 node(s), 24 GPUs in all)"), needs
    assert not any("replicas:" in line for line in teacher_needs(one.teachers[1]))
    # the count is not a setting of a running job: a live job is not "changed" by it
    assert launcher_changes(one.teachers[1].launcher, many.teachers[1].launcher) == []


def test_bad_replica_counts_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"podium.teachers.chat.replicas: Input should be greater than or equal to 1"):
        plan_of(tmp_path, "  teachers: {chat: {replicas: 0}}")
    with pytest.raises(ConfigError, match=r"podium.replicas: Input should be a valid integer"):
        plan_of(tmp_path, "  replicas: two")
    with pytest.raises(ConfigError, match=r"podium.teachers.math.replicas \(3\) and podium.teachers.code.replicas "
                                          r"\(2\) disagree, but aliases 'math' and 'code' share one teacher"):
        plan_of(tmp_path, "  teachers: {math: {replicas: 3}, code: {replicas: 2}}")
    with pytest.raises(ConfigError, match=r"podium.teachers.chat.replica: unknown key \(did you mean 'replicas'\?\)"):
        plan_of(tmp_path, "  teachers: {chat: {replica: 2}}")


def test_each_replica_has_its_folder_name_and_identity(tmp_path: Path) -> None:
    math = plan_of(tmp_path, "  replicas: 3").teachers[0]
    specs = math.replica_specs()
    assert [s.replica for s in specs] == [0, 1, 2] and {s.key for s in specs} == {math.key}
    assert [s.label for s in specs] == [f"math-{math.key[:8]}", f"math-{math.key[:8]}-r1", f"math-{math.key[:8]}-r2"]
    assert [s.display for s in specs] == ["math", "math#1", "math#2"]
    assert [s.identity for s in specs] == [math.key, f"{math.key}-r1", f"{math.key}-r2"]
    with pytest.raises(ValueError, match="replica -1 < 0"):
        math.replica_spec(-1)


def test_run_dir_and_rendezvous_list_every_replica(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "  teachers: {chat: {replicas: 2}}")
    layout = prepare_run_dir(plan, tmp_path / "run")
    rdv = read_rendezvous(layout.run_dir)
    math, chat = plan.teachers
    assert rdv.teachers[math.key].replicas == (f"teachers/math-{math.key[:8]}/endpoint.json",)
    assert rdv.teachers[chat.key].replicas == (f"teachers/chat-{chat.key[:8]}/endpoint.json",
                                               f"teachers/chat-{chat.key[:8]}-r1/endpoint.json")
    assert rdv.teachers[chat.key].endpoint == rdv.teachers[chat.key].replicas[0]
    found = [(s.display, s.replica, f.folder.name) for s, f in known_teachers(layout.run_dir)]
    assert found == [("chat", 0, f"chat-{chat.key[:8]}"), ("chat#1", 1, f"chat-{chat.key[:8]}-r1"),
                     ("math", 0, f"math-{math.key[:8]}")]
    # status: one row per replica, all listed, none submitted yet
    rows = status_view.status(layout.run_dir, probe=False)
    assert [(r.display, r.replica, r.in_plan, r.status) for r in rows] == [
        ("chat", 0, True, "pending"), ("chat#1", 1, True, "pending"), ("math", 0, True, "pending")]
    # a replica folder the rendezvous no longer lists (scaled down) is shown, not waited for
    write = rdv.with_replicas(chat.key, rdv.teachers[chat.key].replicas[:1])
    (layout.run_dir / "rendezvous.json").write_text(write.model_dump_json())
    rows = status_view.status(layout.run_dir, probe=False)
    assert [(r.display, r.in_plan) for r in rows] == [("chat", True), ("math", True), ("chat#1", False)]
    assert json.loads(json.dumps(rows[2].to_dict()))["replica"] == 1


def test_a_rendezvous_of_an_older_podium_reads_as_one_replica(tmp_path: Path) -> None:
    older = {"schema_version": 1, "run_name": "r", "routing": {"math": "k" * 12}, "default_alias": None,
             "strict": False, "teachers": {"k" * 12: {"name": "math", "aliases": ["math"],
                                                      "endpoint": "teachers/math-kkkkkkkk/endpoint.json"}}}
    rdv = Rendezvous.model_validate(older)
    assert rdv.teachers["k" * 12].replicas == ("teachers/math-kkkkkkkk/endpoint.json",)
    two = rdv.with_replicas("k" * 12, ["teachers/math-kkkkkkkk/endpoint.json",
                                       "teachers/math-kkkkkkkk-r1/endpoint.json"])
    assert two.teachers["k" * 12].endpoint == "teachers/math-kkkkkkkk/endpoint.json"
    assert rdv.teachers["k" * 12].replicas == ("teachers/math-kkkkkkkk/endpoint.json",)  # unchanged: frozen
    with pytest.raises(ValueError, match="at least one replica"):
        rdv.with_replicas("k" * 12, [])
    with pytest.raises(ValueError, match="listed twice"):
        TeacherEntry(name="m", aliases=("m",), endpoint="a/endpoint.json", replicas=("a/endpoint.json",) * 2)
    with pytest.raises(ValueError, match="is not its first replica"):
        TeacherEntry(name="m", aliases=("m",), endpoint="a/endpoint.json", replicas=("b/endpoint.json",))


def test_scale_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    layout = prepare_run_dir(plan_of(tmp_path), tmp_path / "run")
    with pytest.raises(ValueError, match=r"0 replicas: a teacher needs at least 1 \(`podium down .* math` stops it\)"):
        scale(layout.run_dir, "math", 0)
    with pytest.raises(ValueError, match=r"no teacher 'maths' in .* \(teachers: chat, math\)"):
        scale(layout.run_dir, "maths", 2)


def test_dry_run_prints_every_replicas_job_and_render_names_one(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from fixtures.hub_cache import write_snapshot
    from typer.testing import CliRunner

    from podium.cli import app

    path = tmp_path / "recipe.yaml"
    text = RECIPE.format(podium="  teachers: {chat: {replicas: 2}}").replace("cluster: local", "cluster: slurm")
    path.write_text(text.replace("/ckpt/", "org/"))  # hub ids, in an HF cache (stand-ins: no weights are read)
    for repo_id in ("org/math", "org/chat"):
        write_snapshot(tmp_path / "hf", repo_id)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    run_dir = tmp_path / "run"
    dry = CliRunner().invoke(app, ["up", str(path), "--run-dir", str(run_dir), "--dry-run"])
    assert dry.exit_code == 0, dry.output
    names = [line.split("=", 1)[1] for line in dry.stdout.splitlines() if line.startswith("#SBATCH --job-name=")]
    chat = load_plan(path).teacher("chat")
    assert names == [f"podium-math-{load_plan(path).teacher('math').key[:8]}", f"podium-chat-{chat.key[:8]}",
                     f"podium-chat-{chat.key[:8]}-r1"]
    one = CliRunner().invoke(app, ["render", str(path), "--run-dir", str(run_dir), "--teacher", "chat#1"])
    assert one.exit_code == 0, one.output
    assert f"#SBATCH --job-name=podium-chat-{chat.key[:8]}-r1" in one.stdout and one.stdout in dry.stdout
    assert not run_dir.exists()  # neither writes the run dir
    bad = CliRunner().invoke(app, ["render", str(path), "--teacher", "chat#2"])
    assert bad.exit_code == 2 and "no teacher 'chat#2' in the plan; teachers: math, chat" in bad.output
