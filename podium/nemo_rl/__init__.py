"""podium.nemo_rl: podium's teachers where NeMo RL holds its own, unchanged.

- :func:`teacher_worker_groups` ``(rendezvous_path, opd_cfg) -> (groups, alias_to_group_alias)``:
  what NeMo RL's MOPD setup returns, for ``async_grpo_train``.
- :func:`distillation_teacher` ``(rendezvous_path, alias=None)``: what NeMo RL's distillation loop
  holds as ``teacher_policy``; :func:`distillation_policy` makes NeMo RL's ``setup`` build it.
- :func:`single_controller_teachers` ``(rendezvous_path)``: a context manager under which NeMo RL's
  SingleController setup builds :class:`RemoteTQTeacherGroup` facades (TransferQueue in and out)
  instead of reserving teacher nodes; :func:`single_controller_groups` builds them.
- The facades: :class:`RemoteTeacherWorkerGroup`, :class:`RemoteDistillationTeacher`, on one lazy,
  picklable connection each, or on a client the trainer holds:
  ``RemoteTeacherWorkerGroup.from_client(client, alias, top_k=None)``.

Importing this package imports neither NeMo RL nor torch (it works on podium's light install);
the facades' calls need torch: results are ``BatchedDataDict`` where NeMo RL is importable, else
dicts of torch tensors.
"""

from podium.nemo_rl.distillation import RemoteDistillationTeacher
from podium.nemo_rl.remote import Sharding
from podium.nemo_rl.single_controller import single_controller_groups, single_controller_teachers
from podium.nemo_rl.tq_group import RemoteTQTeacherGroup
from podium.nemo_rl.wiring import NemoRLWiringError, distillation_policy, distillation_teacher, teacher_worker_groups
from podium.nemo_rl.worker_group import RemoteTeacherWorkerGroup

__all__ = [
    "NemoRLWiringError",
    "RemoteDistillationTeacher",
    "RemoteTQTeacherGroup",
    "RemoteTeacherWorkerGroup",
    "Sharding",
    "distillation_policy",
    "distillation_teacher",
    "single_controller_groups",
    "single_controller_teachers",
    "teacher_worker_groups",
]
