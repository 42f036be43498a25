"""Full-vocabulary MOPD's settings on podium's SingleController facades, without a teacher: NeMo
RL's ``on_policy_distillation.full`` keys (``OnPolicyDistillationFullConfig``, the setup's resolved
``policy["on_policy_distillation_full"]``) read as NeMo RL reads them, and a payload a teacher does not
offer refused at setup with the teacher's reason (the real teachers: ``test_single_controller.py``)."""

from __future__ import annotations

from typing import Any

import pytest

import podium.nemo_rl as pnr
from podium.nemo_rl.single_controller import check_payload_offered
from podium.nemo_rl.tq_group import FullPayload

REASON = "its logits are softcapped after the output layer (final_logit_softcapping=30)"


def metadata(refused: str | None = None, datatypes: tuple[str, ...] = ("BF16", "FP16", "FP32"),
             payloads: bool = True) -> dict[str, Any]:
    """What a teacher's ``GET /v2/models/<name>`` says of its payloads (podium/teacher/endpoint/metadata.py)."""
    podium: dict[str, Any] = {"parameters": {"payload_datatype": list(datatypes)}}
    if payloads:
        podium["payloads"] = {"hidden_size": 64, "hidden_states_refused": refused}
    return {"name": "llama", "podium": podium}


def test_the_recipes_full_section_read_with_nemo_rls_defaults() -> None:
    assert FullPayload.of({}, {}) is None
    assert FullPayload.of({}, {"full": {"enabled": False, "teacher_payload": "logits"}}) is None
    hidden = FullPayload.of({}, {"full": {"enabled": True}})
    assert hidden == FullPayload("hidden_states", "bfloat16", "teacher_full_hidden_states", "opd_full_teacher_index")
    assert hidden.datatype == "BF16"
    logits = FullPayload.of({}, {"full": {"enabled": True, "teacher_payload": "logits", "payload_dtype": "float32"}})
    assert logits == FullPayload("logits", "float32", "teacher_full_logits", None)  # no index for logits
    with pytest.raises(ValueError, match="payload_dtype: 'fp8'"):
        FullPayload.of({}, {"full": {"enabled": True, "payload_dtype": "fp8"}})
    with pytest.raises(ValueError, match="teacher_payload: 'topk'"):
        FullPayload.of({}, {"full": {"enabled": True, "teacher_payload": "topk"}})


def test_what_nemo_rls_setup_resolved_onto_the_policy_config_wins() -> None:
    """``setup.py`` puts ``{**full.model_dump(), "payload_field": ...}`` on the policy config the
    teacher groups copy; the teacher worker group reads the columns from it."""
    resolved = {"enabled": True, "teacher_payload": "hidden_states", "payload_dtype": "float16",
                "payload_field": "teacher_full_hidden_states", "teacher_index_field": "opd_full_teacher_index"}
    full = FullPayload.of({"on_policy_distillation_full": resolved}, {"full": {"enabled": True}})
    assert full == FullPayload("hidden_states", "float16", "teacher_full_hidden_states", "opd_full_teacher_index")
    without_index_key = {k: v for k, v in resolved.items() if k != "teacher_index_field"}
    assert FullPayload.of({"on_policy_distillation_full": without_index_key}, {}) == full


def test_a_payload_the_teacher_does_not_offer_is_refused_with_its_reason() -> None:
    hidden = FullPayload("hidden_states", "bfloat16", "teacher_full_hidden_states", "opd_full_teacher_index")
    logits = FullPayload("logits", "float32", "teacher_full_logits", None)
    check_payload_offered("math", metadata(), hidden)
    check_payload_offered("math", metadata(refused=REASON), logits)  # logits are served where hidden states are not
    with pytest.raises(pnr.NemoRLWiringError, match=r"teacher 'math' refuses hidden states: its logits are "
                                                    r"softcapped .*; set on_policy_distillation.full.teacher_payload"
                                                    r"=logits"):
        check_payload_offered("math", metadata(refused=REASON), hidden)
    with pytest.raises(pnr.NemoRLWiringError, match="teacher 'math' serves no full-vocabulary payloads"):
        check_payload_offered("math", metadata(payloads=False), hidden)
    with pytest.raises(pnr.NemoRLWiringError, match="teacher 'math' offers payloads in BF16 only"):
        check_payload_offered("math", metadata(datatypes=("BF16",)), logits)


class StubTeacher:
    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer

    def metadata(self) -> dict[str, Any]:
        return self.answer


def test_the_setup_asks_each_teacher_before_it_hands_the_groups_over(monkeypatch: pytest.MonkeyPatch) -> None:
    """``single_controller_groups`` (what the hooked ``create_teacher_worker_groups`` returns)
    refuses full.enabled at setup, naming the teacher, not at the first rollout."""
    answers = {"math": metadata(), "chat": metadata(refused=REASON)}
    monkeypatch.setattr(pnr.single_controller, "ready_teachers",
                        lambda *a, **k: ({"math": None, "chat": None}, {"math": "math", "chat": "chat"}, None))
    monkeypatch.setattr(pnr.RemoteTQTeacherGroup, "teacher", lambda self: StubTeacher(answers[self.alias]))
    config = {"policy": {}, "on_policy_distillation": {
        "teacher_model_by_agent_name": {"math": "/ckpt/a", "chat": "/ckpt/b"}, "full": {"enabled": True}}}
    with pytest.raises(pnr.NemoRLWiringError, match="teacher 'chat' refuses hidden states"):
        pnr.single_controller_groups("/run/rendezvous.json", config)
    config["on_policy_distillation"]["full"] = {"enabled": True, "teacher_payload": "logits"}
    groups, _ = pnr.single_controller_groups("/run/rendezvous.json", config)
    assert {alias: group.full.field for alias, group in groups.items()} == {"math": "teacher_full_logits",
                                                                            "chat": "teacher_full_logits"}
