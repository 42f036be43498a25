"""The ``TransformerConfig`` field lists podium ships (podium/config/megatron_fields.py) are the
installed megatron-core's: the login node checks recipe keys against them without megatron-core,
the nodes with it. CI runs this file in both lanes (megatron-core 0.16 on Python 3.11, 0.19 on 3.12),
so each shipped list is compared with its release."""

from __future__ import annotations

import dataclasses
import textwrap

import pytest

from podium.config.megatron_fields import (
    ALL_FIELDS,
    SUPPORTED_RELEASES,
    TRANSFORMER_CONFIG_FIELDS,
    fields_of,
    release_of,
    releases_with,
)


@pytest.mark.megatron
def test_the_shipped_list_of_the_installed_release_is_its_transformer_config() -> None:
    import megatron.core
    from megatron.core.transformer.transformer_config import TransformerConfig

    release = release_of(megatron.core.__version__)
    live = frozenset(f.name for f in dataclasses.fields(TransformerConfig))
    shipped = fields_of(release)
    paste = textwrap.fill(" ".join(sorted(live)), 110, break_on_hyphens=False)
    assert shipped is not None, (f"megatron-core {megatron.core.__version__}: podium ships no field list for "
                                 f"{release}; add it to podium/config/megatron_fields.py:\n{paste}")
    assert shipped == live, (f"megatron-core {megatron.core.__version__}: only shipped {sorted(shipped - live)}, "
                             f"only installed {sorted(live - shipped)}; the list for {release}:\n{paste}")


@pytest.mark.megatron
def test_the_node_splits_by_the_shipped_list_of_its_release() -> None:
    """split_overrides takes its fields from the shipped list (what the plan checked), and a field
    of another supported release only is refused on this node naming both releases."""
    from podium.teacher.model.megatron_config import installed_release, split_overrides

    release, fields = installed_release()
    assert fields == fields_of(release)
    other = sorted(ALL_FIELDS - fields - {"_cpu_offloading_context"})
    assert other, "the supported releases differ in their fields"
    with pytest.raises(ValueError, match=r"not of .* installed here") as err:
        split_overrides({other[0]: 1, "hidden_size": 8}, "teacher 'math' megatron_cfg_overrides")
    assert str(err.value) == (f"teacher 'math' megatron_cfg_overrides.{other[0]}: a TransformerConfig field of "
                              f"megatron-core {', '.join(releases_with(other[0]))}, not of {release} installed "
                              "here: install such a release on the nodes, or remove the key")


def test_releases_are_named_by_major_minor() -> None:
    assert release_of("0.16.1") == "0.16" and release_of("0.19.2+c541716") == "0.19"
    assert SUPPORTED_RELEASES == tuple(TRANSFORMER_CONFIG_FIELDS) == ("0.16", "0.19")
    with pytest.raises(ValueError, match="not a megatron-core version"):
        release_of("dev")
