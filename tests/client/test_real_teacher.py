"""The real Megatron ``TeacherWorkerGroup`` (Ray, CPU/gloo, tiny checkpoint) behind the endpoint.

Oracle: HF ``transformers`` on the same checkpoint (``fixtures.checkpoints``). One group per
checkpoint (``conftest.py``, shared with the other modules); the server in front of it is
restarted where a test needs that.

- podium's client and ``tritonclient.http``, JSON and binary tensors, logprobs and top-k = oracle;
- every bad request gets its 4xx, the next good request succeeds; auth;
- a running loop follows a restart (new generation, new port) and every answer is right;
- two real teachers called at once, rows back in the original order.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch
from fixtures.checkpoints import hf_oracle_log_softmax, hf_oracle_logits, hf_oracle_logprobs, random_batch
from harness.infer_requests import MAX_BODY, check_bad_requests_then_good
from harness.lifecycle import Teacher
from harness.payloads import assert_payload_matches, hf_full_logits, hf_hidden_states
from harness.poll import wait_for
from harness.run import LLAMA, QWEN, make_run

import podium
from podium.client import BatchError, ask
from podium.client.errors import TeacherRequestError
from podium.nemo_rl import RemoteTeacherWorkerGroup
from podium.rendezvous import Generation

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

ATOL = 5e-5
FAST = {"ready_timeout_s": 120.0, "poll_interval_s": 0.05, "max_poll_interval_s": 0.2}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, llama_group: Any) -> Iterator[tuple[Path, Teacher]]:
    layout, token = make_run(tmp_path_factory.mktemp("real"), [LLAMA, QWEN], default_alias="llama")
    teacher = Teacher(llama_group, layout, LLAMA, token, config_overrides={"max_body_bytes": MAX_BODY}).start()
    yield layout.rendezvous_path, teacher
    teacher.stop()


def oracle(checkpoint: Path, ids: Any, lengths: Any) -> np.ndarray:
    return hf_oracle_logprobs(checkpoint, ids, lengths).numpy()


def check_topk(checkpoint: Path, ids: Any, lengths: Any, values: np.ndarray, indices: np.ndarray) -> None:
    """Top-k at every valid position (1 .. length-1) equals torch.topk of the oracle's log-softmax."""
    full = hf_oracle_log_softmax(checkpoint, ids, lengths)
    k = values.shape[-1]
    ref_values, _ = torch.topk(full, k, dim=-1)
    for b, n in enumerate(np.asarray(lengths)):
        np.testing.assert_allclose(values[b, 1:n], ref_values[b, 1:n].numpy(), atol=ATOL)
        # the indices point at the values they claim (robust to near-ties in the order)
        picked = full[b, 1:n].gather(-1, torch.from_numpy(np.array(indices[b, 1:n], dtype=np.int64)))
        np.testing.assert_allclose(picked.numpy(), values[b, 1:n], atol=ATOL)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_podium_client_matches_the_oracle(run: tuple[Path, Teacher], tiny_llama_checkpoint: Path, binary: bool) -> None:
    path, _ = run
    batch = random_batch(256, [32, 17, 5, 1, 24], seq_len=32, seed=11)
    expected = oracle(tiny_llama_checkpoint, batch["input_ids"], batch["input_lengths"])
    with podium.connect(path, binary=binary, **FAST) as client:
        out = client.get_logprobs("math", batch)
        assert out["logprobs"].dtype == torch.float32 and tuple(out["logprobs"].shape) == (5, 32)
        np.testing.assert_allclose(out["logprobs"].numpy(), expected, atol=ATOL)
        top = client.get_logprobs("llama", batch, top_k=4, micro_batch_size=2)
        np.testing.assert_allclose(top["logprobs"].numpy(), expected, atol=ATOL)
        check_topk(tiny_llama_checkpoint, batch["input_ids"], batch["input_lengths"],
                   top["topk_logprobs"].numpy(), top["topk_indices"].numpy())
        facade = RemoteTeacherWorkerGroup.from_client(client, "some_unlisted_agent")  # default alias -> llama
        ref = facade.get_logprobs(batch, micro_batch_size=1)["reference_logprobs"]
        np.testing.assert_allclose(ref.numpy(), expected, atol=ATOL)
        facade.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            facade.get_logprobs(batch)
        # it closed this trainer's use of the teacher only: the teacher keeps serving
        np.testing.assert_allclose(client.get_logprobs("math", batch)["logprobs"].numpy(), expected, atol=ATOL)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_matches_the_oracle(run: tuple[Path, Teacher], tiny_llama_checkpoint: Path, binary: bool) -> None:
    import tritonclient.http as triton

    _, teacher = run
    batch = random_batch(256, [9, 30, 2], seq_len=30, seed=5)
    ids = batch["input_ids"].numpy().astype(np.int64)
    lengths = batch["input_lengths"].numpy().astype(np.int32)  # INT32 lengths are accepted too
    auth = {"Authorization": f"Bearer {teacher.token}"}
    client = triton.InferenceServerClient(teacher.url.split("//", 1)[1])
    assert client.is_server_live() and client.is_server_ready(headers=auth)
    assert client.is_model_ready("llama", headers=auth)
    meta = client.get_model_metadata("llama", headers=auth)
    assert meta["podium"]["vocab_size"] == 256 and meta["podium"]["teacher_key"] == LLAMA.key
    inputs = [triton.InferInput("input_ids", list(ids.shape), "INT64"),
              triton.InferInput("input_lengths", [3], "INT32")]
    inputs[0].set_data_from_numpy(ids, binary_data=binary)
    inputs[1].set_data_from_numpy(lengths, binary_data=binary)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary)
               for name in ("logprobs", "topk_logprobs", "topk_indices")]
    result = client.infer("llama", inputs, outputs=outputs, headers=auth, parameters={"top_k": 3},
                          request_id="triton-1")
    assert result.get_response()["id"] == "triton-1"
    np.testing.assert_allclose(result.as_numpy("logprobs"), oracle(tiny_llama_checkpoint, ids, lengths), atol=ATOL)
    check_topk(tiny_llama_checkpoint, ids, lengths, result.as_numpy("topk_logprobs"), result.as_numpy("topk_indices"))
    client.close()


