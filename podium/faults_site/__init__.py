"""A ``sitecustomize`` for fault injection only (``PODIUM_FAULTS slow_ray_agent_rank``, see
:mod:`podium.faults`): its folder is put on the ``PYTHONPATH`` of one node's first ``ray start``,
never anywhere else."""
