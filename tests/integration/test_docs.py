"""Every command the README and ``docs/*.md`` show is run, on the real Slurm test cluster.

The fenced ```bash and ```python blocks of ``README.md`` and then ``docs/*.md`` (sorted) run in
order, in one scratch folder, as a user would type them: ``podium`` is this checkout's CLI, the
shell variables a block sets reach the next blocks (``set -a``: as in one shell). One teacher comes up
once (the README's ``podium up --wait``, one tiny Llama on one emulated node) and serves every later block; the
blocks marked ``last`` (``podium down``) run after all the others. Each block must exit 0.

An HTML comment on the line before a fence tells the test what a block is:

- ``<!-- docs-test: skip: REASON -->``: not run here (installs, the whole suite, NeMo RL's own
  trainer); every one is listed in :data:`EXPECTED_SKIPS`, so nothing is skipped silently;
- ``<!-- docs-test: file NAME -->``: the block is written to ``NAME`` (the README's recipe);
- ``<!-- docs-test: site ... -->``: a site's ``podium:`` section: validated as launcher settings
  (the run uses the test cluster's own site file, :data:`TEST_SITE`);
- ``<!-- docs-test: last -->``: run after every other block.

The pages' example paths stand for the user's: :func:`substitutions` maps them to the test's
(``/shared/me`` to a scratch folder every node sees, ``/ckpt/math`` to the tiny checkpoint,
``/ckpt/coder`` to a copy of it (another teacher), ``/ckpt/ultra-*`` to stand-ins of the Ultra
recipe's teachers).
The other tests here keep the pages' tables true: the command table against ``podium --help``,
the settings tables against ``podium/config/launcher.py``, the field tables against the pydantic
models of the rendezvous file and the endpoint record, and the README's test command against CI's.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = ("bash", "python")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_-]*)\n(?P<body>.*?)^```$", re.S | re.M)
MARK = re.compile(r"<!-- docs-test: (?P<kind>[a-z-]+)(?::? ?(?P<arg>.*?))? -->\s*$")
KINDS = ("skip", "file", "site", "last")
# (page, why) of every block that is not run here, one entry per block (the why is on the page)
EXPECTED_SKIPS = sorted([
    ("README.md", "installs packages; CI's .ci/run installs the same torch 2.13.0 and .[all,test]"),
    ("README.md", "installs CUDA packages on a GPU node"),
    ("README.md", "every benchmark at full size (about 20 min here); tests/benchmarks/test_bench_quick.py runs "
                  "run_all --quick"),
    ("README.md", "`podium demo` is run by tests/apps/test_demo.py, the suite by .ci/run"),
    ("docs/nemo_rl.md", "needs NeMo RL's trainer (setup, async_grpo_train)"),
    ("docs/nemo_rl.md", "needs NeMo RL's distillation setup"),
    ("docs/nemo_rl.md", "needs NeMo RL's SingleController setup"),
    ("docs/scoring_fronts.md", "needs verl's trainer"),
])
TEST_SITE = """\
podium:
  slurm: {partition: low, gpus: false, exclusive: false, time: "00:30:00"}
  ray: {port_range: [24000, 32767], object_store_memory_mb: 100}
  server: {heartbeat_s: 2, stale_after_s: 10}
