"""Every command and config example in README.md, docs/ and extender/README.md runs or is validated here.

Each fenced block is taken from the Markdown and checked by what it is: commands that can run here run (the
simulator, the NVML simulator CLI, the boot-time apply), the others are checked as far as they can be without a
fleet (`make -n`, `ansible-playbook --list-hosts`, the paths and options they name); YAML examples go through the
validator the collection itself uses (scheduler configurations through kube_scheduler_config_errors, layouts
through mig_node_resources, simulator fleets through the simulator's loader); the documented managedResources list
is compared with the Hong Kong layouts. A block that no check recognises fails: a new example needs a check here,
or the `text` tag when it is output, not input.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from gpufleet_testsupport.collection import collections_path

REPO = Path(__file__).resolve().parents[2]

COLLECTIONS_PATH = collections_path()  # also makes ansible_collections.gpufleet.mig importable
BIN = Path(sys.executable).parent
DOCS = [
    "README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")),
    "extender/README.md",
    "examples/README.md",
]
BOOT_APPLY = "ansible_collections.gpufleet.mig.plugins.module_utils.boot_apply"
SHELL_TAGS = {"sh", "console", "bash"}
NOT_CHECKED_TAGS = {"text"}  # program output and directory listings, not input (the layout listing is checked below)


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # of the opening fence
    tag: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        lines = (REPO / doc).read_text(encoding="utf-8").splitlines()
        start = None
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                if start is None:
                    start, tag, body = number, line[3:].strip(), []
                else:
                    found.append(Block(doc, start, tag, "\n".join(body)))
                    start = None
            elif start is not None:
                body.append(line)
    return found


ALL = blocks()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # not the outer make's flags
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = COLLECTIONS_PATH
    return env


def _completed(
    args: list[str], env: dict | None = None, cwd: Path = REPO, timeout: int = 300
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        args, env=env or _env(), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{shlex.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done


def _run(args: list[str], env: dict | None = None, cwd: Path = REPO, timeout: int = 300) -> str:
    """Everything the command printed, stdout then stderr."""
    done = _completed(args, env, cwd, timeout)
    return done.stdout + done.stderr


def _json(args: list[str]):
    """The command's JSON answer: its stdout alone (stderr may carry a library's warnings)."""
    return json.loads(_completed(args).stdout)


def commands(text: str) -> list[str]:
    """The block's commands: comments and blank lines dropped, continuations joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


# --- lab-like files the commands name, made here from the inventory (make test does not run make lab) ----------


@pytest.fixture(scope="module")
def lab_files(tmp_path_factory) -> dict[str, str]:
    """build/lab paths the docs name -> the same files made in a temporary directory by the collection's code."""
    tmp = tmp_path_factory.mktemp("lab")
    inventory = _json([str(BIN / "ansible-inventory"), "-i", "inventories/hongkong", "--list"])
    hostvars = inventory["_meta"]["hostvars"]
    paths = {}
    for doc_text in (b.text for b in ALL):
        for node in re.findall(r"build/lab/hongkong/(?:hosts|nvml)/(hk-gpu-\d\d)", doc_text):
            layout = tmp / f"{node}-mig-layout.json"
            state = tmp / f"{node}-nvml.json"
            if not layout.exists():
                layout.write_text(json.dumps({"config": hostvars[node]["mig_partition_config"], "reset": True}))
                _run(
                    [sys.executable, "-m", BOOT_APPLY, "--config", str(layout), "--nvml-sim-state", str(state)],
                    env={**_env(), "PYTHONPATH": COLLECTIONS_PATH},
                )
            paths[f"build/lab/hongkong/hosts/{node}/etc/gpufleet/mig-layout.json"] = str(layout)
            paths[f"build/lab/hongkong/nvml/{node}.json"] = str(state)
    settings = tmp / "extender.yaml"  # a user's own extender settings file, as the simulator docs suggest
    settings.write_text("GPU_UTIL_THRESHOLD: 0.8\n")
    paths["--config extender.yaml"] = f"--config {settings}"
    return paths


def _substitute(text: str, lab_files: dict[str, str]) -> str:
    for ours, theirs in lab_files.items():
        text = text.replace(ours, theirs)
    return text


@pytest.fixture(scope="module")
def hongkong():
    from gpufleet_lab.simulate.fleet import fleet_from_inventory

    return fleet_from_inventory(REPO / "inventories" / "hongkong")


# --- one command -------------------------------------------------------------------------------------------


