"""``cluster: local`` and GPUs: what the local Ray node offers a teacher on this machine and on
others (:func:`local_gpu_use`), and how many CUDA devices a process may use (:mod:`podium.launcher.common.devices`)."""

from __future__ import annotations

import pytest

from podium.launcher.backends import SubmitError
from podium.launcher.backends.local.environment import local_gpu_use
from podium.launcher.common.devices import cuda_device_count, driver_device_count, visible_limit


def test_gpus_asked_for_on_machines_with_none_some_and_enough() -> None:
    gpus, notice = local_gpu_use("math", 2, 0)
    assert gpus == 0 and "runs on CPU: no CUDA device found" in notice and "gpus_per_node=2" in notice
    assert local_gpu_use("math", 2, 2) == (2, None) and local_gpu_use("math", 2, 8) == (2, None)
    assert local_gpu_use("math", 0, 0) == (0, None)  # podium.slurm.gpus: false asks for CPU: no notice
    with pytest.raises(SubmitError, match=r"gpus_per_node=2 but this machine has 1 CUDA device \(set gpus_per_node: 1"):
        local_gpu_use("math", 2, 1)


@pytest.mark.parametrize(("value", "admitted"), [
    (None, None), ("", 0), ("-1", 0), ("0", 1), ("0,1", 2), ("1,-1,2", 1), ("GPU-8f2a,GPU-77c1", 2), ("0,x,1", 1),
])
def test_cuda_visible_devices_cuts_the_list_as_cuda_does(value, admitted) -> None:
    assert visible_limit({} if value is None else {"CUDA_VISIBLE_DEVICES": value}) == admitted


def test_cuda_device_count_is_the_drivers_cut_by_cuda_visible_devices() -> None:
    found = driver_device_count()  # 0 here (no NVIDIA driver); whatever a GPU machine has
    assert cuda_device_count({}) == found
    assert cuda_device_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert cuda_device_count({"CUDA_VISIBLE_DEVICES": "0"}) == min(found, 1)
