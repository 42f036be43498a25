"""What an ended generation of a teacher may leave behind, found from its node records and removed.

Every node task records, in ``nodes/<job>-<restart>/<rank>.json``, its host, its own process
(PID + start time), its ``ray start`` session and its per-job Ray temp dir. A task that Slurm
SIGKILLs (``KillWait`` after a cancel or a requeue, before its teardown reached the cleanup) leaves
its temp dir on the node. :func:`sweep_temp_dirs` removes the temp dirs of ended generations of
one teacher that are reachable from where it runs:

- every node task sweeps at start (before starting Ray): a requeued job cleans what its previous
  generation left on the node it lands on;
- ``podium down`` sweeps once the jobs have ended (on a machine that sees the nodes' temp dirs,
  like the test cluster; on a real cluster a login node sees none of them and this is a no-op).

Records are read through :class:`podium.launcher.common.node_files.NodeState` (a damaged one is skipped
with a warning; one a newer podium wrote is an error naming it). A temp dir is removed only when it
is the one a node record names, its name is a podium temp dir name (``podium-<job>-<restart>-<rank>``)
of that record's generation, and no process the record names (task, ``ray start`` session) is alive.
:func:`run_processes` lists those processes, for checks that nothing of a run is left.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from podium.launcher.common.files import NODES_DIR, TeacherFiles
from podium.launcher.common.node_files import NodeState, read_node_state
from podium.launcher.common.procs import session_alive
from podium.rendezvous.atomic import NEWER, FileReadError

logger = logging.getLogger(__name__)

_GEN_DIR = re.compile(r"(\d+)-(\d+)")
_NODE_FILE = re.compile(r"(\d+)\.json")


@dataclass(frozen=True)
class NodeRecord:
    """One node task of one generation: where its ``<rank>.json`` is, and what it says (``node``)."""

    path: Path
    job_id: str
    restart: int
    rank: int
    node: NodeState

    @property
    def generation(self) -> tuple[str, int]:
        return self.job_id, self.restart

    @property
    def temp(self) -> Path | None:
        return self.node.temp_dir

    def live_pids(self) -> list[int]:
        """PIDs of the record's processes still alive on this machine (task, Ray session)."""
        out = []
        task = self.node.task
        if task is not None and task.alive():
            out.append(task.pid)
        if self.node.ray is not None and self.node.ray.pid:
            out += session_alive(self.node.ray.ref)
        return sorted(set(out))


def node_records(files: TeacherFiles) -> Iterator[NodeRecord]:
    """Every node record of every generation of the teacher (unreadable ones are skipped)."""
    root = files.folder / NODES_DIR
    if not root.is_dir():
        return
    for gen_dir in sorted(root.iterdir()):
        gen = _GEN_DIR.fullmatch(gen_dir.name)
        if gen is None or not gen_dir.is_dir():
            continue
        for node_file in sorted(gen_dir.iterdir()):
            rank = _NODE_FILE.fullmatch(node_file.name)
            if rank is None:
                continue
            try:
                node = read_node_state(node_file)
            except FileReadError as exc:
                if exc.kind == NEWER:
                    raise
                logger.warning("skipping node record %s: %s", node_file, exc)
                continue
            yield NodeRecord(node_file, gen.group(1), int(gen.group(2)), int(rank.group(1)), node)


def is_podium_temp_dir(path: Path, job_id: str, restart: int, rank: int) -> bool:
    return path.name == f"podium-{job_id}-{restart}-{rank}"


def sweep_temp_dirs(files: TeacherFiles, keep: tuple[str, int] | None = None) -> list[Path]:
    """Remove the Ray temp dirs of ended generations of this teacher that exist here.

    ``keep`` is the generation ``(job_id, restart)`` of the caller (never swept). Returns what
    was removed.
    """
    removed = []
    for rec in node_records(files):
        if keep is not None and rec.generation == (str(keep[0]), int(keep[1])):
            continue
        temp = rec.temp
        if temp is None or not temp.exists():
            continue
        if not is_podium_temp_dir(temp, rec.job_id, rec.restart, rec.rank):
            logger.warning("%s names temp dir %s, which is not podium's name for generation %s:%d rank %d;"
                           " left alone", rec.path, temp, rec.job_id, rec.restart, rec.rank)
            continue
        alive = rec.live_pids()
        if alive:
            logger.info("temp dir %s still in use by %s: left alone", temp, alive)
            continue
        shutil.rmtree(temp, ignore_errors=True)
        if temp.exists():
            logger.warning("could not remove %s", temp)
            continue
        logger.info("removed %s, left by generation %s:%d (rank %d)", temp, rec.job_id, rec.restart, rec.rank)
        removed.append(temp)
    return removed


def run_processes(files: TeacherFiles) -> dict[str, list[int]]:
    """Live processes each node record of the teacher names: ``{"<job>-<restart>/<rank>": [pids]}``."""
    out = {}
    for rec in node_records(files):
        alive = rec.live_pids()
        if alive:
            out[f"{rec.job_id}-{rec.restart}/{rec.rank}"] = alive
    return out