def check_command(command: str, block: Block, tmp_path: Path, lab_files: dict[str, str], built: set[str]) -> None:
    words = shlex.split(command)
    env = _env()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if words[0] == "env":  # `env VAR=... program`
        words.pop(0)
        while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            key, value = words.pop(0).split("=", 1)
            env[key] = value
    program, args = words[0], words[1:]
    if "&&" in words:  # `cd k8s && go test ./gpuscore/`, `source ... && molecule test -s x`
        first, rest = command.split("&&", 1)
        check_command(first.strip(), block, tmp_path, lab_files, built)
        check_command(rest.strip(), block, tmp_path, lab_files, built)
        return
    if program == "make":
        dry_run = _run(["make", "-n", *args], env=env)
        if "images" in args:  # the tags it builds, which the block may then tag and push
            built.update(re.findall(r"--tag (localhost/\S+)", dry_run))
    elif program == "cd":
        assert (REPO / args[0]).is_dir(), f"{block}: no directory {args[0]}"
        built.add(f"cwd={args[0]}")
    elif program == "go":
        cwd = next((b[4:] for b in built if b.startswith("cwd=")), ".")
        for arg in (a for a in args if a.startswith("./")):  # each package; ./x/... is x and every package below
            package = REPO / cwd / arg.removesuffix("...")
            tests = package.rglob("*_test.go") if arg.endswith("/...") else package.glob("*_test.go")
            assert list(tests), f"{block}: {command}: no Go tests in {package}"
    elif program == "source":
        assert (REPO / args[0]).is_file(), f"{block}: {args[0]} does not exist"
    elif program == "molecule":
        scenario = args[args.index("-s") + 1]
        assert (REPO / "extensions" / "molecule" / scenario / "molecule.yml").is_file(), (
            f"{block}: no scenario {scenario}"
        )
    elif program == "ansible-playbook":
        listed = [a for a in args if a not in ("--check", "--diff")]
        listed = [a.replace("$PWD", str(REPO)) for a in listed]
        out = _run([str(BIN / "ansible-playbook"), *listed, "--list-hosts"], env=env)
        assert "Could not match supplied host pattern" not in out, f"{block}: {command}: {out}"
        assert re.search(r"hosts \([1-9]", out), f"{block}: {command} selects no host:\n{out}"
    elif program == "gpufleet-extender":
        _check_extender_cli(args, block)
    elif program == "gpufleet-lab":
        assert args[0] == "simulate", f"{block}: {command}: gpufleet-lab has no documented command {args[0]}"
        _check_simulate(args, tmp_path, lab_files)
    elif program in (".venv/bin/pytest", "pytest"):
        paths = [a for a in args if not a.startswith("-") and (REPO / a).exists()]
        assert paths, f"{block}: {command}: names no existing test path"
        if "-k" in args:
            word = args[args.index("-k") + 1]
            sources = "".join(
                p.read_text()
                for a in paths
                for p in ([REPO / a] if a.endswith(".py") else (REPO / a).rglob("test_*.py"))
            )
            assert re.search(rf"def test_\w*{re.escape(word)}", sources), f"{block}: -k {word} selects no test"
    elif program in ("python", "python3") and args[:2] == ["-m", "pip"]:
        _check_pip(args[2:], block)
    elif program == "ansible-galaxy" and args[:2] == ["collection", "install"]:
        # The artifact `make build` writes, at galaxy.yml's version.
        galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
        artifact = f"{galaxy['namespace']}-{galaxy['name']}-{galaxy['version']}.tar.gz"
        assert args[2:] == [artifact], f"{block}: {command}: the collection's artifact is {artifact}"
    elif program == "ansible-builder":
        definition = args[args.index("--file") + 1]
        assert args[0] in ("create", "build") and definition == "execution-environment.yml", f"{block}: {command}"
        galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
        if "--tag" in args:
            tag = args[args.index("--tag") + 1]
            assert tag.endswith(f":{galaxy['version']}"), f"{block}: {tag} is not tagged with the collection's version"
    elif program in (".venv/bin/python", "python", "python3") and args[0] != "-m":
        script = REPO / args[0]
        assert script.is_file(), f"{block}: {args[0]} does not exist"
        help_text = _run([sys.executable, str(script), "--help"], env=env)
        for option in (a for a in args[1:] if a.startswith("--")):
            assert option in help_text, f"{block}: {script.name} has no option {option}"
        if "--sections" in args:
            for section in args[args.index("--sections") + 1].split(","):
                assert section in help_text, f"{block}: {script.name} has no section {section}"
    elif program in (".venv/bin/python", "python", "python3"):
        # A module of the collection (boot_apply, nvml_sim), run for real on files made from the inventory.
        if args[1] == "gpufleet_lab.simulate.dra" and "--hours" not in args:
            args = [*args, "--hours", "0.1"]  # the documented day's search, on a short trace
        _run([sys.executable, *[_substitute(a, lab_files) for a in args]], env=env)
    elif program in ("docker", "podman") and args[0] in ("tag", "push"):
        # tag <built> <name>, then push <name>: only what the block built or tagged, under the collection's version.
        source, *name = args[1:]
        assert source in built, f"{block}: {command}: {source} is not an image the block built"
        version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
        assert source.endswith(f":{version}"), f"{block}: {source} is not tagged with the collection's version"
        built.update(name)
    elif program in ("docker", "podman"):
        if args[0] == "build":
            image, context = args[args.index("-t") + 1], args[-1]
            dockerfile = REPO / args[args.index("-f") + 1] if "-f" in args else REPO / context / "Dockerfile"
            assert dockerfile.is_file() and (REPO / context).is_dir(), f"{block}: no {dockerfile} / context {context}"
            built.add(image)
        else:
            image = args[-1]
            assert image in built, f"{block}: {command}: image {image} is not the one the block builds"
            config = (REPO / "extender/src/gpufleet_extender/config.py").read_text()
            for setting in (args[i + 1].split("=")[0] for i, a in enumerate(args) if a == "-e"):
                assert setting in config, f"{block}: {setting} is no extender setting"
    elif program == "cp":
        # `cp -r inventories/example inventories/mine`: the source exists; later commands may name the copy.
        source, target = [a for a in args if not a.startswith("-")]
        assert (REPO / source).exists(), f"{block}: {source} does not exist"
        built.add(f"copy={target}={source}")
    elif program == "grep":
        # A search in the repository (or a copy the block made): run it on the original, it must find something.
        copies = dict(b[5:].split("=", 1) for b in built if b.startswith("copy="))
        paths = [copies.get(a, a) for a in args if not a.startswith("-")]
        pattern, paths = paths[0], paths[1:]
        assert paths and all((REPO / path).exists() for path in paths), f"{block}: {command}: no such path"
        _run(["grep", *[a for a in args if a.startswith("-")], pattern, *paths])
    elif program == "kubectl" and "-f" not in args:
        _check_kubectl_read(args, block, command)
    elif program in ("systemctl", "journalctl"):
        # A unit of the collection's: one the mig_partition role installs.
        units = [a for a in args if a.endswith((".service", ".timer"))]
        assert units, f"{block}: {command}: names no unit"
        for unit in units:
            assert (ROLES / "mig_partition/templates" / f"{unit}.j2").is_file(), f"{block}: no unit {unit} is installed"
    elif program == "curl":
        # The extender's own endpoints, over a port-forward to 127.0.0.1 and https as the role serves them.
        (url,) = [a for a in args if a.startswith("http")]
        assert url.startswith("https://127.0.0.1:"), f"{block}: {url}: the extender serves https, here port-forwarded"
        path = "/" + url.split("/", 3)[3]
        routes = "".join(p.read_text() for p in (REPO / "extender/src/gpufleet_extender/routers").glob("*.py"))
        assert f'"{path}"' in routes, f"{block}: the extender has no endpoint {path}"
    elif program == "kubectl":
        # The files a kubectl command applies exist and are what the command's namespace says.
        files = [args[i + 1] for i, a in enumerate(args) if a == "-f"]
        namespace = args[args.index("--namespace") + 1] if "--namespace" in args else None
        for path in files:
            assert (REPO / path).is_file(), f"{block}: {path} does not exist"
            for doc in yaml.safe_load_all((REPO / path).read_text()):
                if doc and namespace:
                    assert doc["metadata"].get("namespace") == namespace, f"{block}: {path} is not in {namespace}"
    elif program == "pip":
        _check_pip(args, block)
    else:
        pytest.fail(f"{block}: no check for the command {command!r}: add one to tests/unit/test_documented_commands.py")


