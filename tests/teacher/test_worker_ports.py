"""The master port a group's worker 0 picks must be free on every address of its node, and the
torch store it starts there listens on that node's address only."""

from __future__ import annotations

import datetime
import socket

import pytest

from podium.net import find_free_port
from podium.teacher.compute.worker import TeacherWorker
from podium.teacher.model.parallel import rendezvous_store


def test_port_held_on_another_address_of_the_node_is_not_picked() -> None:
    # Another job's TCPStore on 127.0.0.3:p makes p unusable for ours (it listens on all addresses),
    # although p binds on 127.0.0.2 alone.
    worker = TeacherWorker.__new__(TeacherWorker)  # pick_master_port needs no setup
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        # below the kernel's ephemeral range: once released, no outgoing connection takes it meanwhile
        held = find_free_port((21000, 21999), "127.0.0.3")
        other.bind(("127.0.0.3", held))
        other.listen()
        with pytest.raises(OSError, match=f"no free port in {held}-{held}"):
            worker.pick_master_port((held, held))
    assert worker.pick_master_port((held, held)) == held  # free again once released


def test_the_torch_store_binds_the_masters_address_only() -> None:
    """torch's store on rank 0 listens on the allocation's address only."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = rendezvous_store("127.0.0.1", port, rank=0, world_size=1, timeout=datetime.timedelta(seconds=10))
    try:
        store.set("k", "v")
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # the address it was given answers
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.2", port), timeout=2):
            pass  # another address of this machine does not
    finally:
        del store
