"""Routing an agent name to its teacher: the one rule the plan and the trainer's client share.

An agent name routes to its alias's teacher; an unmapped name goes to ``default_teacher_alias``;
under ``strict_agent_name_match`` (or with no default alias) it is an error. Pure and light: the
client imports it on a trainer node.
"""

from __future__ import annotations

from collections.abc import Mapping


class RoutingError(LookupError):
    """An agent name that routes to no teacher."""


def route_agent(
    routes: Mapping[str, str],
    default_alias: str | None,
    strict: bool,
    agent_name: str,
    *,
    context: str = "",
) -> str:
    """The teacher key serving ``agent_name`` (``routes``: alias -> teacher key)."""
    key = routes.get(agent_name)
    if key is not None:
        return key
    prefix = f"{context}: " if context else ""
    known = ", ".join(sorted(routes))
    if strict:
        raise RoutingError(
            f"{prefix}agent {agent_name!r} has no teacher and strict agent-name matching is on "
            f"(known aliases: {known})"
        )
    if default_alias is None:
        raise RoutingError(
            f"{prefix}agent {agent_name!r} has no teacher and no default alias is set "
            f"(known aliases: {known})"
        )
    return routes[default_alias]
