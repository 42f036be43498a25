"""Every client option a trainer may pass to ``podium.connect`` by name is documented where the
keywords are (``PodiumClient``'s docstring, which ``podium.connect`` points to)."""

from __future__ import annotations

import dataclasses

from podium.client import ClientOptions, PodiumClient


def test_podium_client_documents_every_client_option() -> None:
    doc = PodiumClient.__doc__ or ""
    missing = [f.name for f in dataclasses.fields(ClientOptions) if f"``{f.name}``" not in doc]
    assert not missing, f"PodiumClient's docstring does not list {missing}"
