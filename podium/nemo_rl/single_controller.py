"""NeMo RL's SingleController setup, unchanged, on podium's teachers.

NeMo RL's SingleController (``nemo_rl/algorithms/single_controller_utils/setup.py``, NVIDIA-NeMo/RL
#3768) requires ``on_policy_distillation.non_colocated_teachers.enabled=true`` and builds the teachers
itself, through the module ``nemo_rl.algorithms.opd``: it subtracts
``_non_colocated_teacher_node_count(master_config)`` nodes from the trainer's cluster, calls
``opd.reserve_teacher_clusters(master_config, ...)`` and, if that returned any,
``opd.create_teacher_worker_groups(master_config, policy_config, tokenizer, teacher_clusters=...)``,
then ``group.setup_data_plane(dp_cfg)`` on each group, and pickles the groups into its actor.

Owns :func:`single_controller_teachers`, the context manager under which those three names answer
for podium's run instead (restored after the block): no node is subtracted, no placement group
reserved (one :class:`NoCluster` per teacher stands for its cluster), and the groups are
:class:`~podium.nemo_rl.tq_group.RemoteTQTeacherGroup` facades of the run's ready teachers;
and :func:`single_controller_groups`, which builds them from a master config and, with
``on_policy_distillation.full.enabled``, refuses at setup a payload a teacher does not offer
(:func:`check_payload_offered`: its metadata's ``payloads`` entry says why).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podium.client.options import ClientOptions
from podium.nemo_rl.tq_group import FullPayload, RemoteTQTeacherGroup, nemo_rl_data_plane_client
from podium.nemo_rl.wiring import MAPPING_KEY, SECTION, NemoRLWiringError, plain_dict, ready_teachers
from podium.protocol.names import HIDDEN_STATES, PAYLOAD_DATATYPE, PAYLOAD_DATATYPES

logger = logging.getLogger(__name__)

OPD_MODULE = "nemo_rl.algorithms.opd"
SETUP_MODULE = "nemo_rl.algorithms.single_controller_utils.setup"


@dataclass(frozen=True)
class NoCluster:
    """What NeMo RL's setup holds for a podium teacher's cluster: nothing is reserved, so there is
    nothing to shut down (NeMo RL calls ``shutdown()`` on its clusters when a reservation fails)."""

    alias: str

    def shutdown(self) -> bool:
        return True


def _opd_section(master_config: Any) -> dict[str, Any]:
    """The master config's ``on_policy_distillation`` as a plain dict (a dict, NeMo RL's
    ``MasterConfig`` with its pydantic section, or an OmegaConf node)."""
    if isinstance(master_config, Mapping):
        section = master_config.get(SECTION)
    else:
        section = getattr(master_config, SECTION, None)
    if section is None:
        raise NemoRLWiringError(f"{SECTION}: the master config has none; podium's SingleController teachers "
                                "serve on-policy distillation")
    return plain_dict(section)


def _policy_section(master_config: Any) -> dict[str, Any]:
    if isinstance(master_config, Mapping):
        policy = master_config.get("policy")
    else:
        policy = getattr(master_config, "policy", None)
    return plain_dict(policy) if policy is not None else {}


def check_payload_offered(alias: str, metadata: Mapping[str, Any], full: FullPayload) -> None:
    """Refuse full-vocabulary MOPD at setup where teacher ``alias`` (its model ``metadata``) does not
    offer ``full``'s payload in its dtype, with the teacher's reason (a teacher whose logits are not
    ``output_layer(h)`` refuses hidden states: the student would rebuild the wrong distribution)."""
    podium = metadata.get("podium") or {}
    payloads = podium.get("payloads")
    where = f"{SECTION}.full (teacher_payload={full.payload}, payload_dtype={full.dtype})"
    if not isinstance(payloads, Mapping):
        raise NemoRLWiringError(f"{where}: teacher {alias!r} serves no full-vocabulary payloads (its podium "
                                "predates them); restart the run's teachers with this podium")
    refusal = payloads.get("hidden_states_refused")
    if full.payload == HIDDEN_STATES and refusal:
        raise NemoRLWiringError(f"{where}: teacher {alias!r} refuses hidden states: {refusal}; set "
                                f"{SECTION}.full.teacher_payload=logits")
    offered = (podium.get("parameters") or {}).get(PAYLOAD_DATATYPE, list(PAYLOAD_DATATYPES))
    if full.datatype not in offered:
        raise NemoRLWiringError(f"{where}: teacher {alias!r} offers payloads in {', '.join(offered)} only")


def single_controller_groups(
    rendezvous_path: str | Path,
    master_config: Any,
    policy_config: Mapping[str, Any] | None = None,
    *,
    ready_timeout_s: float | None = None,
    options: ClientOptions | None = None,
    data_plane_client: Callable[[Any], Any] = nemo_rl_data_plane_client,
) -> tuple[dict[str, RemoteTQTeacherGroup], dict[str, str]]:
    """``(groups, alias_to_group_alias)`` as NeMo RL's ``create_teacher_worker_groups`` returns
    them, for the teachers of ``rendezvous_path`` that ``master_config``'s recipe maps, once they
    are ready. ``policy_config``: the student's (default: the master config's ``policy``), the
    template of each group's ``cfg``; ``data_plane_client``: see :class:`RemoteTQTeacherGroup`."""
    opd_cfg = _opd_section(master_config)
    policy = dict(policy_config) if policy_config is not None else _policy_section(master_config)
    full = FullPayload.of(policy, opd_cfg)
    models, alias_to_group_alias, used = ready_teachers(rendezvous_path, opd_cfg, ready_timeout_s=ready_timeout_s,
                                                        options=options)
    checkpoints = {alias: str(opd_cfg[MAPPING_KEY][alias]) for alias in models}
    # NeMo RL's teacher_index: the rank of (checkpoint, alias) among the deduplicated teachers
    ranked = sorted(models, key=lambda alias: (checkpoints[alias], alias))
    groups = {
        alias: RemoteTQTeacherGroup(rendezvous_path, alias, model_name=checkpoints[alias],
                                    teacher_index=ranked.index(alias), cfg=policy, full=full,
                                    data_plane_client=data_plane_client, options=used, model=model)
        for alias, model in models.items()
    }
    if full is not None:
        for alias, group in groups.items():
            check_payload_offered(alias, group.teacher().metadata(), full)
    return groups, alias_to_group_alias


