"""The checks that run on the node a teacher would run on: a free port block and port in the
settings' ranges, and the address Ray and the endpoint would use. The test job's probe
(:mod:`podium.launcher.login.doctor.probe`) calls :func:`node_checks` there; ``cluster: local`` calls it
here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from podium.launcher.common.ray_ports import RayStartError, choose_ports, node_ip
from podium.launcher.login.doctor.base import FAIL, PASS, Check
from podium.net import find_free_port

PORTS_FIX = ("choose podium.ray.port_range / podium.server.port_range where ports are free on the nodes, below "
             "the kernel's ephemeral range (`cat /proc/sys/net/ipv4/ip_local_port_range`)")
ADDRESS_FIX = ("set podium.ray.interface (and podium.server.interface) to a network interface that "
               "`ip -4 -o addr` lists on the compute nodes, one the login and trainer nodes reach")


def node_checks(settings: Mapping[str, Any], local: bool = False) -> list[dict[str, str]]:
    """Ports and address on this node, as a teacher's node task would find them (the same
    functions, so the same errors). ``settings``: a ``TeacherLauncherSettings`` dump (JSON);
    ``local``: the local backend's addresses (loopback unless an interface is named)."""
    ray, server = settings["ray"], settings["server"]
    rows: list[Check] = []
    try:
        block = choose_ports(tuple(ray["port_range"]), 0, 0, 0)
        port = find_free_port(tuple(server["port_range"]))
        rows.append(Check("ports", PASS, f"ray.port_range {ray['port_range'][0]}-{ray['port_range'][1]}: a free block "
                          f"at {block.base}; server.port_range {server['port_range'][0]}-{server['port_range'][1]}: "
                          f"{port} free"))
    except (RayStartError, OSError) as exc:
        rows.append(Check("ports", FAIL, str(exc), PORTS_FIX))
    seen = []
    try:
        for key in ("ray", "server"):
            interface = settings[key].get("interface")
            if local and not interface:
                seen.append(f"{key}: 127.0.0.1 (local, no interface set)")
                continue
            how = f"interface {interface!r}" if interface else "the hostname"
            seen.append(f"{key}: {node_ip(interface)} ({how})")
        rows.append(Check("address", PASS, "; ".join(seen)))
    except RayStartError as exc:
        rows.append(Check("address", FAIL, str(exc), ADDRESS_FIX))
    return [r.to_dict() for r in rows]
