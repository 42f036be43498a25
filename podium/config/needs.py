"""What a planned teacher needs from the cluster, in words: what ``podium plan`` states per teacher.

The plan's table says the layout; these lines say what it takes to run it, where a recipe asks for
more than GPUs: a tensor-parallel group wider than a node, experts sharded over nodes, context
parallelism (TransformerEngine on CUDA), DeepEP. From the ``TeacherSpec``, and, where the
checkpoint's ``config.json`` is readable here (a local directory: a login node need not see it; a
hub id: its pinned snapshot in the local HF cache), what its architecture asks for at that layout
(:func:`podium.config.architecture.architecture_needs`: the Mamba kernels of a Nemotron-H, fewer KV
groups than TP, experts per rank); what the checkpoint itself allows is checked by
``podium.config.checkpoints``.
"""

from __future__ import annotations

from pathlib import Path

from podium.config.checkpoints import checkpoint_needs
from podium.config.spec import TeacherSpec


def teacher_needs(spec: TeacherSpec) -> list[str]:
    """One line per requirement of ``spec``, the allocation first."""
    s = spec
    gpus = s.num_nodes * s.gpus_per_node
    tp, pp, cp = s.tensor_model_parallel_size, s.pipeline_model_parallel_size, s.context_parallel_size
    ep, etp = s.expert_model_parallel_size, s.expert_tensor_parallel_size
    gpu_word = "GPUs" if s.launcher.slurm.gpus else "CPU worker slots"
    lines = [f"{s.num_nodes} node(s) × {s.gpus_per_node} = {gpus} {gpu_word} in one allocation, "
             f"{s.precision}; one copy of the model is TP{tp}·PP{pp}·CP{cp} = {tp * pp * cp} of them, "
             f"DP{s.data_parallel_size} copies in the allocation"]
    if s.launcher.replicas > 1:
        n = s.launcher.replicas
        lines.append(f"{n} replicas: {n} such allocations ({n * s.num_nodes} node(s), {n * gpus} {gpu_word} in all), "
                     "each its own job and generation; clients spread their calls over the ready ones")
    if tp > s.gpus_per_node:
        lines.append(f"TP{tp} is wider than a node ({s.gpus_per_node} per node): tensor-parallel all-reduces "
                     "cross the network every layer (a fast interconnect, or TP <= gpus_per_node)")
    if ep * etp > 1:
        per_stage = gpus // pp
        lines.append(f"EP{ep}·ETP{etp}: each expert group spans {ep * etp} of the {per_stage} ranks of a pipeline "
                     f"stage ({-(-ep * etp // s.gpus_per_node)} node(s)); the model's experts must be a multiple "
                     f"of {ep}, and every forward exchanges tokens between those ranks (all-to-all)")
    if cp > 1:
        lines.append(f"CP{cp}: context parallelism needs TransformerEngine's attention on CUDA: the compute "
                     "nodes' Python must import transformer_engine (podium refuses CP > 1 without it)")
    overrides = s.megatron_cfg_overrides
    dispatcher = overrides.get("moe_token_dispatcher_type")
    if dispatcher == "flex":
        backend = overrides.get("moe_flex_dispatcher_backend", "deepep")
        lines.append(f"moe_token_dispatcher_type=flex ({backend}): needs {backend} installed on the compute nodes")
    elif dispatcher and ep * etp > 1:
        lines.append(f"moe_token_dispatcher_type={dispatcher} on GPU (on CPU podium uses alltoall, or "
                     "allgather where expert-TP > TP)")
    if Path(s.model_name).is_absolute() or s.revision:  # a hub id without one is not in the cache
        lines.extend(checkpoint_needs(s.model_name, s, s.revision))
    return lines
