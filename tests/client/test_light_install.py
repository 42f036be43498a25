"""A trainer's light install: podium's base dependencies reach a teacher without torch, Ray or Megatron.

``pip install podium`` with no extras must give the client, the protocol, the rendezvous,
``podium.connect`` and ``podium.nemo_rl``. Two checks, no network: pyproject.toml's base
dependencies name none of the heavy packages (they are in the ``teacher`` and ``launcher`` extras),
and a child Python in which every package of those extras is unimportable imports the trainer's
side of podium, connects to a real endpoint served by this process (a numpy stand-in group) and
gets the expected logprobs back as numpy arrays.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from harness.fake_group import FakeGroup, fake_logprobs
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "megatron-core", "ray", "transformers", "submitit")
MODULE_OF = {"megatron-core": "megatron"}  # distribution name -> import name, where they differ
MATH = TeacherDef("c3c3c3c3c3c3", "math", ("math", "code"))

# The child: every package of the extras raises ModuleNotFoundError on import, as when not installed.
CHILD = """
import importlib.abc, sys

BLOCKED = set(sys.argv[3].split(","))


class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not in the light install)", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())

import numpy as np

import podium
import podium.client
import podium.nemo_rl
import podium.protocol
import podium.rendezvous
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


def test_a_trainer_without_the_extras_connects_and_gets_numpy_logprobs(tmp_path: Path) -> None:
    extras = _project()["optional-dependencies"]
    blocked = {MODULE_OF.get(n, n.replace("-", "_")) for x in ("teacher", "launcher") for n in map(_name, extras[x])}
    assert {"torch", "megatron", "ray", "transformers", "submitit"} <= blocked
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
        child = subprocess.run([sys.executable, "-c", CHILD, str(layout.rendezvous_path), str(out), ",".join(blocked)],
                               cwd=ROOT, capture_output=True, text=True, timeout=120)
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


# --------------------------------------------------------------------------- deadlines and retry rules