KUBECTL_READS = {"get", "describe", "logs", "port-forward", "rollout", "top", "auth", "events"}


def _check_kubectl_read(args: list[str], block: Block, command: str) -> None:
    """A read-only kubectl command (get, describe, logs, ...): its namespace is one the roles deploy into (or a tenant's
    of the Hong Kong inventory, or Kubernetes' own), and each `kind/name` it names is an object the roles create."""
    valued = ("-n", "--namespace")
    words = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in valued)]
    assert words and words[0] in KUBECTL_READS, f"{block}: {command}: not a kubectl read this test knows"
    text = "".join(_role_text(role.name) for role in ROLES.iterdir() if role.is_dir())
    for flag in ("-n", "--namespace"):
        if flag in args:
            namespace = args[args.index(flag) + 1]
            fleet = yaml.safe_load((ROLES / "gpufleet" / "defaults" / "main.yml").read_text())
            known = set(re.findall(r"default\('([a-z0-9-]+)'\)", text)) | {"kube-system", "monitoring"}
            known |= {fleet["gpufleet_namespace"], fleet["gpufleet_node_agents_namespace"]}
            tenants = yaml.safe_load((REPO / "inventories/hongkong/group_vars/all/fleet.yml").read_text())
            known |= {n for tenant in tenants["gpufleet_tenants"].values() for n in tenant.get("namespaces", [])}
            assert namespace in known, f"{block}: {command}: no role deploys into namespace {namespace}"
    for word in args[1:]:
        kinds = "deploy|deployment|ds|daemonset|svc|service|pod|cm|configmap|secret"
        kind_name = re.fullmatch(rf"({kinds})/([a-z0-9-]+)", word)
        if kind_name:
            assert kind_name.group(2) in text, f"{block}: {command}: the roles create no {word}"


# Where `ansible-galaxy collection install` puts the collection by default: the docs name its files there.
INSTALLED_COLLECTION = "~/.ansible/collections/ansible_collections/gpufleet/mig/"


