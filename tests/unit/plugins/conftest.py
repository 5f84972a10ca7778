"""Make the collection importable as ansible_collections.gpufleet.mig for these tests.

A private collections tree (a symlink to the repo) is made per test session, so the tests do not depend on
`make collection-link` having run. Module tests that run `ansible` point ANSIBLE_COLLECTIONS_PATH at it.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet_testsupport.collection import collections_path

REPO = Path(__file__).resolve().parents[3]

# This tree's own root: the mutation run tests its scratch copy of the collection (tests/mutation/run_mutation.py).
COLLECTIONS_PATH = collections_path(REPO)
