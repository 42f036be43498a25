"""``fp32_lm_head``: a bf16 teacher's output layer writes fp32 logits, as NeMo RL's Megatron path does.

- the output GEMM alone (no processes): with it, the product of the model's own bf16 operands in
  fp32 (never rounded to bf16); without it, the same product rounded to bf16; ``"tf32"`` gives
  true's numbers (NeMo RL's alias of true); the logprob head and the full-logits payload use it;
- a real Megatron teacher on CPU (tiny Llama, bf16 parameters, TP1), against the HF transformers
  fp32 oracle: the teacher with the fp32 head is closer to it than the one without, by a margin
  chance cannot give (the numbers are printed).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from fixtures.checkpoints import hf_oracle_logprobs
from harness.head_model import HeadModel
from harness.teacher_groups import ragged_batch, start_group

from podium.teacher.compute.head import HeadCall, HeadInputs, LogprobHead
from podium.teacher.model.output_gemm import OutputGemm

VOCAB = 256


def _bf16_operands(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = (3 * torch.randn(16, 32, generator=gen)).bfloat16()  # peaked logits, as a trained model's
    weight = torch.randn(40, 32, generator=gen).bfloat16()
    return rows, weight


@pytest.mark.parametrize("setting", [True, "tf32"])
def test_the_fp32_head_multiplies_the_bf16_operands_in_fp32_and_never_rounds_the_logits(setting):
    rows, weight = _bf16_operands()
    exact = rows.double() @ weight.double().t()  # a bf16 product is exact in fp32; only the sum rounds
    fp32 = OutputGemm(weight, setting)(rows)
    bf16 = OutputGemm(weight, False)(rows)
    assert fp32.dtype == bf16.dtype == torch.float32 and fp32.shape == (16, 40)
    assert torch.equal(fp32, rows.float() @ weight.float().t())
    assert torch.equal(bf16, (rows @ weight.t()).float()) and torch.equal(bf16, bf16.bfloat16().float())
    fp32_error = (fp32.double() - exact).abs().max().item()
    bf16_error = (bf16.double() - exact).abs().max().item()
    assert fp32_error < 1e-4 < 1e-2 < bf16_error, (fp32_error, bf16_error)


def test_an_fp32_teachers_head_is_the_same_with_or_without_it():
    rows, weight = (t.float() for t in _bf16_operands(1))
    assert torch.equal(OutputGemm(weight, "tf32")(rows), OutputGemm(weight, False)(rows))






def test_the_logprob_head_takes_the_setting_to_its_gemm():
    gen = torch.Generator().manual_seed(2)
    rows, weight = _bf16_operands(2)
    hidden = rows.view(4, 4, 32)  # [s, b, h]
    labels = torch.randint(0, 40, (4, 4), generator=gen)
    out = {}
    for setting in (False, True):
        head = LogprobHead(vocab_size=40, tp_group=None, tp_rank=0, tp_size=1, fp32_lm_head=setting)
        model = HeadModel(weight)
        head.install(model)
        captured, _ = model.output_layer.forward(hidden)
        with head.serving(HeadCall(), [HeadInputs()]):
            out[setting] = model.compute_language_model_loss(labels, captured)["logprobs"]
    logits = {True: hidden.float() @ weight.float().t(), False: (hidden @ weight.t()).float()}
    for setting, z in logits.items():
        expected = torch.log_softmax(z, dim=-1).gather(-1, labels.t()[..., None]).squeeze(-1).t()
        assert torch.allclose(out[setting], expected, atol=1e-5), setting
    assert not torch.allclose(out[True], out[False], atol=1e-3)


@pytest.mark.parametrize("setting", [False, True])
def test_the_logits_payload_comes_from_the_same_gemm(setting):
    """The full-logits payload (FP32) is the logprob head's logits: fp32 with the setting, the bf16
    product without it."""
    from podium.protocol.names import LOGITS
    from podium.teacher.compute.payload import payload_outputs

    rows, weight = _bf16_operands(3)
    hidden = rows.view(4, 4, 32)  # [s, b, h]
    out = payload_outputs(LOGITS, hidden, weight, datatype="FP32", temperature=1.0, vocab_size=40, tp_group=None,
                          tp_size=1, chunk_elements=1 << 20, fp32_lm_head=setting)[LOGITS]
    expected = OutputGemm(weight, setting)(hidden.transpose(0, 1).reshape(16, 32)).view(4, 4, 40)
    assert torch.equal(out, expected)
    assert torch.equal(out, out.bfloat16().float()) is (not setting)  # bf16 values only without it


# -- a real teacher against the HF fp32 oracle ------------------------------------------------------

# An LM's logits may share a large offset, which log-softmax ignores and bf16 rounding does not: at
# |z| in [128, 256) a bf16 logit is a multiple of 1. The tiny Llama's random logits have none, and its
# bf16 body's error then hides the head's (mean error 0.0477 vs 0.0471), so its copy here gets one:
# the output weight's column 0 set to 128 (exact in bf16) puts 128·h[0] (|h[0]| ~ 1) into every logit.
OFFSET = 128.0


@pytest.fixture(scope="module")
def offset_llama(tmp_path_factory, tiny_llama_checkpoint):
    """The tiny Llama with a shared logit offset (see OFFSET), fp32 safetensors as the original."""
    from safetensors.torch import load_file, save_file

    path = tmp_path_factory.mktemp("offset_llama")
    shutil.copytree(tiny_llama_checkpoint, path, dirs_exist_ok=True)
    weights = load_file(path / "model.safetensors")
    weights["lm_head.weight"][:, 0] = OFFSET
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def bf16_heads(ray_cluster, offset_llama):
    """Two bf16 teachers of it, TP1: ``{False: without fp32_lm_head, True: with it}``."""
    without = start_group(offset_llama, precision="bf16", key="bf16-head")
    with_it = start_group(offset_llama, precision="bf16", key="fp32-head", fp32_lm_head=True)
    groups = {False: next(without), True: next(with_it)}
    yield groups
    for gen in (without, with_it):
        next(gen, None)  # shuts its group down


@pytest.mark.ray
@pytest.mark.megatron
def test_a_bf16_teacher_with_an_fp32_head_is_closer_to_hf_fp32(bf16_heads, offset_llama):
    """Token by token, over 200 tokens: the fp32 head's error against HF fp32 is smaller on average
    by more than 5 standard errors of the paired difference (chance does not give that), and by a
    third at least: what is left is the bf16 body's error, the same as without the offset."""
    batch = ragged_batch(VOCAB, (32, 29, 32, 17, 32, 25, 32, 9), seed=7)
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    oracle = hf_oracle_logprobs(offset_llama, ids, lengths, bf16_heads[True].spec.temperature)
    valid = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
    valid[:, 0] = False
    errors = {}
    for setting, group in bf16_heads.items():
        assert group.spec.precision == "bf16" and group.spec.fp32_lm_head is setting
        got = group.get_logprobs(batch)["logprobs"]
        assert got.dtype == torch.float32 and torch.all(got[~valid] == 0)
        errors[setting] = (got[valid] - oracle[valid]).abs().double()
    gain = errors[False] - errors[True]  # per token: how much closer the fp32 head is
    stderr = gain.std().item() / gain.numel() ** 0.5
    print(f"\nbf16 teacher vs HF fp32, |logprob error| mean / max over {gain.numel()} tokens: "
          f"bf16 head {errors[False].mean():.4g} / {errors[False].max():.4g}, "
          f"fp32 head {errors[True].mean():.4g} / {errors[True].max():.4g}; "
          f"paired gain {gain.mean():.4g} ± {stderr:.2g} (standard error)")
    assert gain.mean().item() > 5 * stderr
    assert 1.5 * errors[True].mean() < errors[False].mean() and errors[True].max() < errors[False].max()
