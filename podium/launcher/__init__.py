"""podium.launcher: getting teachers onto a cluster and keeping them there.

On a login node: ``run_dir`` (the run directory from a plan), ``submission`` (submit each teacher
once), ``backends`` (each cluster kind's scheduler: materialise, submit, states, cancel), ``jobs``
(``job.json``), ``commands`` (up / status / wait / logs / down), ``slurm_state`` (Slurm's text).
In the allocation: ``node_entry`` (every task, told where it runs by its kind's job environment),
``lifecycle`` (the endpoint record's one publisher), ``signals``, ``ray_bootstrap``, ``procs``,
``cleanup``.
"""
