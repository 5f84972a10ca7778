"""Playbook tests on the simulated lab: tests/ on sys.path (support, fake_kubelet), the collection importable."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support import collections_path

COLLECTIONS_PATH = collections_path()
