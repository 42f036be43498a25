"""The launcher inside a teacher's job: what every node task runs, from its entry
(``python -m podium.launcher.job.node_entry``) to the teardown. Imports no login-side module (no CLI,
renderer or submission code); see :mod:`podium.launcher` for the rule."""
