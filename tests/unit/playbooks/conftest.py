"""Playbook tests on the simulated lab: the collection importable as ansible_collections.gpufleet.mig."""

from __future__ import annotations

from gpufleet_testsupport.collection import collections_path

COLLECTIONS_PATH = collections_path()