@pytest.mark.parametrize(("binary", "values", "indices"), [
    (True, "FP32", "INT64"), (False, "FP32", "INT64"), (True, "BF16", "INT32"),
    (False, "BF16", "INT64"),  # a JSON client still gets BF16 as binary data (JSON has no bfloat16)
], ids=["binary", "json", "bf16-int32", "json-bf16"])
def test_topk_logits_and_candidate_logprobs_match_the_oracle(run: tuple[Path, Teacher], tiny_llama_checkpoint: Path,
                                                             binary: bool, values: str, indices: str) -> None:
    """NeMo RL's get_topk_logits form (z / T of the k likeliest next tokens) and candidate logprobs,
    through podium's client on each wire form; BF16 values are the oracle's rounded to bfloat16."""
    path, _ = run
    batch = random_batch(256, [14, 3, 9, 1], seq_len=14, seed=31)
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    logits = hf_oracle_logits(tiny_llama_checkpoint, ids, lengths, temperature=0.8)
    ref_vals, ref_idx = torch.topk(logits, 8, dim=-1)
    valid = torch.arange(14)[None, :] < (lengths[:, None] - 1)
    # bfloat16 keeps 8 significant bits: the oracle's value rounded, within one step of it
    atol = ATOL if values == "FP32" else float(ref_vals.abs().max()) * 2 ** -8
    with podium.connect(path, binary=binary, **FAST) as client:
        top = client.get_topk_logits("math", batch, k=8, temperature=0.8, values_datatype=values,
                                     indices_datatype=indices)
        assert top["topk_logits"].dtype == torch.float32 and top["topk_indices"].dtype == torch.int64
        assert tuple(top["topk_logits"].shape) == (4, 14, 8)
        np.testing.assert_allclose(top["topk_logits"][valid].numpy(), ref_vals[valid].numpy(), atol=atol)
        assert torch.equal(top["topk_indices"][valid], ref_idx[valid]) and not top["topk_logits"][~valid].any()
        cands = torch.randint(0, 256, (4, 14, 5), generator=torch.Generator().manual_seed(3))
        got = client.get_candidate_logprobs("llama", batch, cands, temperature=0.8, values_datatype=values)
        ref = torch.log_softmax(logits, dim=-1).gather(-1, cands)
        atol = ATOL if values == "FP32" else float(ref.abs().max()) * 2 ** -8
        np.testing.assert_allclose(got["candidate_logprobs"][valid].numpy(), ref[valid].numpy(), atol=atol)


@pytest.mark.parametrize("datatype", ["BF16", "FP16", "FP32"])
def test_full_vocabulary_payloads_through_the_endpoint(run: tuple[Path, Teacher], tiny_llama_checkpoint: Path,
                                                       datatype: str) -> None:
    """The SingleController facade's call: ``infer(ids, lengths, ask(outputs=["hidden_states"], ...))``
    gives the hidden states as a tensor in the dtype asked (BF16: torch.bfloat16 over the received
    bytes), = transformers' ``output_hidden_states[-1]``; full logits beside the logprobs likewise."""
    path, _ = run
    batch = random_batch(256, [12, 5, 1, 9], seq_len=12, seed=41)
    ids, lengths = batch["input_ids"].numpy(), batch["input_lengths"].numpy()
    with podium.connect(path, **FAST) as client:
        teacher = client.teacher("llama")
        hidden = teacher.infer(ids, lengths, ask(outputs=["hidden_states"], payload_datatype=datatype))["hidden_states"]
        assert_payload_matches(hidden, hf_hidden_states(tiny_llama_checkpoint, ids, lengths), lengths, datatype)
        both = teacher.infer(ids, lengths, ask(outputs=["logprobs", "logits"], payload_datatype=datatype))
        assert_payload_matches(both["logits"], hf_full_logits(tiny_llama_checkpoint, ids, lengths), lengths, datatype)
        np.testing.assert_allclose(both["logprobs"], oracle(tiny_llama_checkpoint, ids, lengths), atol=ATOL)


