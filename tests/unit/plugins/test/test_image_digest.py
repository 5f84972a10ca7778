"""gpufleet.mig.image_digest: the one digest check of the roles (their tests check each role's message)."""

from __future__ import annotations

import pytest
from ansible_collections.gpufleet.mig.plugins.test import image_digest as plugin

HEX = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"sha256:{HEX}", True),
        (f"sha256:{HEX.upper()}", False),
        (f"sha256:{HEX}0", False),
        (f"sha256:{HEX[:-1]}", False),
        (HEX, False),
        (f"sha512:{HEX}", False),
        (f" sha256:{HEX}", False),
        (f"sha256:{HEX}\n", False),
        (None, False),
        (123, False),
    ],
)
def test_only_a_sha256_digest_in_lower_case_hex_passes(value, expected):
    assert plugin.image_digest(value) is expected


def test_the_plugin_offers_the_test_under_its_name():
    assert plugin.TestModule().tests() == {"image_digest": plugin.image_digest}
