#!/usr/bin/env bash
# ansible-test sanity on a copy of the tracked files laid out as ansible_collections/gpufleet/mig
# (ansible-test insists on that path and on the physical working directory, so a symlink will not do).
# Each sanity test's pinned requirements are installed into ansible-test's own venvs from PyPI (--venv).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dest="$repo/build/sanity/ansible_collections/gpufleet/mig"
rm -rf "$repo/build/sanity"
mkdir -p "$dest"
git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 cp --parents -P -t "$dest" 2>/dev/null || true)
cd "$dest"
git init -q . && git add -A >/dev/null  # ansible-test lists files through git
# Tests skipped, each for a reason:
#   shebang/shellcheck on helper scripts that are not part of the collection's content are covered by ruff/CI;
python_version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
exec ansible-test sanity --venv --requirements --python "$python_version" \
  --exclude extender/ --exclude tests/ --exclude extensions/ --exclude .ci/ "$@"
