"""How the collection reaches a controller: the controller's requirements apart from the developers', bindep.txt, and
the execution environment's definition, which ansible-builder turns into a build context (no registry needed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            names.add(re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower())
    return names


def test_the_controller_requirements_hold_no_test_or_tooling_package():
    controller = _requirement_names(REPO / "requirements.txt")
    dev = _requirement_names(REPO / "requirements-dev.txt")
    assert controller == {"ansible-core", "kubernetes", "jinja2", "pyyaml", "cryptography"}
    assert not controller & dev, "a package in both files: one owner each"
    assert "-r requirements.txt" in (REPO / "requirements-dev.txt").read_text().splitlines()
    # make venv installs both, and the extender with its extras.
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet -r requirements-dev.txt" in makefile
    assert "$(VENV)/.installed: requirements.txt requirements-dev.txt extender/pyproject.toml" in makefile


def test_the_controller_requirements_cover_what_the_collection_imports_on_the_controller():
    """The filters, the test plugin and the callback run on the controller: every third-party module they import is
    brought by requirements.txt (or by ansible-core itself)."""
    brought = {"ansible", "jinja2", "yaml", "ansible_collections"}
    for path in (REPO / "plugins").glob("[fct]*/*.py"):
        if path.parent.name not in ("filter", "test", "callback"):
            continue
        for module in re.findall(r"^(?:from|import) ([A-Za-z_][A-Za-z0-9_]*)", path.read_text(), re.MULTILINE):
            if module in sys.stdlib_module_names or module == "__future__":
                continue
            assert module in brought, f"{path.relative_to(REPO)} imports {module}: requirements.txt does not bring it"


def test_bindep_lists_python_on_both_families_and_helm_where_packaged():
    def listed(*profiles: str) -> list[str]:
        return subprocess.run(
            [str(BIN / "bindep"), "--file", str(REPO / "bindep.txt"), "--list_all", "newline", *profiles],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()

    # bindep decides the platform from this machine; the lines say which family each package is for.
    here = listed()
    assert "python3" in here and "python3-pip" in here
    text = (REPO / "bindep.txt").read_text()
    assert re.search(r"^helm \[platform:fedora\]$", text, re.MULTILINE)
    assert re.search(r"^python3 \[platform:rpm platform:dpkg\]$", text, re.MULTILINE)


def test_ansible_builder_creates_the_execution_environment_context(tmp_path):
    """ansible-builder create on the repository's execution-environment.yml, with the collection's artifact where the
    definition takes it from: a Containerfile that installs the collection, the controller's requirements and
    system packages, and the extender package from the installed collection."""
    artifact_dir = REPO / "build" / "ee-collection"
    built = tmp_path / "dist"
    subprocess.run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--force", "--output-path", str(built), str(REPO)],
        check=True,
        capture_output=True,
    )
    artifact_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(next(built.glob("gpufleet-mig-*.tar.gz")), artifact_dir / "gpufleet-mig.tar.gz")
    context = tmp_path / "context"
    result = subprocess.run(
        [str(BIN / "ansible-builder"), "create", "--file", str(REPO / "execution-environment.yml"),
         "--context", str(context), "--output-filename", "Containerfile"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    containerfile = (context / "Containerfile").read_text()
    definition = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    assert f'ARG EE_BASE_IMAGE="{definition["images"]["base_image"]["name"]}"' in containerfile
    assert "ansible-galaxy collection install" in containerfile and "-r requirements.yml" in containerfile
    assert "--user-pip=requirements.txt --user-bindep=bindep.txt" in containerfile
    extender = "/usr/share/ansible/collections/ansible_collections/gpufleet/mig/extender"
    assert f"RUN $PYCMD -m pip install --no-cache-dir {extender}" in containerfile
    # The controller's files, as they are in the repository.
    assert (context / "_build/requirements.txt").read_text() == (REPO / "requirements.txt").read_text()
    assert (context / "_build/bindep.txt").read_text() == (REPO / "bindep.txt").read_text()
    requirements = yaml.safe_load((context / "_build/requirements.yml").read_text())
    assert requirements == {"collections": [{"name": "collections/gpufleet-mig.tar.gz", "type": "file"}]}
    # The artifact in the context is this collection at galaxy.yml's version, with what the build needs from it:
    # its requirements and bindep (ansible-builder's introspection) and the extender's sources.
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    with tarfile.open(context / "_build/collections/gpufleet-mig.tar.gz") as artifact:
        names = set(artifact.getnames())
        manifest = json.load(artifact.extractfile("MANIFEST.json"))["collection_info"]
    assert (manifest["namespace"], manifest["name"], manifest["version"]) == ("gpufleet", "mig", galaxy["version"])
    for needed in ("requirements.txt", "bindep.txt", "extender/pyproject.toml", "plugins/module_utils/layout.py"):
        assert needed in names, f"the collection's artifact lacks {needed}"