def _check_pip(args: list[str], block: Block) -> None:
    """`pip install -r <the collection's requirements file>`, `pip install <the collection's extender>`,
    `pip install <package>` of the controller or the extender, or `pip download <requirement>...` of the GPU hosts'
    packages exactly as the mig_partition role installs them."""
    assert args[0] in ("install", "download"), f"{block}: pip {args[0]}"
    if args[0] == "download":
        defaults = yaml.safe_load((REPO / "roles/mig_partition/defaults/main.yml").read_text())
        host = [defaults["mig_partition_nvml_package"], *defaults["mig_partition_pod_resources_packages"]]
        requirements = [a for a in args[1:] if not a.startswith("-") and a[0].isalpha() and "/" not in a]
        assert requirements and set(requirements) <= set(host), f"{block}: {requirements} are not the hosts' {host}"
    elif args[1] == "-r":
        assert args[2].startswith(INSTALLED_COLLECTION), f"{block}: {args[2]} is not the collection's file"
        assert (REPO / args[2].removeprefix(INSTALLED_COLLECTION)).is_file(), f"{block}: no {args[2]}"
    elif "/" in args[1]:
        path = REPO / args[1].removeprefix(INSTALLED_COLLECTION).removeprefix("./")
        name = re.search(r'^name = "(.+)"$', (path / "pyproject.toml").read_text(), re.M)
        assert name and name.group(1) in ("gpufleet-extender", "gpufleet-lab"), f"{block}: {args[1]}"
    else:
        requirement = re.match(r"[A-Za-z0-9_.-]+", args[1]).group(0)
        known = (REPO / "requirements.txt").read_text() + (REPO / "extender/pyproject.toml").read_text()
        assert requirement in known, f"{block}: {requirement} is not a requirement of the collection or the extender"


def _check_extender_cli(args: list[str], block: Block) -> None:
    cli = str(BIN / "gpufleet-extender")
    help_text = _run([cli, args[0], "--help"])
    for option in re.findall(r"--[a-z-]+", " ".join(args)):
        assert option in help_text, f"{block}: gpufleet-extender {args[0]} has no option {option}"


def _check_simulate(args: list[str], tmp_path: Path, lab_files: dict[str, str]) -> None:
    args = shlex.split(_substitute(shlex.join(args), lab_files))
    if "--output" in args:  # the documented directory is replaced by a temporary one
        args[args.index("--output") + 1] = str(tmp_path / "sim")
    else:
        args += ["--output", str(tmp_path / "sim")]
    if "--trace" not in args:
        args += ["--hours", "0.05"]  # the documented command, on a short trace
    _run([str(BIN / "gpufleet-lab"), *args, "--no-plot", "--quiet"])


SHELL_BLOCKS = [b for b in ALL if b.tag in SHELL_TAGS]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=str)
def test_every_documented_command_runs_or_is_valid(block, tmp_path, lab_files):
    if re.search(r"^[A-Z_]+=\"", block.text, re.M):  # the block defines a variable: it is one script, run as is
        script = _substitute(block.text, lab_files)
        _run(["bash", "-euo", "pipefail", "-c", script])
        return
    built: set[str] = set()
    for command in commands(block.text):
        check_command(command, block, tmp_path, lab_files, built)


# --- config examples ------------------------------------------------------------------------------------------

ROLES = REPO / "roles"


def _role_text(role: str) -> str:
    return "".join(p.read_text() for p in (ROLES / role).rglob("*") if p.is_file() and p.suffix in (".j2", ".yml"))


