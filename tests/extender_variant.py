"""The bundled extender's `serve`, as a process, with test-only changes made from outside (never settings of the
extender: the production code knows nothing of them). Run as `python tests/extender_variant.py serve ...`; the
changes are chosen by environment variables read here only:

- GPUFLEET_TEST_POD_LIST_DELAY=<seconds>: the first list of bound pods (the in-flight bindings) answers this much
  later, as it does in a large cluster or from a slow apiserver. The other kinds list at once.
- GPUFLEET_TEST_READY_BEFORE_SYNC=1: a broken recovery on purpose. The watcher reports every kind listed from the
  start, so /readyz answers 200 before the in-flight bindings are rebuilt from the API (what the fault suite must
  catch).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from gpufleet_extender import k8s_watch
from gpufleet_extender.cli import main

DELAY = float(os.environ.get("GPUFLEET_TEST_POD_LIST_DELAY", "0"))
READY_BEFORE_SYNC = os.environ.get("GPUFLEET_TEST_READY_BEFORE_SYNC") == "1"

_init = k8s_watch.ClusterWatcher.__init__


def _init_with_slow_pod_list(self: k8s_watch.ClusterWatcher, *args: Any, **kwargs: Any) -> None:
    _init(self, *args, **kwargs)
    pods = self._lists["Pod"]
    first = [True]

    def slow_first_list(**kw: Any) -> Any:
        if first[0] and kw.get("_preload_content") is False:  # the list, not a watch
            first[0] = False
            time.sleep(DELAY)
        return pods(**kw)

    self._lists = {**self._lists, "Pod": slow_first_list}


if DELAY > 0:
    k8s_watch.ClusterWatcher.__init__ = _init_with_slow_pod_list  # type: ignore[method-assign]
if READY_BEFORE_SYNC:
    k8s_watch.ClusterWatcher.unsynced = lambda self: []  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
