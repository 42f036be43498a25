"""podium: launch distillation teachers on Slurm, once, and let every trainer find them.

Importing ``podium`` is cheap: it must not pull torch, ray or megatron, so that login-node
commands (``podium --help``, ``plan``, ``status``, ``down``) answer at once. Heavy parts are
imported lazily by the modules that need them.
"""

__version__ = "0.1.0"