def check_yaml(block: Block, hongkong, tmp_path: Path) -> None:
    data = yaml.safe_load(block.text)
    from ansible_collections.gpufleet.mig.plugins.filter.kube_scheduler import kube_scheduler_config_errors
    from ansible_collections.gpufleet.mig.plugins.filter.mig_layout import mig_node_resources

    if isinstance(data, list) and all(isinstance(p, dict) and "hosts" in p for p in data):
        playbook = tmp_path / "play.yml"
        playbook.write_text(block.text)
        _run([str(BIN / "ansible-playbook"), "-i", "inventories/hongkong", "--syntax-check", str(playbook)])
    elif isinstance(data, dict) and "mig_partition_config" in data:
        assert mig_node_resources(data["mig_partition_config"], 8)
    elif isinstance(data, dict) and ("extenders" in data or ("profiles" in data and "schedulerName" in str(data))):
        config = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", **data}
        config.setdefault("profiles", [{"schedulerName": "default-scheduler"}])
        for profile in config["profiles"]:
            for plugin in profile.get("pluginConfig", []):
                plugin.get("args", {}).pop("...", None)  # the example's elision
        # As the role checks it: gpufleet-scheduler registers GPUScore besides the in-tree plugins.
        plugins = ["GPUScore"] if "GPUScore" in block.text else []
        errors = kube_scheduler_config_errors(config, plugins)
        assert errors == [], f"{block}: kube-scheduler would refuse it: {errors}"
        for extender in data.get("extenders", []):
            documented = {r["name"] for r in extender.get("managedResources", [])}
            layouts = {d.resource for node in hongkong.nodes for d in node.devices}
            assert documented == layouts, (
                f"{block}: managedResources {sorted(documented)} differ from what the Hong Kong layouts expose "
                f"{sorted(layouts)}"
            )
    elif isinstance(data, dict) and data.get("kind") == "DeschedulerPolicy":
        text = _role_text("descheduler")
        assert data["apiVersion"] in text, f"{block}: the role renders another apiVersion"
        for profile in data["profiles"]:
            for plugin in profile["pluginConfig"]:
                assert plugin["name"] in text, f"{block}: the role has no {plugin['name']}"
    elif isinstance(data, list) and data and "job_name" in data[0]:
        assert data[0]["job_name"] in _role_text("dcgm_exporter"), f"{block}: the role's scrape job has another name"
    elif isinstance(data, dict) and "nodes" in data:
        from gpufleet_lab.simulate.fleet import fleet_from_yaml

        fleet_file = tmp_path / "fleet.yml"
        fleet_file.write_text(block.text)
        assert fleet_from_yaml(fleet_file).nodes
    elif isinstance(data, dict) and "nodeSelector" in data:
        text = _role_text("tenants")
        assert all(key in text for key in data["nodeSelector"]), f"{block}: the tenants role sets other labels"
        assert all(t["key"] in text for t in data["tolerations"]), f"{block}: the tenants role sets other taints"
    elif isinstance(data, dict) and data.get("kind") == "PodDisruptionBudget":
        # The drain-safe budget the tenants' -objects admission policy asks for (refusals in test_hostile_tenant).
        spec = data["spec"]
        assert "minAvailable" not in spec and spec["maxUnavailable"] not in (0, "0%"), f"{block}: blocks a drain"
        assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow", f"{block}: unhealthy pods would hold the budget"
        assert "unhealthyPodEvictionPolicy == 'AlwaysAllow'" in _role_text("tenants"), f"{block}: the role asks else"
    elif isinstance(data, dict) and data.get("kind") == "AdmissionConfiguration":
        assert "matchContains" in str(data) and "nvidia.com/" in str(data)
    elif isinstance(data, dict) and "spec" in data and "hard" in data["spec"]:
        # The finnlp quota example: the pool's devices split over its namespaces.
        tenant = re.search(r"tenant (\w+)", block.text).group(1)
        namespaces = len(hongkong.namespaces_of(tenant))
        for key, value in data["spec"]["hard"].items():
            resource = key.removeprefix("requests.")
            total = sum(1 for n in hongkong.nodes if n.tenant == tenant for d in n.devices if d.resource == resource)
            total *= hongkong.replicas_for(tenant, resource)  # a time-sliced pool's quota counts replicas
            assert value == total // namespaces, f"{block}: {key}: {value}, the layouts give {total // namespaces}"
    elif isinstance(data, dict) and "gpufleet_tenants" in data:
        # A pool's sharing: what the tenants, device plugin and extender roles read, through their filter.
        from ansible_collections.gpufleet.mig.plugins.filter.tenants_model import tenants_sharing

        sharing = tenants_sharing(data["gpufleet_tenants"])
        assert sharing["errors"] == [] and sharing["configs"], f"{block}: {sharing['errors'] or 'no pool shares'}"
        for tenant, resources in sharing["tenants"].items():
            for resource, replicas in resources.items():
                assert hongkong.replicas_for(tenant, resource) == replicas, f"{block}: the inventory says otherwise"
    elif isinstance(data, dict) and set(data) <= set(_role_text("tenants").split()) | {"tenants_quota_overrides"}:
        for variable in data:
            assert variable in (ROLES / "tenants/meta/argument_specs.yml").read_text(), f"{block}: no {variable}"
    elif isinstance(data, dict) and data.get("version") == "v1" and "demand" in data:
        # A mig_layout_advice demand file: read by the module's own reader, profiles of the fleet's GPUs.
        from ansible_collections.gpufleet.mig.plugins.module_utils.profile_tables import H100_80GB
        from ansible_collections.gpufleet.mig.plugins.modules.mig_layout_advice import _read_demand_file

        path = tmp_path / "demand.yml"
        path.write_text(yaml.safe_dump(data))
        document = _read_demand_file(str(path))
        names = {profile.name for profile in H100_80GB.profiles}
        for key in ("demand", "minimums"):
            assert set(document.get(key, {})) <= names, f"{block}: {key} names a profile an H100 does not have"
        assert set(document.get("allowed_profiles", [])) <= names, f"{block}: allowed_profiles"
    else:
        pytest.fail(f"{block}: no check for this YAML example: add one to tests/unit/test_documented_commands.py")


@pytest.mark.parametrize("block", [b for b in ALL if b.tag == "yaml"], ids=str)
def test_every_yaml_example_is_valid(block, hongkong, tmp_path):
    check_yaml(block, hongkong, tmp_path)


@pytest.mark.parametrize("block", [b for b in ALL if b.tag == "json"], ids=str)
def test_every_json_example_loads(block, tmp_path):
    from gpufleet_lab.simulate.trace import load_trace

    data = json.loads(block.text)
    if "arrival" in data:  # a trace line
        trace = tmp_path / "trace.jsonl"
        trace.write_text(block.text + "\n")
        assert load_trace(trace).pods
    else:  # an NVML simulator state
        from ansible_collections.gpufleet.mig.plugins.module_utils.nvml_sim import new_gpu, new_state

        # The documented keys are the ones the simulator writes.
        assert set(data) == set(new_state(gpus=1)) and data["version"] == 1
        assert set(data["gpus"][0]) == set(new_gpu(0, "NVIDIA H100 80GB HBM3"))