def test_k_out_of_range_is_refused_and_the_teacher_keeps_serving(run: tuple[Path, Teacher]) -> None:
    path, _ = run
    batch = random_batch(256, [4, 2], seq_len=4)
    with podium.connect(path, **FAST) as client:
        with pytest.raises(BatchError, match="'top_k' = 0 is out of range"):  # before anything is sent
            client.get_topk_logits("llama", batch, k=0)
        # the vocabulary is the teacher's to check: a 400 that names it, never retried
        with pytest.raises(TeacherRequestError, match=r"'top_k' = 257 is out of range \(1..256\)"):
            client.get_topk_logits("llama", batch, k=257)
        assert client.get_topk_logits("llama", batch, k=256)["topk_logits"].shape == (2, 4, 256)


def test_every_bad_request_gets_its_4xx_then_a_good_one_succeeds(run: tuple[Path, Teacher], llama_group: Any,
                                                                 tiny_llama_checkpoint: Path) -> None:
    _, teacher = run
    check_bad_requests_then_good(teacher.url, "llama", teacher.token, 256, int(llama_group.facts.max_sequence_length),
                                 MAX_BODY, lambda ids, lens: oracle(tiny_llama_checkpoint, ids, lens))


def test_auth_on_the_real_teacher(run: tuple[Path, Teacher]) -> None:
    _, teacher = run
    body = b'{"inputs": []}'
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": teacher.token}):
        resp = requests.post(f"{teacher.url}/v2/models/llama/infer", data=body, headers=headers, timeout=10)
        assert resp.status_code == 401 and "error" in resp.json()
    assert requests.get(f"{teacher.url}/v2/health/live", timeout=10).status_code == 200
    run_dir = teacher.layout.run_dir
    assert (run_dir / "auth_token").stat().st_mode & 0o777 == 0o600
    assert teacher.writer.path.stat().st_mode & 0o777 == 0o600


def test_client_follows_a_restart_of_the_real_teacher(run: tuple[Path, Teacher], tiny_llama_checkpoint: Path) -> None:
    path, teacher = run
    batches = [random_batch(256, [20, 7, 13], seq_len=20, seed=100 + i) for i in range(4)]
    expected = [oracle(tiny_llama_checkpoint, b["input_ids"], b["input_lengths"]) for b in batches]
    client = podium.connect(path, **FAST)
    seen: list[Generation] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop() -> None:
        i = 0
        try:
            while not stop.is_set():
                out = client.get_logprobs("llama", batches[i % 4])
                np.testing.assert_allclose(out["logprobs"].numpy(), expected[i % 4], atol=ATOL)
                seen.append(client.teacher("llama").record.generation)
                i += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    worker = threading.Thread(target=loop)
    worker.start()
    new = teacher
    try:
        _wait(lambda: len(seen) >= 5 or errors)
        new = teacher.restart(gap_s=0.5)  # same group, next generation, another port
        assert new.server.port != teacher.server.port and new.generation == Generation(1000, 1)
        n = len(seen)
        _wait(lambda: len(seen) >= n + 5 or errors)
    finally:
        stop.set()
        worker.join(120)
        client.close()
    # later tests of this module use the restarted teacher
    teacher.adopt(new)
    assert not errors, errors
    assert seen[0] == Generation(1000, 0) and seen[-1] == Generation(1000, 1)


@pytest.fixture(scope="module")
def qwen_teacher(run: tuple[Path, Teacher], qwen_group: Any) -> Iterator[Teacher]:
    _, llama = run
    teacher = Teacher(qwen_group, llama.layout, QWEN, llama.token, generation=Generation(3000, 0)).start()
    yield teacher
    teacher.stop()


def test_two_real_teachers_at_once_rows_in_order(run: tuple[Path, Teacher], qwen_teacher: Teacher,
                                                 tiny_llama_checkpoint: Path, tiny_qwen2_checkpoint: Path) -> None:
    path, _ = run
    batch = random_batch(256, [12, 3, 16, 9, 16, 5, 11], seq_len=16, seed=21)
    agents = ["chat", "math", "unlisted", "qwen", "llama", "chat", "math"]  # unlisted -> default (llama)
    llama_rows = oracle(tiny_llama_checkpoint, batch["input_ids"], batch["input_lengths"])
    qwen_rows = oracle(tiny_qwen2_checkpoint, batch["input_ids"], batch["input_lengths"])
    expected = np.stack([qwen_rows[i] if a in ("chat", "qwen") else llama_rows[i] for i, a in enumerate(agents)])
    assert not np.allclose(llama_rows, qwen_rows, atol=1e-3)  # the two teachers really differ
    with podium.connect(path, **FAST) as client:
        out = client.get_logprobs_by_agent(batch, agents, top_k=2)
        np.testing.assert_allclose(out["logprobs"].numpy(), expected, atol=ATOL)
        assert tuple(out["topk_indices"].shape) == (7, 16, 2)


_wait = functools.partial(wait_for, timeout_s=120.0)
