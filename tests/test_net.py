"""Ports, the rule defined once for every process that listens: chosen by binding them."""

from __future__ import annotations

import socket

import pytest

from podium.net import find_free_port, http_url, listen_on_free_port, port_free


def test_ports_are_chosen_by_binding_them() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not port_free(port, "127.0.0.1") and not port_free(port)  # "" = every address
        with pytest.raises(OSError, match=f"no free port in {port}-{port}"):
            find_free_port((port, port))
        sock = listen_on_free_port("127.0.0.1", (port, port + 5))
        try:
            assert port < sock.getsockname()[1] <= port + 5
        finally:
            sock.close()
    assert http_url("::1", 80) == "http://[::1]:80" and http_url("n1.cluster", 80) == "http://n1.cluster:80"
    assert http_url("10.0.0.1", 8) == "http://10.0.0.1:8"
