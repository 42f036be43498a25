"""A trainer's light install: podium's base dependencies reach a teacher without torch, Ray or Megatron.

``pip install podium`` with no extras must give the client, the protocol, the rendezvous,
``podium.connect``, ``podium.nemo_rl`` and the CLI's ``plan``, ``status`` and ``wait``. No network:
pyproject.toml's base dependencies name none of the heavy packages (they are in the ``teacher`` and
``launcher`` extras), and a child Python in which every package of those extras is unimportable
(:data:`BLOCKER`, as when not installed) imports the trainer's side of podium, connects to a real
endpoint served by this process (a numpy stand-in group) and gets the expected logprobs back as
numpy arrays, and runs ``podium status`` and ``podium wait`` against that teacher as a user does.

What a light install cannot do, it says: ``podium up`` from it refuses naming submitit and the
command that installs it; a teacher whose node Python is a light install (``podium.slurm.python``)
fails at once, final, with the missing packages and the install command in ``status`` and ``wait``;
``podium doctor`` fails its ``packages`` row the same way.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness.cli import podium
from harness.fake_group import FakeGroup, fake_logprobs
from harness.lifecycle import Teacher
from harness.recipes import write_recipe
from harness.run import TeacherDef, make_run

from podium.launcher.backends.local.scheduler import CONTROLLER_MODULE
from podium.launcher.common.files import TeacherFiles
from podium.launcher.common.jobs import JobRecord
from podium.launcher.common.packages import LAUNCHER_PACKAGES, TEACHER_PACKAGES
from podium.launcher.login.run_dir import write_spec
from podium.rendezvous import Generation

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "megatron-core", "ray", "transformers", "submitit")
MODULE_OF = {"megatron-core": "megatron"}  # distribution name -> import name, where they differ
MATH = TeacherDef("c3c3c3c3c3c3", "math", ("math", "code"))

# Every package of the extras raises ModuleNotFoundError on import, as when not installed; the
# blocked packages come from $PODIUM_TEST_BLOCKED (also a sitecustomize: the light "node Python").
BLOCKER = """
import importlib.abc, os, sys

BLOCKED = set(os.environ["PODIUM_TEST_BLOCKED"].split(","))


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the light install)", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""
# The trainer's side: connect, call, save what came back.
CHILD = BLOCKER + """
import numpy as np

import podium
import podium.client
import podium.nemo_rl
import podium.protocol
import podium.rendezvous
import podium.verl
from podium.nemo_rl import RemoteTeacherWorkerGroup

ids, lengths = np.load(sys.argv[2] + "/batch.npy"), np.load(sys.argv[2] + "/lengths.npy")
with podium.connect(sys.argv[1], ready_timeout_s=60.0) as client:
    out = client.get_logprobs("code", {"input_ids": ids, "input_lengths": lengths}, top_k=2)
    by_agent = client.get_logprobs_by_agent({"input_ids": ids, "input_lengths": lengths}, ["math"] * len(ids))
    group = RemoteTeacherWorkerGroup.from_client(client, "math")
    np.save(sys.argv[2] + "/data_parallel.npy", group.sharding_annotations.get_axis_size("data_parallel"))
for name, value in {**out, "by_agent": by_agent["logprobs"]}.items():
    assert type(value) is np.ndarray, (name, type(value))
    np.save(f"{sys.argv[2]}/{name}.npy", value)
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
assert not loaded, loaded
"""


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (``ray[default]>=2.40`` -> ``ray``)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def test_base_dependencies_name_no_heavy_package() -> None:
    project = _project()
    base = {_name(r) for r in project["dependencies"]}
    assert not base & set(HEAVY), f"base dependencies name {sorted(base & set(HEAVY))}: they belong in the extras"
    extras = project["optional-dependencies"]
    in_extras = {_name(r) for extra in ("teacher", "launcher") for r in extras[extra]}
    assert set(HEAVY) <= in_extras, f"{sorted(set(HEAVY) - in_extras)} in neither the teacher nor the launcher extra"
    assert extras["all"] == ["podium[teacher,launcher]"]


def test_the_node_checks_every_package_of_the_teacher_extra() -> None:
    """What a node task checks before it starts (TEACHER_PACKAGES) is the ``teacher`` extra (einops
    aside: Mamba teachers only), and what ``up`` checks is the ``launcher`` extra's submitter."""
    extras = _project()["optional-dependencies"]
    teacher = {_name(r) for r in extras["teacher"]} - {"einops"}
    assert {_name(dist) for dist in TEACHER_PACKAGES.values()} == teacher
    assert set(LAUNCHER_PACKAGES.values()) <= {_name(r) for r in extras["launcher"]}


def _blocked() -> set[str]:
    """The import names of every package of the ``teacher`` and ``launcher`` extras that the base
    install does not have too (aiohttp: ``podium front`` serves from a trainer's install)."""
    project = _project()
    extras, base = project["optional-dependencies"], {_name(r) for r in project["dependencies"]}
    blocked = {MODULE_OF.get(n, n.replace("-", "_")) for x in ("teacher", "launcher") for n in map(_name, extras[x])
               if n not in base}
    assert {"torch", "megatron", "ray", "transformers", "submitit"} <= blocked
    return blocked


