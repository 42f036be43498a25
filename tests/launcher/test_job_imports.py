"""What a teacher's job loads: its entry (``podium.launcher.job.node_entry``) and its kind's job
environment import no login-side code, so a node task loads no CLI, no sbatch renderer and no
submission logic. The rule between the launcher's sides, module by module: ``tests/test_structure.py``."""

from __future__ import annotations

import ast
import subprocess
import sys

# what only the login side needs: the CLI and its libraries, the renderer, the schedulers
LOGIN_ONLY = ("jinja2", "typer", "rich", "podium.cli", "podium.launcher.login",
              "podium.launcher.backends.slurm.scheduler", "podium.launcher.backends.local.scheduler")

LOADED = ("\nimport sys\n"
          "print(sorted(m for m in sys.modules if any(m == x or m.startswith(x + '.') for x in sys.argv[1:])))\n")


def _loaded(statements: str, *prefixes: str) -> list[str]:
    """The modules under ``prefixes`` a fresh interpreter holds after running ``statements``."""
    out = subprocess.run([sys.executable, "-c", statements + LOADED, *prefixes], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return ast.literal_eval(out.stdout.strip())


def test_the_job_entry_imports_no_login_side_code() -> None:
    loaded = _loaded("import podium.launcher.job.node_entry\n"
                     "from podium.launcher.backends import environment_for\n"
                     "environment_for('slurm'); environment_for('local')\n", *LOGIN_ONLY)
    assert loaded == [], f"the job entry loaded login-side modules: {loaded}"


def test_the_login_side_loads_them() -> None:
    """The names above are the modules the login side does load (the check above is not vacuous)."""
    loaded = _loaded("import podium.cli\n"
                     "from podium.launcher.backends import scheduler_for\n"
                     "scheduler_for('slurm'); scheduler_for('local')\n"
                     "import podium.launcher.login.doctor.report\n", *LOGIN_ONLY)
    assert {"jinja2", "typer", "rich", "podium.cli", "podium.launcher.backends.slurm.scheduler",
            "podium.launcher.backends.local.scheduler", "podium.launcher.login.sbatch_errors"} <= set(loaded), loaded