"""
BLOCK_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str
    kind: str = ""  # "" (run) or one of KINDS
    arg: str = ""

    @property
    def first_line(self) -> str:
        return self.body.splitlines()[0] if self.body.strip() else ""

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGS and self.kind in ("", "last")


def blocks() -> list[Block]:
    out = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            before = text[: match.start()].rstrip("\n").splitlines()
            mark = MARK.match(before[-1]) if before else None
            out.append(Block(str(page.relative_to(REPO)), text[: match.start()].count("\n") + 1, match["lang"],
                             match["body"], mark["kind"] if mark else "", (mark["arg"] or "").strip() if mark else ""))
    return out


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    all_blocks = blocks()
    unknown = [b for b in all_blocks if b.kind and b.kind not in KINDS]
    assert not unknown, f"unknown docs-test markers: {unknown}"
    skipped = [b for b in all_blocks if b.kind == "skip"]
    assert all(b.arg for b in skipped), "a skip says why"
    assert sorted((b.page, b.arg) for b in skipped) == EXPECTED_SKIPS
    wrong = [b for b in skipped if b.lang not in RUN_LANGS]
    assert not wrong, f"only commands are skipped: {wrong}"
    run = [b for b in all_blocks if b.runs]
    print(f"{len(run)} blocks run, {len(skipped)} skipped: "
          + "; ".join(f"{b.page}:{b.line} ({b.arg})" for b in skipped))


def test_site_examples_are_valid_settings() -> None:
    from podium.config.launcher import parse_launcher

    sites = [b for b in blocks() if b.kind == "site"]
    assert sites
    for block in sites:
        parse_launcher(yaml.safe_load(block.body)["podium"], f"{block.page}:{block.line}")
    parse_launcher(yaml.safe_load(TEST_SITE)["podium"])


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    command = "bash tests/cluster/slurm.sh start && python -m pytest"
    assert command in readme
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash tests/cluster/slurm.sh start" in ci
    assert re.search(r'^(nice -n \d+ )?"\$PY" -m pytest( |$)', ci, re.M), "CI runs the whole suite with pytest"


def test_the_command_table_is_podium_help() -> None:
    proc = subprocess.run([sys.executable, "-m", "podium.cli", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=120, check=True)
    listed = re.findall(r"^│ (\w+) +\S", proc.stdout.split("Commands", 1)[1], re.M)
    section = (REPO / "README.md").read_text().split("## Commands", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `podium (\w+)", section, re.M)
    assert sorted(documented) == sorted(listed)


def _default(field: Any) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    return "`" + json.dumps(list(value) if isinstance(value, tuple) else value) + "`"


def _table_rows(page: str, marker: str) -> list[list[str]]:
    rows = []
    for part in (REPO / page).read_text().split(marker)[1:]:
        for line in part.lstrip("\n").splitlines():
            if not line.startswith("|"):
                break
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            if cells[0] not in ("key", "field") and not set(cells[0]) <= set("-|"):
                rows.append(cells)
    return rows


def test_the_settings_tables_name_every_setting_with_its_default() -> None:
    from pydantic import BaseModel

    from podium.config.launcher import TeacherLauncherSettings

    expected = {}
    for name, field in TeacherLauncherSettings.model_fields.items():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel):
            expected.update({f"`{name}.{k}`": _default(f) for k, f in model.model_fields.items()})
        else:
            expected[f"`{name}`"] = _default(field)
    documented = {row[0]: row[1] for row in _table_rows("docs/site-settings.md", "<!-- settings-table -->")}
    assert documented == expected


def test_the_field_tables_name_every_field_of_the_records() -> None:
    text = (REPO / "docs" / "rendezvous.md").read_text()
    markers = re.findall(r"<!-- fields: ([\w.]+) -->", text)
    assert len(markers) == 4
    for dotted in markers:
        module, name = dotted.rsplit(".", 1)
        model = getattr(importlib.import_module(module), name)
        documented = [row[0].strip("`") for row in _table_rows("docs/rendezvous.md", f"<!-- fields: {dotted} -->")]
        assert documented == list(model.model_fields), dotted


# ---------------------------------------------------------------------------------------------- running them

def substitutions(scratch: Path, checkpoint: Path, nemo_rl_configs: Path) -> dict[str, str]:
    """The pages' example paths -> this test's (the Ultra recipe's teachers: stand-in checkpoints
    holding Ultra's config.json, made here, which `plan` reads; a second teacher's checkpoint: a copy
    of the tiny one, another path)."""
    from fixtures.recipes import write_ultra_checkpoint

    ultra = {f"/ckpt/ultra-{name}": str(write_ultra_checkpoint(scratch / "ultra" / name))
             for name in ("general", "reasoning", "swe")}
    coder = scratch / "coder"
    if not coder.exists():
        shutil.copytree(checkpoint, coder)
    return {"/shared/me": str(scratch), "/ckpt/math": str(checkpoint), "/ckpt/coder": str(coder), **ultra,
            "../shared/nemo-rl-configs": str(nemo_rl_configs)}


def _substituted(text: str, subs: dict[str, str]) -> str:
    for old, new in subs.items():
        text = text.replace(old, new)
    return text


def _tools(folder: Path) -> Path:
    """``podium`` and ``python`` of this checkout and interpreter, first on PATH."""
    folder.mkdir()
    (folder / "podium").write_text(f'#!/bin/sh\nexec {sys.executable} -m podium.cli "$@"\n')
    (folder / "podium").chmod(0o755)
    (folder / "python").symlink_to(sys.executable)
    return folder


@pytest.mark.slurm
def test_every_documented_command_runs(slurm_cluster, slurm_jobs, tiny_llama_checkpoint, nemo_rl_configs,
                                       slurm_scratch: Path) -> None:
    work = slurm_scratch / "work"
    work.mkdir()
    subs = substitutions(slurm_scratch, tiny_llama_checkpoint, nemo_rl_configs)
    all_blocks = blocks()
    for block in all_blocks:
        if block.kind == "file":
            (work / block.arg).write_text(_substituted(block.body, subs))
    (work / "site.yaml").write_text(TEST_SITE)
    env_file = work / ".env.sh"
    bin_dir = _tools(slurm_scratch / "bin")
    os.environ.pop("PODIUM_RENDEZVOUS", None)
    env_file.write_text("")
    base_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                "COLUMNS": "200"}
    ordered = [b for b in all_blocks if b.runs and b.kind != "last"] + [b for b in all_blocks if b.kind == "last"]
    timings = []
    try:
        for n, block in enumerate(ordered):
            body = _substituted(block.body, subs)
            if block.lang == "bash":
                script = f'set -aeo pipefail\nsource "{env_file}"\n{body}\nexport -p > "{env_file}"\n'
            else:
                (work / f"block{n}.py").write_text(body)
                script = f'set -eo pipefail\nsource "{env_file}"\nexec python block{n}.py\n'
            t0 = time.monotonic()
            proc = subprocess.run(["bash", "-c", script], cwd=work, env=base_env, capture_output=True, text=True,
                                  timeout=BLOCK_TIMEOUT_S)
            took = time.monotonic() - t0
            timings.append((f"{block.page}:{block.line}", block.first_line[:70], took, block.body))
            print(f"--- {block.page}:{block.line} ({took:.1f}s, exit {proc.returncode})\n{body}\n{proc.stdout[-3000:]}")
            assert proc.returncode == 0, (f"{block.page}:{block.line} exited {proc.returncode}:\n{body}\n"
                                          f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    finally:
        # whatever failed, no teacher of this test keeps its node
        run_dir = slurm_scratch / "mopd-run"
        if run_dir.is_dir():
            subprocess.run([sys.executable, "-m", "podium.cli", "down", str(run_dir)], env=base_env,
                           capture_output=True, timeout=300)
        print("\n".join(f"{took:6.1f}s  {where}  {first}" for where, first, took, _ in timings))
    up = [took for _, _, took, body in timings if "podium up" in body and "--wait" in body]
    print(f"{len(ordered)} blocks run; podium up --wait took {up[0]:.1f}s" if up else "no up --wait")
    assert len(up) == 1, "one teacher comes up once, for every block"
