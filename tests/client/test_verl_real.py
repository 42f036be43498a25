"""podium.verl with verl 0.9.1's own classes, in front of the real Megatron teacher (the session's
tiny Llama group) against the HF ``transformers`` fp32 oracle:

- verl's ``AsyncTeacherLLMServerManager`` built on :func:`podium.verl.teacher_clients` (keys as
  verl's ``DistillationConfig`` resolves them) scores sequences concurrently: its
  ``compute_teacher_logprobs_single`` answers, through verl's own ``extract_prompt_logprobs``, the
  oracle's top-k ids and logprobs (``use_topk``) and the sequence's own logprobs (``k = 0``);
  the concurrent calls went as one batched request;
- the client pickles (verl hands it to Ray actors) and works after;
- :func:`podium.verl.podium_teachers`: verl's ``ResourcePoolManager`` creates no ``teacher_pool``
  and ``MultiTeacherModelManager`` gives podium's clients; both restored after.

Skipped where verl is not installed (``.ci/run`` installs it, without its dependencies).
"""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from harness.lifecycle import Teacher
from harness.run import LLAMA, make_run
from harness.scoring_oracle import ATOL, oracle

pytest.importorskip("verl.experimental.teacher_loop.teacher_manager")
from omegaconf import OmegaConf
from verl.experimental.teacher_loop.teacher_manager import AsyncTeacherLLMServerManager

from podium.verl import PodiumTeacherClient, podium_teachers, teacher_clients

pytestmark = [pytest.mark.ray, pytest.mark.megatron]

ROWS = [[5, 17, 99, 3, 200, 41, 7], [12, 250, 33, 90], [1, 2, 3]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, llama_group: Any) -> Iterator[Path]:
    layout, token = make_run(tmp_path_factory.mktemp("verl"), [LLAMA])
    served = Teacher(llama_group, layout, LLAMA, token).start()
    yield layout.rendezvous_path
    served.stop()


def verl_config(topk: int | None, teachers: dict[str, str] | None = None) -> Any:
    """verl's trainer config with its own ``distillation.yaml`` (one teacher, or several by key), the
    student's rollout fields it interpolates filled in."""
    import verl

    section = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/distillation/distillation.yaml")
    section.pop("defaults")
    rollout = {"name": "vllm", "dtype": "bfloat16", "prompt_length": 16, "response_length": 16, "temperature": 1.0}
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "distillation": section})
    config.distillation.enabled = True
    config.distillation.n_gpus_per_node = 0  # verl's pool size: podium's teachers take none of it
    config.distillation.teacher_models.teacher_model.model_path = "/ckpt/llama"
    config.distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size = 1
    config.distillation.distillation_loss.loss_mode = "forward_kl_topk" if topk else "k3"
    config.distillation.distillation_loss.topk = topk
    if topk:
        config.distillation.teacher_models.teacher_model.inference.engine_kwargs = {"vllm": {"max_logprobs": topk}}
    for name, key in (teachers or {}).items():
        extra = OmegaConf.create(OmegaConf.to_container(config.distillation.teacher_models.teacher_model))
        extra.key, extra.model_path = key, f"/ckpt/{key}"
        config.distillation.teacher_models[name] = extra
    return config


@pytest.mark.parametrize("topk", [None, 4])
def test_verls_teacher_manager_scores_podiums_teacher(run: Path, tiny_llama_checkpoint: Path,
                                                      topk: int | None) -> None:
    config = verl_config(topk)
    clients = teacher_clients(run, config)
    assert list(clients) == ["default"]  # verl's key of a single teacher
    manager = AsyncTeacherLLMServerManager(config, teacher_client=clients)
    sent: list[int] = []
    client = clients["default"]
    original = client.client.get_logprobs

    def counting(alias: str, data: Any, **kw: Any) -> Any:
        sent.append(len(data["input_lengths"]))
        return original(alias, data, **kw)

    client.client.get_logprobs = counting  # type: ignore[method-assign]

    async def score() -> list[tuple[torch.Tensor, torch.Tensor]]:
        return list(await asyncio.gather(*(manager.compute_teacher_logprobs_single(row) for row in ROWS)))

    answers = asyncio.run(score())
    assert sent == [len(ROWS)]  # one request for the concurrent sequences
    expected = oracle(tiny_llama_checkpoint, ROWS, 1.0)
    for (ids, logprobs), row, exp in zip(answers, ROWS, expected, strict=True):
        k = topk or 1
        assert ids.shape == logprobs.shape == (len(row), k)
        assert torch.all(ids[-1] == 0) and torch.all(logprobs[-1] == 0)  # verl's dummy last row
        nxt = exp[1:]  # row t: the distribution after token t
        if topk is None:  # the sequence's own tokens
            assert ids[:-1, 0].tolist() == row[1:]
            own = nxt.gather(1, torch.tensor(row[1:])[:, None])[:, 0]
            assert torch.allclose(logprobs[:-1, 0].double(), own.double(), atol=ATOL)
        else:
            top = nxt.topk(topk, dim=-1)
            assert ids[:-1].tolist() == top.indices.tolist()
            assert torch.allclose(logprobs[:-1].double(), top.values.double(), atol=ATOL)


def test_the_client_pickles_and_keys_follow_verls_config(run: Path) -> None:
    clients = teacher_clients(run, verl_config(None, {"a": "math", "b": "llama"}))
    assert sorted(clients) == ["llama", "math"]  # several teachers: verl keys them by `key`
    copy = pickle.loads(pickle.dumps(clients["math"]))
    assert isinstance(copy, PodiumTeacherClient) and copy.alias == "math"

    async def one() -> Any:
        return await copy.generate("r", prompt_ids=ROWS[0], sampling_params={"max_tokens": 1, "temperature": 1.0,
                                                                             "prompt_logprobs": 0})
    out = asyncio.run(one())
    assert len(out.extra_fields["prompt_logprobs"]) == len(ROWS[0])
    with pytest.raises(Exception, match="serves no 'nope'"):
        teacher_clients(run, verl_config(None, {"a": "nope", "b": "llama"}))


def test_podium_teachers_reserves_no_teacher_gpus(run: Path) -> None:
    import verl.experimental.teacher_loop as teacher_loop
    from verl.single_controller.ray.base import ResourcePoolManager
    from verl.trainer.ppo.utils import Role

    original = teacher_loop.MultiTeacherModelManager
    with podium_teachers(run) as manager:
        assert teacher_loop.MultiTeacherModelManager is manager
        pools = ResourcePoolManager(resource_pool_spec={"teacher_pool": [8]},
                                    mapping={Role.TeacherModel: "teacher_pool"})
        pools.create_resource_pool()
        assert "teacher_pool" not in pools.resource_pool_spec and pools.get_n_gpus() == 0
        assert pools.get_resource_pool(Role.TeacherModel) is None
        built = teacher_loop.MultiTeacherModelManager(config=verl_config(4), resource_pool=None)
        assert isinstance(built.get_client()["default"], PodiumTeacherClient)
    assert teacher_loop.MultiTeacherModelManager is original