@pytest.mark.parametrize("block", [b for b in ALL if b.tag == "ini"], ids=str)
def test_the_documented_unit_is_the_roles(block):
    template = (ROLES / "mig_partition/templates/gpufleet-mig-layout.service.j2").read_text()
    for line in block.text.splitlines():
        if "=" in line:
            key = line.split("=", 1)[0]
            assert f"{key}=" in template, f"{block}: the unit template has no {key}"
    module = re.search(r"-m (\S+)", block.text).group(1)
    assert module in (ROLES / "mig_partition/vars/main.yml").read_text(), f"{block}: the unit runs another module"


def test_every_block_is_checked():
    checked = SHELL_TAGS | NOT_CHECKED_TAGS | {"yaml", "json", "ini"}
    unknown = [f"{b} ({b.tag or 'no tag'})" for b in ALL if b.tag not in checked]
    assert not unknown, f"blocks no test checks (tag them, or add a check): {unknown}"


def test_the_repository_layout_listing_names_existing_paths():
    (listing,) = [b for b in ALL if b.doc == "docs/development.md" and b.tag == "text" and "galaxy.yml" in b.text]
    for line in listing.text.splitlines():
        paths = line.split("  ")[0].split()  # "playbooks/site.yml mig.yml": the second beside the first
        first = paths[0]
        for path in paths:
            beside = REPO / Path(first.rstrip("/")).parent / path
            assert (REPO / path).exists() or beside.exists(), f"{listing}: {path} does not exist"


def test_the_verdicts_links_point_at_sections_of_the_simulator_docs():
    from gpufleet_lab.simulate import verdict

    headings = re.findall(r"^#+ (.+)$", (REPO / verdict.DOCS).read_text(), re.M)
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-") for h in headings}
    sections = {verdict.GOALS_SECTION, verdict.STRATEGIES_SECTION, verdict.SHARED_SECTION, verdict.RELAYOUT_SECTION}
    assert sections | {verdict.GAINS_SECTION, verdict.SENSITIVITY_SECTION} <= anchors


def test_the_layout_filters_are_documented():
    names = ["gpufleet.mig.mig_node_resources", "gpufleet.mig.mig_node_instances"]
    docs = _json([str(BIN / "ansible-doc"), "-t", "filter", "--json", *names])
    for name in names:
        assert docs[name]["doc"]["short_description"] and docs[name]["examples"], name


# --- defaults a page states -------------------------------------------------------------------------------------

ROLE_DEFAULTS = {
    name: value
    for path in sorted(ROLES.glob("*/defaults/main.yml"))
    for name, value in (yaml.safe_load(path.read_text()) or {}).items()
}


def _cells(line: str) -> list[str]:
    """A table row's cells; `\\|` is a pipe inside a cell (as in a Jinja default)."""
    cells = re.split(r"(?<!\\)\|", line.strip().removeprefix("|").removesuffix("|"))
    return [cell.strip().replace("\\|", "|") for cell in cells]


def table_rows(is_default_column) -> list[tuple[str, list[str], int]]:
    """(page, cells, default column) for every body row of every Markdown table in the docs whose header has a
    column `is_default_column` accepts (its lower-cased title)."""
    rows = []
    for doc in DOCS:
        column = None
        for line in (REPO / doc).read_text(encoding="utf-8").splitlines():
            if not line.startswith("|"):
                column = None
                continue
            cells = _cells(line)
            if column is None:
                column = next((i for i, c in enumerate(cells) if is_default_column(c.lower())), -1)
                continue
            if column < 0 or column >= len(cells) or set(line) <= set("|-: "):
                continue
            rows.append((doc, cells, column))
    return rows


def documented_defaults() -> list[tuple[str, str, str]]:
    """(page, variable, value) for every row of a Markdown table with a `default` column whose first cell names a
    role variable (`name`) and whose default cell is one literal (`value`); prose in that cell is not checked."""
    rows = []
    for doc, cells, column in table_rows(lambda title: title == "default"):
        name = re.fullmatch(r"`([a-z][a-z0-9_]+)`(?: \(.*\))?", cells[0])
        value = re.fullmatch(r"`([^`]*)`", cells[column])
        if name and value and name.group(1) in ROLE_DEFAULTS:
            rows.append((doc, name.group(1), value.group(1)))
    return rows


@pytest.mark.parametrize(("doc", "name", "value"), documented_defaults(), ids=lambda x: str(x))
def test_every_default_a_table_states_is_the_roles(doc, name, value):
    """A page's table that gives a role variable and its value must give the role's default: a default changed in
    the role and not in the page fails here."""
    default = ROLE_DEFAULTS[name]
    if isinstance(default, str) and "{{" not in default:  # `1.30` is the text 1.30, not the number 1.3
        assert value in (default, json.dumps(default)), f"{doc}: {name} is `{value}`, the role's default is `{default}`"
    elif isinstance(default, str):
        # A computed default may be written as its template or as the bare expression inside it.
        inner = re.fullmatch(r"\{\{\s*(.*?)\s*\}\}", default.strip())
        assert value in (default.strip(), inner and inner.group(1)), (
            f"{doc}: {name} is `{value}`, the role's default is `{default.strip()}`"
        )
    else:
        stated = yaml.safe_load(value) if value not in ("", "null") else None
        assert stated == default, f"{doc}: {name} is `{value}`, the role's default is `{default}`"