def light_env() -> dict[str, str]:
    """The environment of a light-install child: this checkout first on the path, the extras blocked."""
    return {**os.environ, "PODIUM_TEST_BLOCKED": ",".join(sorted(_blocked())),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def light_podium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``podium *args`` run by a light install, as a user runs it (a subprocess)."""
    main = BLOCKER + "\nfrom podium.cli import main\nsys.argv = ['podium', *sys.argv[1:]]\nmain()\n"
    return subprocess.run([sys.executable, "-c", main, *args], capture_output=True, text=True, timeout=timeout,
                          env=light_env(), cwd=ROOT)


def test_a_trainer_without_the_extras_connects_and_gets_numpy_logprobs(tmp_path: Path) -> None:
    blocked = _blocked()
    layout, token = make_run(tmp_path, [MATH])
    group = FakeGroup(data_parallel_size=3)  # what the facade's sharding reports, read from the teacher's record
    teacher = Teacher(group, layout, MATH, token).start()
    rng = np.random.default_rng(7)
    lengths = np.array([5, 1, 12, 8])
    ids = rng.integers(0, group.facts.vocab_size, (4, 12))
    out = tmp_path / "out"
    out.mkdir()
    np.save(out / "batch.npy", ids)
    np.save(out / "lengths.npy", lengths)
    try:
        child = subprocess.run([sys.executable, "-c", CHILD, str(layout.rendezvous_path), str(out)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120,
                               env={**light_env(), "PODIUM_TEST_BLOCKED": ",".join(sorted(blocked))})
    finally:
        teacher.stop()
    assert child.returncode == 0, child.stderr
    expected = fake_logprobs(ids, lengths)
    np.testing.assert_array_equal(np.load(out / "logprobs.npy"), expected)
    np.testing.assert_array_equal(np.load(out / "by_agent.npy"), expected)
    sent = np.where(np.arange(12)[None, :] < lengths[:, None], ids, 0)  # what the group gets: padding zeroed
    np.testing.assert_array_equal(np.load(out / "topk_indices.npy"), (np.arange(2) + sent[:, :, None]) % 128)
    np.testing.assert_array_equal(np.load(out / "topk_logprobs.npy"), np.broadcast_to(-np.arange(2.0), (4, 12, 2)))
    assert int(np.load(out / "data_parallel.npy")) == 3


def test_importing_the_client_stays_light() -> None:
    """``import podium`` and ``import podium.client`` pull neither torch nor ray (trainer login nodes, CLIs)."""
    import subprocess
    import sys

    code = ("import sys, podium; assert callable(podium.connect); heavy = {'torch', 'ray', 'megatron', 'aiohttp'}; "
            "assert not heavy & set(sys.modules), heavy & set(sys.modules); import podium.client; "
            "assert not {'torch', 'ray', 'megatron'} & set(sys.modules), "
            "{'torch', 'ray', 'megatron'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_the_front_serves_from_the_light_install(tmp_path: Path) -> None:
    """``podium front`` in a child without the extras: it listens, answers the teacher's logprobs
    through the alias's base URL, and stops on SIGTERM."""
    layout, token = make_run(tmp_path, [MATH])
    teacher = Teacher(FakeGroup(), layout, MATH, token, generation=Generation(8800, 0)).start()
    code = (f"{BLOCKER}\n"
            "import json, urllib.request\n"
            "from podium.front.serve import FrontThread\n"
            "from harness.infer_requests import infer_body\n"
            f"front = FrontThread({str(layout.rendezvous_path)!r}).start()\n"
            "req = urllib.request.Request(front.url + '/math/v2/models/math/infer',"
            " data=infer_body([[5, 9, 2, 7]], [4]),"
            f" headers={{'Authorization': 'Bearer {token}', 'Content-Type': 'application/json'}})\n"
            "print(json.dumps(json.load(urllib.request.urlopen(req, timeout=120))['outputs'][0]['data']))\n"
            "front.stop()\n"
            "heavy = sorted(m for m in sys.modules if m.partition('.')[0] in BLOCKED)\n"
            "assert not heavy, heavy\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                              env={**light_env(), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"})
    finally:
        teacher.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    expected = fake_logprobs(np.array([[5, 9, 2, 7]]), np.array([4])).ravel()
    np.testing.assert_allclose(json.loads(proc.stdout.strip().splitlines()[-1]), expected, atol=1e-6)


