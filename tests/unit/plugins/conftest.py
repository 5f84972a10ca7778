"""Make the collection importable as ansible_collections.gpufleet.mig for these tests.

A private collections tree (a symlink to the repo) is made per test session, so the tests do not depend on
`make collection-link` having run. Module tests that run `ansible` point ANSIBLE_COLLECTIONS_PATH at it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_TREE = Path(tempfile.mkdtemp(prefix="gpufleet-collections-"))
(_TREE / "ansible_collections" / "gpufleet").mkdir(parents=True)
(_TREE / "ansible_collections" / "gpufleet" / "mig").symlink_to(REPO)
COLLECTIONS_PATH = str(_TREE)
if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)