# --- the values a role renders: GPUScore's args --------------------------------------------------------------


def _jinja():
    import jinja2
    from jinja2.nativetypes import NativeEnvironment

    env = NativeEnvironment(undefined=jinja2.StrictUndefined)
    env.filters["bool"] = lambda v: v if isinstance(v, bool) else str(v).lower() in ("true", "yes", "1", "on")
    return env


UNRENDERED = object()


def _render(env, value, context: dict):
    """value rendered against context, or UNRENDERED when it needs more than Jinja's own filters and `bool` (a
    collection filter, an inventory variable) or names a default still a template."""
    if not (isinstance(value, str) and "{{" in value):
        return value
    try:
        rendered = env.from_string(value.strip()).render(context)
    except Exception:
        return UNRENDERED
    return UNRENDERED if isinstance(rendered, str) and "{{" in rendered else rendered


def _rendered_defaults() -> dict:
    """The roles' defaults with their templates rendered against each other, as Ansible would with an inventory
    that sets none of them; one that cannot be rendered here stays a template."""
    env, values = _jinja(), dict(ROLE_DEFAULTS)
    for _ in range(6):  # chains of defaults are a few deep
        for name, value in values.items():
            rendered = _render(env, value, values)
            if rendered is not UNRENDERED:
                values[name] = rendered
    return values


def _plugin_args() -> dict:
    """GPUScore's args as the kube_scheduler role writes them with the roles' defaults (the ones it can render)."""
    env, rendered = _jinja(), _rendered_defaults()
    args = {}
    for arg, template in rendered["kube_scheduler_plugin_args"].items():
        value = _render(env, template, rendered)
        if value is not UNRENDERED:
            args[arg] = value
    return args


PLUGIN_ARGS = _plugin_args()


def documented_plugin_args() -> list[tuple[str, str, str]]:
    """(page, arg, value) for every table row whose first cell is a GPUScore arg and whose `default` cell is one
    literal: what the kube_scheduler role writes into the plugin's args."""
    rows = []
    for doc, cells, column in table_rows(lambda title: title.startswith("default")):
        name = re.fullmatch(r"`([a-zA-Z]+)`", cells[0])
        value = re.fullmatch(r"`([^`]*)`", cells[column])
        setting = re.match(r"`([A-Z_]+)`", cells[1]) if len(cells) > 1 else None
        if name and value and name.group(1) in PLUGIN_ARGS:
            rows.append((doc, name.group(1), setting and setting.group(1), value.group(1)))
    return rows


def test_the_plugin_args_the_role_writes_are_rendered():
    # The table's check below would check nothing if the defaults stopped rendering.
    assert {"metricsMaxAgeSeconds", "gpuUtilThreshold", "prometheusURL"} <= set(PLUGIN_ARGS), PLUGIN_ARGS
    assert {row[1] for row in documented_plugin_args()} >= {"metricsMaxAgeSeconds", "prometheusURL"}


@pytest.mark.parametrize(("doc", "arg", "setting", "value"), documented_plugin_args(), ids=lambda x: str(x))
def test_every_plugin_arg_a_table_states_is_what_the_role_writes(doc, arg, setting, value):
    written = PLUGIN_ARGS[arg]
    if written is None:  # the role leaves it to the plugin, whose default is the extender's (k8s/gpuscore/args.go)
        from gpufleet_extender.config import Settings

        assert setting, f"{doc}: {arg}: the role writes null; the row names no extender setting to take it from"
        written = Settings.model_fields[setting].default
    assert yaml.safe_load(value) == written, f"{doc}: {arg} is `{value}`, the role writes {written!r}"


# --- schemes: what the roles accept ------------------------------------------------------------------------------

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def _prose_and_blocks(doc: str) -> list[tuple[int, str]]:
    return list(enumerate((REPO / doc).read_text(encoding="utf-8").splitlines(), 1))


@pytest.mark.parametrize("doc", DOCS)
def test_no_example_reaches_another_host_over_http(doc):
    """The roles refuse an http:// Prometheus (unless a lab opts out) and the scheduler reaches the extender over
    https: an example that sends a URL or token over plain http to another host shows what the roles refuse. Only a
    loopback address (a port-forward, the extender's own development default) may be http://."""
    wrong = []
    for number, line in _prose_and_blocks(doc):
        for url in re.findall(r"http://[^\s`'\")>,]+", line):
            host = re.match(r"http://(\[[^\]]*\]|[^/:]+)", url).group(1)
            if host not in LOOPBACK:
                wrong.append(f"{doc}:{number}: {url}")
        if re.search(r"enableHTTPS:\s*false", line):
            wrong.append(f"{doc}:{number}: enableHTTPS: false (the kube_scheduler role writes https)")
    assert not wrong, "examples over http where the roles accept https only:\n" + "\n".join(wrong)


# --- figures cited from another page ---------------------------------------------------------------------------

