"""Write k8s/plugins/gpuclaimscore/testdata/dra_vectors.json from plugins/module_utils/dra_placement.py, the
specification GPUScore's claim scoring follows (tests/unit/plugins/module_utils/test_dra_placement.py checks it is
current)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUTPUT = REPO / "k8s/plugins/gpuclaimscore/testdata/dra_vectors.json"


def render() -> str:
    from gpufleet_testsupport.collection import collections_path

    collections_path()
    from ansible_collections.gpufleet.mig.plugins.module_utils.dra_placement import vectors

    data = vectors()
    cases = data.pop("cases")
    head = json.dumps(data, sort_keys=True)[:-1]
    lines = ",\n".join(json.dumps(case, sort_keys=True, separators=(",", ":")) for case in cases)
    return f'{head}, "cases": [\n{lines}\n]}}\n'  # one case a line: diffs stay readable


if __name__ == "__main__":
    OUTPUT.write_text(render())
    print(f"wrote {OUTPUT.relative_to(REPO)}")
