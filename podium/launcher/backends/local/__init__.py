"""The ``local`` cluster kind: one node on this machine, under submitit's local controller;
:mod:`.scheduler` starts, finds and stops the controller, :mod:`.environment` is its one task."""