FIGURE = re.compile(r"\d+(?:[.,]\d+)*")


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _section(path: Path, anchor: str | None) -> str:
    text = path.read_text(encoding="utf-8")
    if not anchor:
        return text
    lines, out, level = text.splitlines(), [], None
    for line in lines:
        heading = re.match(r"^(#+) (.+)$", line)
        if heading and level is not None and len(heading.group(1)) <= level:
            break
        if level is not None:
            out.append(line)
        if heading and level is None and _anchor(heading.group(2)) == anchor:
            level = len(heading.group(1))
    assert level is not None, f"{path.name} has no section #{anchor}"
    return "\n".join(out)


def cited_figures() -> list[tuple[str, str, str]]:
    """(page, link text, target) for every link to another Markdown page whose text holds a figure: the way a page
    cites a figure another page measured, `[2.0 s against 14.6 s](kube_scheduler.md#metrics-at-fleet-scale)`."""
    found = []
    for doc in DOCS:
        for text, target in re.findall(r"\[([^\]]*\d[^\]]*)\]\(([^)\s]+\.md(?:#[^)\s]*)?)\)", (REPO / doc).read_text()):
            if FIGURE.search(text) and not target.startswith("http"):
                found.append((doc, text, target))
    return found


@pytest.mark.parametrize(("doc", "text", "target"), cited_figures(), ids=lambda x: str(x))
def test_every_figure_cited_from_another_page_is_that_pages(doc, text, target):
    path, _, anchor = target.partition("#")
    section = _section((REPO / doc).parent / path, anchor or None)
    missing = [
        figure for figure in FIGURE.findall(text) if not re.search(rf"(?<![\d.,]){re.escape(figure)}(?![\d])", section)
    ]
    assert not missing, f"{doc}: [{text}]({target}): {missing} not in {target}"


# --- the variables reference -----------------------------------------------------------------------------------


def test_the_variables_reference_is_what_the_argument_specs_give():
    """docs/reference/variables.md is generated (`make varref`): a spec or default changed without it fails here."""
    done = subprocess.run(
        [sys.executable, str(REPO / "tools/varref.py")], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    reference = (REPO / "docs/reference/variables.md").read_text()
    for path in ROLES.glob("*/meta/argument_specs.yml"):
        for point in yaml.safe_load(path.read_text())["argument_specs"].values():
            for name in point.get("options") or {}:
                assert f"| `{name}` |" in reference, f"{name} ({path}) is not in the reference"


# --- links, the index, file names ------------------------------------------------------------------------------

LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, seen, inblock = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inblock = not inblock
        heading = None if inblock else re.match(r"^#{1,6} (.+)$", line)
        if heading:
            slug = _slug(heading.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(doc: str) -> list[tuple[int, str]]:
    found, inblock = [], False
    for number, line in enumerate((REPO / doc).read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            inblock = not inblock
            continue
        if not inblock:
            prose = re.sub(r"`[^`]*`", "", line)  # a link written as code is not a link
            found += [(number, target) for target in LINK.findall(prose)]
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_resolves(doc):
    """Every relative link of README.md and docs/ names a file that exists, and a heading of it when it names one."""
    broken = []
    for number, target in _links(doc):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (REPO / doc).parent / path if path else REPO / doc
        if not resolved.exists():
            broken.append(f"{doc}:{number}: {target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{doc}:{number}: {target}: {path or doc} has no heading #{anchor}")
    assert not broken, "\n".join(broken)


def test_every_page_is_reachable_from_the_index():
    """From README.md, following links, a reader reaches every page of docs/ and the extender's README."""
    reached, queue = set(), ["README.md"]
    while queue:
        doc = queue.pop()
        if doc in reached:
            continue
        reached.add(doc)
        for _, target in _links(doc):
            path = target.partition("#")[0]
            if path.endswith(".md") and not re.match(r"^[a-z]+:", path):
                resolved = ((REPO / doc).parent / path).resolve()
                if resolved.is_file() and REPO in resolved.parents:
                    queue.append(str(resolved.relative_to(REPO)))
    unreachable = sorted(set(DOCS) - reached)
    assert not unreachable, f"pages no link from README.md leads to: {unreachable}"


def test_docs_file_names_follow_one_rule():
    """Lower case, words joined by `_`: the roles' own rule (mig_partition.md, kube_scheduler.md)."""
    wrong = [
        str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*") if not re.fullmatch(r"[a-z0-9_]+(\.md)?", p.name)
    ]
    assert not wrong, f"docs/ names outside the rule [a-z0-9_]: {wrong}"


# --- what the generated artefacts say about themselves ---------------------------------------------------------


def test_every_dashboard_panel_and_alert_says_what_it_shows():
    """An operator reading the dashboard or Prometheus' alerts sees what each computes and why, without the docs."""
    dashboard = json.loads((ROLES / "monitoring/files/gpufleet-fleet-dashboard.json").read_text())

    def panels(items):
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    silent = [p["title"] for p in panels(dashboard["panels"]) if p["type"] != "row" and not p.get("description")]
    assert not silent, f"dashboard panels without a description: {silent}"
    rules = yaml.safe_load((ROLES / "monitoring/files/gpufleet-alerts.rules.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts and all(r["annotations"].get("description") for r in alerts), "an alert without a description"
