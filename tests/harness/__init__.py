"""What the tests share besides fixtures: stand-ins, recipes, waits and client loops.

Imported as ``harness.<module>`` (``tests/`` is on ``sys.path``); fixtures live in ``tests/fixtures/``.

- :mod:`harness.poll`: ``wait_for``, the tests' one "is it there yet?" loop (over ``podium.poll``);
- :mod:`harness.recipes`: ``write_recipe``, a small recipe for a test run;
- :mod:`harness.fake_backend`: a fake Slurm scheduler registered for one test;
- :mod:`harness.fake_group`, :mod:`harness.run`, :mod:`harness.lifecycle`: a numpy worker group, a
  run directory, a group served and published by the real teacher lifecycle;
- :mod:`harness.infer_requests`: OIP request bodies and the table of bad requests;
- :mod:`harness.endpoint`: an endpoint serving a stand-in group, and the endpoint tests' calls to it;
- :mod:`harness.client_loop`: a trainer's checked ``get_logprobs`` loop in a thread;
- :mod:`harness.cli`: the ``podium`` CLI run as a user runs it;
- :mod:`harness.slurm_run`, :mod:`harness.faults`: job ids, oracle checks and preemption on the Slurm
  test cluster;
- :mod:`harness.teacher_groups`: a real worker group started for a test and its oracle checks;
- :mod:`harness.nemo_rl_callers`: NeMo RL's distillation callers, as the drop-in tests drive them.
"""
