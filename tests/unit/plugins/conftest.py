"""Make the collection importable as ansible_collections.gpufleet.mig for these tests.

A private collections tree (a symlink to the repo) is made per test session, so the tests do not depend on
`make collection-link` having run. Module tests that run `ansible` point ANSIBLE_COLLECTIONS_PATH at it.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))

from support import collections_path  # noqa: E402

COLLECTIONS_PATH = collections_path()
