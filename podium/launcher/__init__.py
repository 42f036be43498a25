"""podium.launcher: getting teachers onto a cluster and keeping them there.

The launcher runs in two places, and its packages say which:

- :mod:`podium.launcher.login`: what runs where a person or a trainer job types ``podium`` (a login
  node): ``up``, ``scale``, ``logs``, ``status``/``wait``, ``down``, ``doctor``, the run directory and
  the submission of each teacher's job;
- :mod:`podium.launcher.job`: what runs inside a teacher's job, on every node of its allocation
  (``python -m podium.launcher.job.node_entry``): the node's Ray, rank 0's group and endpoint, the
  teacher's lifecycle, the watchdog, the stop signals;
- :mod:`podium.launcher.common`: what both read and write, the run directory's files above all
  (a teacher's folder, job and node records, stop requests, the restart ledger), and the tools both
  use (processes, Slurm's text).

:mod:`podium.launcher.backends` is each cluster kind, split the same way: its ``Scheduler``
(``<kind>/scheduler.py``) is login-side, its ``JobEnvironment`` (``<kind>/environment.py``) job-side,
and the registry and base classes are common; a kind's modules are imported when it is first asked for.

The import rule (``tests/test_structure.py``): the job side never imports the login side (a job loads
no CLI, renderer or submission code); the login side never imports the job side, except where that
test names why; ``common`` imports neither.
"""
