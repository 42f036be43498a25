"""The cluster kinds' registry (``podium.launcher.backends``): the built-ins, a kind put in place
for a block and then taken away, and the error that names the kinds there are."""

from __future__ import annotations

import pytest

from podium.config.spec import TeacherSpec
from podium.launcher.backends import environment_for, known_kinds, register, registered, scheduler_for
from podium.launcher.backends.local.environment import LocalEnvironment
from podium.launcher.backends.local.scheduler import LocalScheduler
from podium.launcher.backends.slurm.environment import SlurmEnvironment
from podium.launcher.backends.slurm.scheduler import SlurmScheduler


class FakeScheduler(LocalScheduler):
    name = "fake"


class FakeEnvironment(LocalEnvironment):
    name = "fake"


def test_the_built_in_kinds() -> None:
    assert known_kinds() == ("local", "slurm")
    assert type(scheduler_for("slurm")) is SlurmScheduler and type(environment_for("slurm")) is SlurmEnvironment
    assert type(scheduler_for("local")) is LocalScheduler and type(environment_for("local")) is LocalEnvironment


def test_a_kind_registered_for_a_block_is_gone_after_it() -> None:
    with registered("fake", FakeScheduler, FakeEnvironment) as kind:
        assert kind.name == "fake" and known_kinds() == ("fake", "local", "slurm")
        assert type(scheduler_for("fake")) is FakeScheduler and type(environment_for("fake")) is FakeEnvironment
    with pytest.raises(ValueError, match=r"unknown cluster kind 'fake' \(known: local, slurm\)"):
        scheduler_for("fake")


def test_a_kind_replaced_for_a_block_comes_back() -> None:
    class Quiet(SlurmScheduler):
        def find_live(self, spec, files):
            return []

    with registered("slurm", Quiet, SlurmEnvironment):
        assert type(scheduler_for("slurm")) is Quiet
    assert type(scheduler_for("slurm")) is SlurmScheduler


def test_the_classes_must_carry_the_name() -> None:
    with pytest.raises(ValueError, match=r"FakeScheduler.name is 'fake'"):
        register("slurm", FakeScheduler, SlurmEnvironment)
    assert type(scheduler_for("slurm")) is SlurmScheduler


def test_a_class_named_by_its_dotted_name_is_checked_when_first_asked_for() -> None:
    # registering by name imports nothing, so the class's name is checked when it is imported
    with registered("fake", "podium.launcher.backends.local.scheduler.LocalScheduler",
                    "podium.launcher.backends.local.environment.LocalEnvironment"):
        with pytest.raises(ValueError, match=r"cluster kind 'fake': LocalScheduler.name is 'local'"):
            scheduler_for("fake")
        with pytest.raises(ValueError, match=r"cluster kind 'fake': LocalEnvironment.name is 'local'"):
            environment_for("fake")


def test_the_cpus_a_node_offers_are_slurms_allocation_or_the_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TeacherSpec(key="abcdef123456", name="math", aliases=("math",), model_name="/ckpt", num_nodes=1,
                       gpus_per_node=2)  # cpus_per_task unset: gpus_per_node + 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "7")
    assert environment_for("slurm").node_cpus(spec) == 7  # what Slurm gave the task
    assert environment_for("local").node_cpus(spec) == 3  # no Slurm allocation: the recipe's
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert environment_for("slurm").node_cpus(spec) == 3