def test_status_and_wait_in_the_light_install_read_a_ready_teacher(tmp_path: Path) -> None:
    """``podium status`` and ``wait`` from the light install, against a ready teacher (a stand-in
    group behind the real endpoint and lifecycle) whose local job the scheduler sees running: the
    load figures come from its /metrics with no prometheus_client; once it stopped, ``wait`` ends
    with a message, not a traceback."""
    layout, token = make_run(tmp_path, [MATH])
    files = TeacherFiles(layout.teacher_dir(MATH.name, MATH.key))
    files.submitit.mkdir(parents=True)
    # What a cluster: local job looks like to its scheduler: a process whose argv names submitit's
    # controller module and the teacher's submitit folder; its PID is the job id.
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", CONTROLLER_MODULE,
                                   str(files.submitit)])
    try:
        teacher = Teacher(FakeGroup(), layout, MATH, token, generation=Generation(controller.pid, 0))
        write_spec(layout.run_dir, teacher.spec())
        JobRecord(teacher_key=MATH.key, teacher_name=MATH.name, job_id=str(controller.pid), cluster="local",
                  submitted_at=time.time(), folder=str(files.submitit)).write(files)
        teacher.start()
        try:
            status = light_podium("status", str(layout.run_dir), "--json")
            assert status.returncode == 0, status.stdout + status.stderr
            (row,) = json.loads(status.stdout)
            assert row["ready"] and row["health"] and row["slurm_state"] == "RUNNING", row
            assert row["load"] is not None and row["load"]["errors"] == 0, row  # /metrics read without the library
            table = light_podium("status", str(layout.run_dir))
            assert table.returncode == 0 and row["url"] in table.stdout, table.stdout + table.stderr
            ready = light_podium("wait", str(layout.run_dir), "--timeout", "60")
            assert ready.returncode == 0 and "all teachers ready" in ready.stdout, ready.stdout + ready.stderr
        finally:
            teacher.stop()
        gone = light_podium("wait", str(layout.run_dir), "--timeout", "2")
        assert gone.returncode == 1, gone.stdout + gone.stderr
        assert "podium: error: not ready after 2s: math=stopped" in gone.stderr and "Traceback" not in gone.stderr
    finally:
        controller.kill()
        controller.wait()


def _local_recipe(tmp_path: Path, checkpoint: Path, **settings: Any) -> Path:
    """A one-teacher ``cluster: local`` recipe whose run dir is ``tmp_path/run``."""
    recipe = write_recipe(tmp_path / "recipe.yaml", {"math": (checkpoint, 1)}, cluster="local", **settings)
    recipe.write_text(recipe.read_text().replace("podium:\n", f"podium:\n  run_dir: {tmp_path / 'run'}\n", 1))
    return recipe


def test_up_from_the_light_install_refuses_naming_submitit(tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    recipe = _local_recipe(tmp_path, tiny_llama_checkpoint)
    up = light_podium("up", str(recipe))
    assert up.returncode == 2, up.stdout + up.stderr
    print(up.stderr)  # what a user reads (shown with -rP)
    assert ("podium: error: submitting teachers needs the launcher's packages: " in up.stderr
            and "cannot import submitit" in up.stderr and "`pip install 'podium[launcher]'`" in up.stderr), up.stderr
    assert "Traceback" not in up.stderr and not (tmp_path / "run").exists()  # nothing written


def _light_python(folder: Path) -> Path:
    """An interpreter that is a light install (what ``podium.slurm.python`` names when it points at
    a trainer's environment): this one, with every package of the extras unimportable."""
    site = folder / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = light_env()
    python = folder / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site}:{env['PYTHONPATH']} "
                      f'PODIUM_TEST_BLOCKED={env["PODIUM_TEST_BLOCKED"]} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_teacher_whose_node_python_is_a_light_install_fails_at_once_naming_what_is_missing(
        tiny_llama_checkpoint: Path, tmp_path: Path) -> None:
    """``podium.slurm.python`` is a light install: the node task fails before it starts Ray, for good
    (no requeue installs a package), and ``up --wait``, ``status`` and ``wait`` show the cause with
    the install command; ``doctor`` fails its packages row the same way."""
    python = _light_python(tmp_path / "light")
    run_dir = tmp_path / "run"
    recipe = _local_recipe(tmp_path, tiny_llama_checkpoint, slurm={"python": str(python)})
    missing = "cannot import torch, megatron.core, ray, transformers, safetensors, prometheus_client, psutil"
    install = "`pip install 'podium[teacher]'`"
    try:
        up = podium("up", str(recipe), "--wait", "--timeout", "120", check=False)
        assert up.returncode == 1, up.stdout + up.stderr
        (error,) = [line for line in up.stderr.splitlines() if line.startswith("podium: error:")]
        print(error)  # what a user reads (shown with -rP)
        assert missing in error and install in error and "final: no requeue installs a package" in error, error
        (row,) = json.loads(podium("status", str(run_dir), "--json", check=False).stdout)
        assert row["status"] == "failed" and row["final"] is True and missing in row["reason"], row
        wait = podium("wait", str(run_dir), "--timeout", "30", check=False)
        assert wait.returncode == 1 and missing in wait.stderr and install in wait.stderr, wait.stderr
        doctor = podium("doctor", str(recipe), "--json", check=False)
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        (packages,) = [c for c in json.loads(doctor.stdout)["checks"] if c["name"] == "packages"]
        assert packages["state"] == "fail" and f"{python} {missing}" in packages["detail"], packages
        assert install in packages["detail"] and "podium.slurm.python" in packages["fix"], packages
    finally:
        podium("down", str(run_dir), check=False)


# --------------------------------------------------------------------------- deadlines and retry rules
