"""gpufleet.mig.image_digest: whether a value is an OCI image digest the roles pin images with (<image>@<digest>).

The one place the digest pattern is written: every role that takes a `<role>_image_digest` checks it with
`not <var> or <var> is gpufleet.mig.image_digest`, with the same message.
"""

from __future__ import annotations

import re

DOCUMENTATION = r"""
name: image_digest
short_description: Whether a value is an image digest, sha256 and 64 lower-case hex digits
description:
  - True for C(sha256:<64 lower-case hex>), the form a registry reports for an image and the one the roles pin
    images with (C(<image>@<digest>)); false for anything else (upper-case hex, other algorithms, other lengths,
    a value that is no string).
options:
  _input:
    description: The value to check.
    type: raw
    required: true
"""

EXAMPLES = r"""
- name: Refuse a malformed digest before anything is deployed
  ansible.builtin.assert:
    that: not my_image_digest or my_image_digest is gpufleet.mig.image_digest
    fail_msg: my_image_digest must be sha256:<64 lower-case hex> or null
"""

RETURN = r"""
_value:
  description: Whether the value is a sha256 image digest.
  type: bool
"""

IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def image_digest(value) -> bool:
    return isinstance(value, str) and IMAGE_DIGEST.fullmatch(value) is not None


class TestModule:
    def tests(self):
        return {"image_digest": image_digest}
