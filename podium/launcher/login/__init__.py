"""The launcher on the login side: the logic of ``podium up / scale / logs / status / wait / down /
doctor`` (the CLI only parses and prints), the run directory, and the submission of each teacher's
job. Never imported by :mod:`podium.launcher.job`; see :mod:`podium.launcher` for the rule."""
