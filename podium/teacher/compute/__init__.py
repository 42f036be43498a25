"""The teacher's compute: the worker group on Ray and each rank's worker (model stage, logprob head,
pipeline stage loop), and the micro-batch plan every rank of a replica runs."""
