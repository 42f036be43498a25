"""podium's client against in-process servers with stand-in groups: which teacher a row goes to,
several teachers in one call, NeMo RL's facade, the tokenizer check.

The model does not matter here (numpy stand-in groups with a known answer); the same client runs
against the real Megatron group in ``test_real_teacher.py``. One teacher's calls (restarts, the
retry rules): ``test_teacher_client.py``; its replicas: ``test_replicas.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from harness.fake_group import FakeGroup, fake_logprobs
from harness.lifecycle import Teacher
from harness.run import TeacherDef, make_run

import podium
from podium.client import TokenizerMismatchError, tokenizer_fingerprint
from podium.nemo_rl import RemoteTeacherWorkerGroup
from podium.protocol.tokenizer import fingerprint_from_pretrained
from podium.rendezvous import Generation, RoutingError

MATH = TeacherDef("a1a1a1a1a1a1", "math", ("math", "code"))
CHAT = TeacherDef("b2b2b2b2b2b2", "chat", ("chat",))
FAST = {"ready_timeout_s": 60.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}


class ShiftedGroup(FakeGroup):
    """A second teacher with another answer: the fake logprobs minus ``shift`` at valid positions."""

    def __init__(self, shift: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.shift = shift

    def compute(self, data: Any, query: Any) -> dict:
        out = super().compute(data, query)
        lp = out["logprobs"]
        out["logprobs"] = torch.where(lp != 0, lp - self.shift, lp)
        return out


def shifted(ids: np.ndarray, lengths: np.ndarray, shift: float) -> np.ndarray:
    lp = fake_logprobs(ids, lengths)
    return np.where(lp != 0, lp - shift, lp).astype(np.float32)


def batch(seed: int, rows: int = 4, seq: int = 16, vocab: int = 128) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, seq + 1, rows)
    ids = rng.integers(0, vocab, (rows, seq))
    ids[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    return ids, lengths


@pytest.fixture
def two_teachers(tmp_path: Path) -> Iterator[tuple[Path, Teacher, Teacher]]:
    layout, token = make_run(tmp_path, [MATH, CHAT], default_alias="chat")
    math = Teacher(ShiftedGroup(0.0), layout, MATH, token).start()
    chat = Teacher(ShiftedGroup(100.0), layout, CHAT, token, generation=Generation(2000, 0)).start()
    yield layout.rendezvous_path, math, chat
    math.stop()
    chat.stop()


def test_routing_and_concurrent_multi_teacher_order(two_teachers: tuple[Path, Teacher, Teacher]) -> None:
    path, math, chat = two_teachers
    with podium.connect(path, **FAST) as client:
        assert client.resolve("code") == MATH.key and client.resolve("some_agent") == CHAT.key
        ids, lengths = batch(1, rows=9)
        agents = ["math", "chat", "code", "unlisted_agent", "math", "chat", "code", "math", "chat"]
        expected = np.stack([shifted(ids[i:i + 1], lengths[i:i + 1],
                                     100.0 if a in ("chat", "unlisted_agent") else 0.0)[0]
                             for i, a in enumerate(agents)])
        # Each teacher's call waits in its group until the other teacher's call is there too: only
        # calls in flight at the same time get through (one after the other, the first times out).
        both_in_a_call = threading.Barrier(2, timeout=120)
        math.group.hold = chat.group.hold = both_in_a_call.wait
        try:
            for _ in range(2):  # the first call also connects
                out = client.get_logprobs_by_agent({"input_ids": torch.from_numpy(ids),
                                                    "input_lengths": torch.from_numpy(lengths)}, agents)
                assert out["logprobs"].dtype == torch.float32 and out["logprobs"].shape == ids.shape
                np.testing.assert_array_equal(out["logprobs"].numpy(), expected)
            topk = client.get_logprobs_by_agent({"input_ids": ids, "input_lengths": lengths}, agents, top_k=3)
        finally:
            math.group.hold = chat.group.hold = None
        assert not both_in_a_call.broken
        assert len(math.group.calls) == len(chat.group.calls) == 3  # one call per teacher and batch
        # each teacher got its own rows only, in their original order
        math_rows = [i for i, a in enumerate(agents) if a in ("math", "code")]
        np.testing.assert_array_equal(math.group.received[0]["input_ids"], ids[math_rows])
        np.testing.assert_array_equal(chat.group.received[0]["input_ids"],
                                      ids[[i for i in range(len(agents)) if i not in math_rows]])
        assert topk["topk_indices"].shape == (9, 16, 3)
        np.testing.assert_array_equal(topk["topk_indices"][:, :, 0].numpy(), ids % 128)
        with pytest.raises(ValueError, match="2 agent names for a batch of 9"):
            client.get_logprobs_by_agent({"input_ids": ids, "input_lengths": lengths}, ["math", "chat"])


def test_strict_routing_refuses_unknown_agents(tmp_path: Path) -> None:
    layout, _ = make_run(tmp_path, [MATH, CHAT], default_alias="chat", strict=True)
    with podium.connect(layout.rendezvous_path) as client, \
            pytest.raises(RoutingError, match="'unlisted' has no teacher and strict"):
        client.get_logprobs("unlisted", {"input_ids": [[1]], "input_lengths": [1]})


def test_facade_has_nemo_rl_shape(two_teachers: tuple[Path, Teacher, Teacher]) -> None:
    path, _, _ = two_teachers
    client = podium.connect(path)
    group = RemoteTeacherWorkerGroup.from_client(client, "code")
    ids, lengths = batch(2)
    out = group.get_logprobs({"input_ids": torch.from_numpy(ids), "input_lengths": torch.from_numpy(lengths)},
                             micro_batch_size=2)
    assert set(out) == {"reference_logprobs"}
    np.testing.assert_array_equal(out["reference_logprobs"].numpy(), fake_logprobs(ids, lengths))
    with_topk = RemoteTeacherWorkerGroup.from_client(client, "math", top_k=2)
    topk = with_topk.get_logprobs({"input_ids": ids, "input_lengths": lengths})
    assert set(topk) == {"reference_logprobs", "reference_topk_logprobs", "reference_topk_indices"}
    connections = list(client.teacher("code").replicas.last.transport._all)
    assert connections and all(conn.sock is not None for conn in connections)
    group.shutdown()
    group.shutdown()  # harmless when repeated
    with pytest.raises(RuntimeError, match="shut down"):
        group.get_logprobs({"input_ids": ids, "input_lengths": lengths})
    # the client's connections are its owner's, used by its other callers: a facade leaves them open
    assert all(conn.sock is not None for conn in connections)
    another = RemoteTeacherWorkerGroup.from_client(client, "math")
    again = another.get_logprobs({"input_ids": ids, "input_lengths": lengths})
    np.testing.assert_array_equal(again["reference_logprobs"].numpy(), fake_logprobs(ids, lengths))
    client.close()
    assert all(conn.sock is None for conn in connections)


def test_tokenizer_fingerprint_check(tmp_path: Path, tokenizers: tuple[Any, Any, Path]) -> None:
    teacher_tok, other_tok, saved = tokenizers
    fp = tokenizer_fingerprint(teacher_tok)
    assert fp.startswith("vocab-sha256:") and fp != tokenizer_fingerprint(other_tok)
    assert fingerprint_from_pretrained(saved) == (fp, len(teacher_tok))  # same from files as in memory
    assert fingerprint_from_pretrained(tmp_path) == (None, None)
    layout, token = make_run(tmp_path, [MATH], default_alias="math")
    teacher = Teacher(FakeGroup(vocab_size=64), layout, MATH, token,
                      config_overrides={"tokenizer_fingerprint": fp, "tokenizer_vocab_size": len(teacher_tok)}).start()
    try:
        client = podium.connect(layout.rendezvous_path, **FAST)
        info = client.check_tokenizer("code", teacher_tok, vocab_size=64)
        assert info["tokenizer_fingerprint"] == fp
        with pytest.raises(TokenizerMismatchError, match=r"'math' .*generation 1000:0: tokenizer fingerprint"):
            client.check_tokenizer("code", other_tok)
        with pytest.raises(TokenizerMismatchError, match="vocab size 64 != trainer's vocab size 65"):
            client.check_tokenizer("code", teacher_tok, vocab_size=65)
        client.close()
        # given at connect, the tokenizer is checked when each teacher is first reached
        with pytest.raises(TokenizerMismatchError, match="fingerprint"):
            podium.connect(layout.rendezvous_path, tokenizer=other_tok, **FAST).get_logprobs(
                "math", {"input_ids": [[1, 2]], "input_lengths": [2]})
        ok = podium.connect(layout.rendezvous_path, tokenizer=teacher_tok, **FAST)
        assert ok.get_logprobs("math", {"input_ids": [[1, 2]], "input_lengths": [2]})["logprobs"].shape == (1, 2)
        ok.close()
    finally:
        teacher.stop()
