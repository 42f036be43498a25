"""The ``slurm`` cluster kind: :mod:`.scheduler` on the login node (the sbatch script, sbatch,
squeue/sacct, scancel), :mod:`.environment` in the job (rank, requeue, what a stop means)."""
