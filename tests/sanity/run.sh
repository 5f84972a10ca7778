#!/usr/bin/env bash
# ansible-test sanity on a copy of the tracked files laid out as ansible_collections/gpufleet/mig
# (ansible-test insists on that path and on the physical working directory, so a symlink will not do).
# ansible-test's --venv/--requirements bootstrap downloads get-pip from a host CI cannot reach, so the
# sanity tests' own pinned requirement files (shipped inside ansible-test) are installed here into
# build/sanity-venv from PyPI, and ansible-test runs locally in that venv.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
venv="$repo/build/sanity-venv"
core=$("$repo/.venv/bin/python" -c 'import ansible; print(ansible.__version__)')
if [ ! -x "$venv/bin/ansible-test" ] || [ "$("$venv/bin/python" -c 'import ansible; print(ansible.__version__)')" != "$core" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  reqs=$("$repo/.venv/bin/python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_data/requirements
  "$venv/bin/pip" install --quiet "ansible-core==$core" \
    $(for t in ansible-doc changelog import pep8 pylint runtime-metadata validate-modules yamllint; do echo "-r $reqs/sanity.$t.txt"; done)
fi
dest="$repo/build/sanity/ansible_collections/gpufleet/mig"
rm -rf "$repo/build/sanity"
mkdir -p "$dest"
git -C "$repo" ls-files -z --cached --others --exclude-standard | (cd "$repo" && xargs -0 cp --parents -P -t "$dest" 2>/dev/null || true)
cd "$dest"
git init -q . && git add -A >/dev/null  # ansible-test lists files through git
# The import test builds its own venv and bootstraps pip there with a script downloaded from a host CI cannot
# reach; ansible-test takes that script from its cache if present, so seed the cache with one that uses the
# interpreter's bundled ensurepip instead. HOME is redirected so the cache and venvs stay under build/.
export HOME="$repo/build/sanity-home"
mkdir -p "$HOME/.ansible/test/cache"
pip_version=$(grep -hoE "pip='[0-9.]+'" "$("$venv/bin/python" -c \
  'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py" | head -n1 | tr -d "pip='")
cat > "$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py" <<'PY'
# Stand-in for get-pip.py: install the bundled pip, then `pip install` the arguments, as get-pip.py does.
import ensurepip, importlib, os, runpy, sys
environ = dict(os.environ)
ensurepip.bootstrap(upgrade=True)
os.environ.clear()
os.environ.update(environ)  # ensurepip points PIP_CONFIG_FILE at /dev/null; the install below needs the pip config
importlib.invalidate_caches()
get_pip_only = {"--no-setuptools", "--no-wheel"}  # get-pip.py's own flags, not pip's
sys.argv = ["pip", "install", "--upgrade"] + [arg for arg in sys.argv[1:] if arg not in get_pip_only]
runpy.run_module("pip", run_name="__main__", alter_sys=True)
PY
python_version=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
# extender/ and lab/ are Python packages of their own (ruff, mypy and pytest cover them); tests/, testsupport/ (the
# tests' set-up), extensions/ and benchmarks/ are not module content (ruff covers them).
exec "$venv/bin/ansible-test" sanity --python "$python_version" \
  --exclude extender/ --exclude lab/ --exclude tests/ --exclude testsupport/ --exclude extensions/ --exclude .ci/ \
  --exclude benchmarks/ "$@"
