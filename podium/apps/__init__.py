"""Applications built on podium's public parts (not parts of the launcher): ``podium demo`` and the
toy trainer step that ``sbatch/trainer.sbatch`` runs by default."""