@contextlib.contextmanager
def single_controller_teachers(
    rendezvous_path: str | Path,
    *,
    ready_timeout_s: float | None = None,
    options: ClientOptions | None = None,
    data_plane_client: Callable[[Any], Any] = nemo_rl_data_plane_client,
) -> Iterator[None]:
    """Within the block, NeMo RL's SingleController setup gets podium's teachers::

        with podium.nemo_rl.single_controller_teachers("/shared/run/rendezvous.json"):
            actor_args, timings = setup_single_controller(master_config, tokenizer)

    The teachers are waited for when the setup reserves them (``ready_timeout_s``, default the
    client's); the keywords are :func:`single_controller_groups`'."""
    import importlib

    opd = importlib.import_module(OPD_MODULE)
    setup = importlib.import_module(SETUP_MODULE)
    served: dict[str, Any] = {}

    def reserve_teacher_clusters(master_config: Any, **_: Any) -> dict[str, NoCluster]:
        served["groups"] = single_controller_groups(rendezvous_path, master_config, ready_timeout_s=ready_timeout_s,
                                                    options=options, data_plane_client=data_plane_client)
        return {alias: NoCluster(alias) for alias in served["groups"][0]}

    def create_teacher_worker_groups(master_config: Any, policy_config: Mapping[str, Any], tokenizer: Any = None, *,
                                     teacher_clusters: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        groups, alias_to_group_alias = single_controller_groups(
            rendezvous_path, master_config, policy_config, ready_timeout_s=ready_timeout_s, options=options,
            data_plane_client=data_plane_client)
        if set(teacher_clusters) != set(groups):
            raise NemoRLWiringError(f"the teachers reserved ({sorted(teacher_clusters)}) are not the run's "
                                    f"({sorted(groups)})")
        logger.info("podium teachers for NeMo RL's SingleController: %s", ", ".join(groups))
        return dict(groups), alias_to_group_alias

    replaced = {(opd, "reserve_teacher_clusters"): reserve_teacher_clusters,
                (opd, "create_teacher_worker_groups"): create_teacher_worker_groups,
                (setup, "_non_colocated_teacher_node_count"): lambda master_config: 0}
    originals = {target: getattr(*target) for target in replaced}
    for (module, name), value in replaced.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for (module, name), value in originals.items():
            setattr(module, name, value)
