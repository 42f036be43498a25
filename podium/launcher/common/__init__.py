"""What the login side and the job both use: the run directory's files (their layout and records)
and small tools (processes, Slurm's text). Imports neither :mod:`podium.launcher.login` nor
:mod:`podium.launcher.job`; see :mod:`podium.launcher` for the rule."""
