"""podium.launcher: getting teachers onto a cluster and keeping them there.

On a login node: ``run_dir`` (the run directory from a plan), ``submission`` (submit each teacher
once), ``backends`` (each cluster kind's scheduler: materialise, submit, states, cancel), ``jobs``
(``job.json``), ``commands`` (up / scale / logs), ``status`` (status / wait), ``stop`` (down),
``selection`` (the words that name a teacher), ``stop_request``, ``claims``, ``slurm_state`` (Slurm's
text), ``doctor``.
In the allocation: ``node_entry`` (every task, told where it runs by its kind's job environment),
``node_run`` (every node: its record, Ray node, teardown), ``head_run`` (rank 0: the group, serving,
the next generation), ``node_files`` (``<rank>.json``, ``head.json``), ``lifecycle`` (the endpoint
record's one publisher), ``restarts``, ``watchdog``, ``signals``, ``faults`` (test hooks),
``ray_bootstrap``, ``procs``, ``cleanup``.
"""
