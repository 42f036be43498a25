"""``podium doctor``: what a first run needs, checked before anything is submitted.

Each check is a small function that returns :class:`~podium.launcher.login.doctor.base.Check` rows (✔ pass,
✘ fail with the fix, – not checked because an earlier check failed).
:func:`~podium.launcher.login.doctor.checks.run_doctor` picks them by cluster kind:

=================  =========================================================================
check              ``cluster: slurm``
=================  =========================================================================
``slurm``          ``sinfo`` and ``squeue`` answer (the controller is reachable)
``sacct``          accounting answers (podium asks ``sacct`` about jobs that left the queue)
``partition``      per partition the plan uses: it exists, is up, has ``num_nodes`` usable
                   nodes, gres ``gpu`` of ``gpus_per_node`` where GPUs are asked, a time limit
                   at or above ``slurm.time``
``checkpoints``    the plan's checkpoint problems (what ``up`` refuses)
``test job``       one short ``srun`` job (one node, one task, 2 minutes) in the first
                   teacher's partition, account and QOS, with its ``setup`` lines, container and
                   interpreter; it reports the rows below
``run dir``        the job wrote a file in the run dir that this machine then reads back
``python``         the node's interpreter and its version, against this one's
``podium``         ``import podium`` on the node: its version and path, against this one's
``packages``       what a teacher's node task imports (torch, megatron-core, Ray, transformers,
                   ...), found by the node's interpreter, with their versions; and submitit here,
                   which ``up`` submits with
``ports``          ``ray.port_range`` has a free block and ``server.port_range`` a free port
                   on the node (the same functions the teacher uses, so the same errors)
``address``        the address Ray and the endpoint use there (``ray.interface``,
                   ``server.interface``, else the node's hostname)
=================  =========================================================================

With ``cluster: local``: ``teacher <name>`` (the local backend's own rules: one node, CUDA devices against
``gpus_per_node``), ``checkpoints``, ``run dir`` (writable here), ``packages`` (of the interpreter the
job runs: ``slurm.python``, else this one), ``ports`` and ``address`` here.

Nothing here changes the run dir beyond a ``.doctor/`` folder it removes again.

Every module opens with what it owns; ``probe`` is the program the test job runs on the node,
standalone (a node's Python may be older than podium's).
"""
