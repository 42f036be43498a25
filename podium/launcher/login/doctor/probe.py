"""The program of ``podium doctor``'s test job, run on a compute node.

:func:`podium.launcher.login.doctor.probe_job.probe_command` sends this file's text with ``python -c``, so
the node needs only an interpreter, not this file at the login node's path. Nothing of podium is
imported before the ``import podium`` that is one of the checks: a node without podium still
reports its interpreter and writes its file (the run dir's check does not depend on the import).
It is written for old interpreters too (no f-strings, quoted annotations), so a wrong Python
reports its version rather than failing to compile or define a function.

Argument: one JSON object (``token``; ``out``, the file to write in the run dir; ``settings``, a
``TeacherLauncherSettings`` dump; ``packages``, the modules a teacher's node task imports, each
with the distribution that installs it). Output: the report, written atomically to ``out`` and printed
as one stdout line after :data:`PROBE_MARK` (the job's stdout is how it answers, hence ``print``).
"""

import json
import os
import socket
import sys
from typing import Any

PROBE_MARK = "PODIUM-DOCTOR "


def packages(wanted: "dict[str, str]") -> "dict[str, Any]":
    """Each module of ``wanted`` (module -> distribution) with its distribution's version ("?" when
    unknown), None where this Python cannot find it; found by ``find_spec``, nothing imported."""
    import importlib.util

    found = {}  # type: dict[str, Any]
    for module, dist in wanted.items():
        try:
            spec = importlib.util.find_spec(module)
        except Exception:  # noqa: BLE001 (a missing or broken parent package: not importable here)
            spec = None
        if spec is None:
            found[module] = None
            continue
        try:
            from importlib.metadata import version

            found[module] = version(dist)
        except Exception:  # noqa: BLE001 (no metadata, or a Python before 3.8: found, version unknown)
            found[module] = "?"
    return found


def probe(args: "dict[str, Any]") -> "dict[str, Any]":
    """What this node says: host, interpreter and version, the teacher's packages, then podium and
    the node checks (or why podium does not import)."""
    report = {"token": args["token"], "host": socket.gethostname(), "python": sys.executable,
              "version": list(sys.version_info[:3]), "packages": packages(args.get("packages") or {})}
    try:
        import podium

        report["podium"] = {"file": podium.__file__, "version": podium.__version__}
        from podium.launcher.login.doctor.node import node_checks

        report["checks"] = node_checks(args["settings"])
    except Exception as exc:  # noqa: BLE001 (whatever stops podium on this node is what its row reports)
        report["import_error"] = "{}: {}".format(type(exc).__name__, exc)  # noqa: UP032 (no f-strings, see above)
    return report


def write_report(report: "dict[str, Any]", out: str) -> None:
    """``report`` to ``out`` (temp file, fsync, replace); a failure is added to ``report``."""
    try:
        with open(out + ".tmp", "w") as f:
            json.dump(report, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(out + ".tmp", out)
    except OSError as exc:
        report["write_error"] = str(exc)


def main(argv: "list[str]") -> None:
    args = json.loads(argv[1])
    report = probe(args)
    write_report(report, args["out"])
    print(PROBE_MARK + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(sys.argv)
