# gpufleet.mig — two commands do all the set-up on a fresh machine:
#   make lab    the main job: a fleet simulated from its inventory, Hong Kong's by default (see README.md)
#   make test   the whole suite: lint, sanity, unit tests, extender tests, molecule scenarios
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

# The newest Python 3.11+ on PATH (python3.14 ... python3.11, then python3); `make PYTHON=/path/to/python3.12 ...`
# picks one. A name on PATH that does not run (a pyenv shim without that version) is passed over.
PYTHON ?= $(or $(firstword $(foreach candidate,python3.14 python3.13 python3.12 python3.11 python3,$(shell \
	$(candidate) -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 && echo $(candidate)))),python3)
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
COLLECTION_LINK := build/collections/ansible_collections/gpufleet/mig

.PHONY: help varref venv collection-link lab lab-reset test pytest-unit pytest-roles pytest-controller pytest-extender faults mutation bench-mig bench-mig-advice bench-extender bench-remote-write bench-scheduler bench-prometheus-push lint typecheck sanity pytest pytest-lab integration k8s-assets go-test molecule molecule-images images extender-image scheduler-image system-deps build ee clean

help:
	@echo "make lab   - run playbooks/site.yml on a simulated fleet: INVENTORY=<dir>, Hong Kong's by default"
	@echo "make test  - ruff, ansible-lint, ansible-test sanity, pytest, galaxy build, every molecule scenario"

# --- set-up ------------------------------------------------------------------------------------------------
# requirements.txt is the controller's (docs/controller.md); requirements-dev.txt adds the tests' and tools'.
$(VENV)/.installed: requirements.txt requirements-dev.txt extender/pyproject.toml lab/pyproject.toml testsupport/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "Python 3.11 or newer is required: none found on PATH (tried python3.14 ... python3.11, python3)," \
	    "or PYTHON=$(PYTHON) is older or does not run. Install one, or name it: make PYTHON=/path/to/python3.12 ..."; \
	  exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	@# One call: the lab's dependency on gpufleet-extender is the checkout's, never an index's; gpufleet-testsupport is
	@# the suites' and benchmarks' shared set-up (servers, waits, the control plane), importable without a sys.path edit.
	$(BIN)/pip install --quiet -e './extender[k8s,test,bench]' -e './lab[plots,test]' -e ./testsupport
	touch $@

# The kubelet pod-resources API's protobuf messages are generated from proto/ here, not committed: every target that
# uses or ships the collection (venv, collection-link, build, hence lab, test, sanity) has them.
PROTO_PY := plugins/module_utils/kubelet_podresources_v1_pb2.py
$(PROTO_PY): proto/kubelet_podresources_v1.proto $(VENV)/.installed
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$(dir $@) $<

venv: $(VENV)/.installed $(PROTO_PY)

# ansible finds gpufleet.mig through ansible.cfg's collections_path: build/collections -> this checkout.
# Made only when missing or wrong: `ln -sfn` removes the link before it makes it again, and steps of `make test` run
# side by side (a playbook started in that moment would not find the collection).
collection-link: $(PROTO_PY)
	@mkdir -p $(dir $(COLLECTION_LINK))
	@[ "$$(readlink $(COLLECTION_LINK))" = ../../../.. ] || ln -sfn ../../../.. $(COLLECTION_LINK)

# docs/reference/variables.md from every role's meta/argument_specs.yml (tools/varref.py; the unit tests check it).
varref: venv
	$(BIN)/python tools/varref.py --write

# --- the lab -----------------------------------------------------------------------------------------------
# `make lab INVENTORY=<dir>` runs a fleet's own inventory on simulated hosts, before touching the fleet (Hong Kong's,
# inventories/hongkong, when not given). The inventory is used as it is; the simulation overrides (local connection,
# render mode, each host's tree and simulated GPUs under build/lab/<inventory>/) are the one file
# playbooks/vars/lab.yml, applied on top as extra vars. Each host's GPUs are simulated as its inventory says
# (gpufleet-lab hosts: product, GPU count, NVSwitch board), and the scheduler is deployed in the inventory's mode.
# The lab keeps its state (simulated GPUs, host files) between runs like a real fleet: a second run changes
# nothing. `make lab-reset` starts it over from GPUs fresh out of the box.
# Output: one line per play (the gpufleet.mig.phases callback: failures in full, `Warn ...` tasks that ran), one
# line per simulator run (its tables go to report.txt), then the closing block (gpufleet-lab verdict).
# A simulator goal not met does not fail make lab: the goals are targets for the placement policies, and the
# model shows why some cannot be met as deployed (docs/simulator.md); the block says which and why.
# `make lab LAB_GOALS=enforce` fails on one. A failed play or bad simulator input always fails make lab.
INVENTORY ?= inventories/hongkong
LAB_NAME := $(notdir $(patsubst %/,%,$(INVENTORY)))
LAB_DIR := build/lab/$(LAB_NAME)
LAB_GOALS ?=
LAB_PLAYBOOK = ANSIBLE_STDOUT_CALLBACK=gpufleet.mig.phases ansible-playbook -i $(INVENTORY) \
	-e @playbooks/vars/lab.yml -e gpufleet_lab_dir=$(CURDIR)/$(LAB_DIR)
lab: venv collection-link
	@test -e $(INVENTORY) || { echo "make lab: INVENTORY=$(INVENTORY) does not exist"; exit 1; }
	@echo "make lab: playbooks/site.yml on $(INVENTORY), simulated (build: $(LAB_DIR)), one line per play"
	@# Before anything is made: the inventory is checked whole (the same play site.yml starts with).
	@$(LAB_PLAYBOOK) playbooks/validate.yml
	@gpufleet-lab hosts --inventory $(INVENTORY) --lab-dir $(LAB_DIR)
	@$(LAB_PLAYBOOK) playbooks/site.yml
	@# What the lab runs next is decided by the inventory (its pools, products and sharing) and the settings the
	@# roles rendered (the extender's ConfigMap): gpufleet-lab plan writes both down.
	@gpufleet-lab plan --inventory $(INVENTORY) --lab-dir $(LAB_DIR) > $(LAB_DIR)/plan.env
	@# Demand-driven layouts: one advice and rollout (playbooks/mig-rebalance.yml) on a copy of a MIG pool's
	@# simulated GPUs, so that the lab's own GPUs keep their declared layout and a second run changes nothing.
	@. $(LAB_DIR)/plan.env; if [ -n "$$REBALANCE_POOL" ]; then \
	  echo "MIG re-layout: advice and rollout for $$REBALANCE_DEMAND_TEXT on a copy of pool $$REBALANCE_POOL's GPUs"; \
	  rm -rf $(LAB_DIR)/rebalance && mkdir -p $(LAB_DIR)/rebalance && cp -r $(LAB_DIR)/nvml $(LAB_DIR)/rebalance/; \
	  $(LAB_PLAYBOOK) playbooks/mig-rebalance.yml -e gpufleet_lab_dir=$(CURDIR)/$(LAB_DIR)/rebalance \
	    -e mig_rebalance_pool=$$REBALANCE_POOL -e "{\"mig_rebalance_demand\": $$REBALANCE_DEMAND}" \
	    -e mig_rebalance_report_file=$(CURDIR)/$(LAB_DIR)/rebalance/advice.txt; \
	else echo "MIG re-layout: not run, the inventory has no MIG pool"; rm -rf $(LAB_DIR)/rebalance; fi
	@# The DRA mode (docs/dra.md) rendered beside the default: the driver's release, the pools' DeviceClasses and
	@# the tenants' ResourceClaimTemplates.
	@$(LAB_PLAYBOOK) playbooks/dra.yml -e gpufleet_gpu_allocation=dra \
	  -e gpufleet_manifests_dir=$(CURDIR)/$(LAB_DIR)/manifests-dra
	@mkdir -p $(LAB_DIR)/sim $(LAB_DIR)/sim-quiet $(LAB_DIR)/sim-shared $(LAB_DIR)/sim-tp
	@# Would the load-aware extender place this fleet's pods better than counting GPUs? (docs/simulator.md) Every
	@# run reads the inventory's pools and the extender settings the roles rendered (--config). The exclusive-device
	@# runs take each time-sliced resource exclusive (SHARE_EXCLUSIVE): the fleet their goals were measured on.
	@. $(LAB_DIR)/plan.env; \
	echo "Placement simulator: mixed 4 h trace, count / random-fit / load / load-no-inflight -> $(LAB_DIR)/sim/"; \
	gpufleet-lab simulate --inventory $(INVENTORY) --config $(LAB_DIR)/extender-settings.yaml $$SHARE_EXCLUSIVE \
	  --output $(LAB_DIR)/sim --seed 1 --quiet > $(LAB_DIR)/sim/report.txt; \
	echo "Placement simulator: quiet-night trace, spread / pack / auto -> $(LAB_DIR)/sim-quiet/"; \
	gpufleet-lab simulate --inventory $(INVENTORY) --config $(LAB_DIR)/extender-settings.yaml $$SHARE_EXCLUSIVE \
	  --scenario quiet-night --output $(LAB_DIR)/sim-quiet --seed 1 --quiet > $(LAB_DIR)/sim-quiet/report.txt; \
	echo "Placement simulator: the inventory's time-slicing as deployed, count / load -> $(LAB_DIR)/sim-shared/"; \
	gpufleet-lab simulate --inventory $(INVENTORY) --config $(LAB_DIR)/extender-settings.yaml \
	  --policies count,load --output $(LAB_DIR)/sim-shared --seed 1 --quiet > $(LAB_DIR)/sim-shared/report.txt; \
	echo "Placement simulator: tensor-parallel LLM mix with interference -> $(LAB_DIR)/sim-tp/"; \
	gpufleet-lab simulate --inventory $(INVENTORY) --config $(LAB_DIR)/extender-settings.yaml $$SHARE_EXCLUSIVE \
	  --scenario tp-mix --interference 0.3 --output $(LAB_DIR)/sim-tp --seed 1 --quiet > $(LAB_DIR)/sim-tp/report.txt
	@gpufleet-lab verdict $(LAB_DIR) --inventory $(INVENTORY) $(if $(filter enforce,$(LAB_GOALS)),--enforce-goals)

lab-reset:
	rm -rf $(LAB_DIR)

# --- the suite ---------------------------------------------------------------------------------------------
# The steps run in three lanes side by side (tools/run_steps.py: a line as each step ends, logs in build/steps/,
# a timing table at the end): the control plane's Go build and the tests against it; the container images, molecule
# and sanity; the Python checks. One after the other they took longer than CI allows on two cores.
# `make test WITH_LAB=1` (what .ci/run does) runs `make lab` at the end of the second lane too
# (the first, the control plane's build and the tests against it, is the longest).
comma := ,
TEST_LANES = $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets$(comma))go-test,integration \
	molecule-images,molecule,sanity,pytest-extender,pytest-lab,pytest-controller$(if $(WITH_LAB),$(comma)lab) \
	lint,typecheck,build,pytest-unit,bench-mig,pytest-roles
test: venv collection-link system-deps
	python tools/run_steps.py $(TEST_LANES)
	@echo "make test: all checks passed"

lint: venv collection-link
	ruff check .
	ruff format --check .
	ansible-lint --profile production

# mypy --strict over the extender, the lab and plugins/module_utils (mypy.ini), as pip installs them: both packages
# are built from a copy of their sources (nothing is written into the checkout while other steps read it) into
# build/mypy/site, where the collection's library is what each wheel ships (the lab's gpufleet_lab.mig_utils, all of
# it; the extender's gpufleet_extender.mig_utils, its two shared rules), so every call into it is typed and an import
# the extender's wheel cannot satisfy fails here. Errors name the installed files: build/mypy/site/gpufleet_lab/
# mig_utils/planner.py is plugins/module_utils/planner.py, build/mypy/site/gpufleet_lab/simulate/ is
# lab/src/gpufleet_lab/simulate/.
MYPY_DIR := build/mypy
typecheck: venv
	rm -rf $(MYPY_DIR)/src $(MYPY_DIR)/site && mkdir -p $(MYPY_DIR)/src/extender $(MYPY_DIR)/src/lab $(MYPY_DIR)/src/plugins
	cp -r extender/pyproject.toml extender/README.md extender/src $(MYPY_DIR)/src/extender/
	cp -r lab/pyproject.toml lab/src $(MYPY_DIR)/src/lab/
	cp -r plugins/module_utils $(MYPY_DIR)/src/plugins/
	pip install --quiet --no-deps --no-build-isolation --no-compile --target $(MYPY_DIR)/site \
	  ./$(MYPY_DIR)/src/extender ./$(MYPY_DIR)/src/lab
	mypy

build: venv
	rm -rf build/dist && mkdir -p build/dist
	ansible-galaxy collection build --force --output-path build/dist .
	ansible-galaxy collection install --force --no-deps -p build/dist/installed build/dist/gpufleet-mig-*.tar.gz

# The collection's tests, the extender package's and the lab package's each have their own rootdir, conftest and
# helpers. The tests against the real control plane are their own target (`make integration`).
# Four parts, so that make test can put them in different lanes: the collection's unit tests, the roles'
# playbook-running tests, the extender's, the lab's (the simulator, the decision vectors, make lab's verdict).
pytest: pytest-unit pytest-roles pytest-extender pytest-lab

pytest-unit: venv collection-link system-deps
	pytest tests -m "not integration" --ignore=tests/roles

pytest-roles: venv collection-link system-deps
	pytest tests/roles -m "not integration and not controller"

# A controller prepared from requirements.txt and the collection's artifact alone runs site.yml on the lab (minutes).
pytest-controller: venv collection-link system-deps
	pytest tests/roles -m controller

pytest-extender: venv system-deps
	cd extender && GPUFLEET_REQUIRE_PROMETHEUS=1 pytest

pytest-lab: venv
	cd lab && pytest

# --- the real control plane ----------------------------------------------------------------------------------
# kube-apiserver, kube-scheduler, kube-controller-manager (k8s.io/kubernetes, k8s/go.mod) and etcd (k8s/etcd/go.mod),
# built from Go modules into build/k8s/bin; rebuilt only when the modules or the project's Go sources change.
# KUBE_ASSETS=/dir (or KUBEBUILDER_ASSETS) makes every user of the control plane take the binaries from /dir.
KUBE_ASSETS ?= $(or $(KUBEBUILDER_ASSETS),$(CURDIR)/build/k8s/bin)
export KUBE_ASSETS

k8s-assets:
	k8s/build.sh $(CURDIR)/build/k8s/bin

# The GPUScore plugin (k8s/gpuscore): gofmt, go vet, and go test, which checks every decision vector that
# lab/tests/test_conformance.py regenerates from scoring.py.
go-test:
	cd k8s && unformatted=$$(gofmt -l .) && { [ -z "$$unformatted" ] || { echo "gofmt needed: $$unformatted"; exit 1; }; }
	@# -trimpath as k8s/build.sh builds: the Kubernetes packages compiled for the control plane are reused from Go's
	@# build cache instead of compiled again.
	cd k8s && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath go vet ./... && \
	  GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-trimpath go test ./...

# Roles, playbooks and the extender against a real etcd + kube-apiserver + controller-manager + kube-scheduler on
# 127.0.0.1. A missing binary fails here (GPUFLEET_REQUIRE_K8S); plain `pytest` skips these tests with one line.
integration: venv collection-link $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets)
	GPUFLEET_REQUIRE_K8S=1 pytest tests -m integration

# Benchmarks print figures (no timing asserts). bench-mig is quick and exits 1 unless every transition ends with the
# target on the simulated GPU, the brute-force minimum destroyed and every busy instance alive, so the suite runs it;
# bench-extender takes minutes.
bench-mig: venv collection-link
	PYTHONPATH=$(CURDIR)/build/collections python benchmarks/bench_mig.py --transitions 500 --seed 7

# Mutation testing of the core (planner, runner, spec; the extender's scoring, pods, wire, snapshot): prints the
# killed share per file and writes the survivors to build/mutation/survivors.txt. Tens of minutes on two cores, so
# not part of `make test`; tests/mutation/run_mutation.py --suite extender runs one half, and
# `make mutation FILE=wire.py` one file with its own tests (minutes; survivors in build/mutation/survivors-wire.txt).
# The host-side fault suite alone, with its table per fault class (make test runs it within pytest-unit).
faults: venv collection-link
	PYTHONPATH=$(CURDIR)/build/collections python tests/faults/host_faults.py

mutation: venv collection-link
	python tests/mutation/run_mutation.py $(if $(FILE),--file $(FILE))

# The MIG layout advisor on the Hong Kong pools: demand served, instances changed, time; exits 1 if an allocated
# instance is destroyed or a changed GPU destroys more than the brute-force minimum.
bench-mig-advice: venv collection-link
	PYTHONPATH=$(CURDIR)/build/collections python benchmarks/mig_advice.py --seed 1

bench-extender: venv
	python extender/benchmarks/bench_extender.py

# METRICS_SOURCE=push: the remote-write receiver's CPU per sample and per scrape interval at 1,000 and 5,000 nodes
# (x 8 GPUs x 3 and 7 MIG instances, dcgm-exporter's labels, requests of 2,000 and 10,000 samples), beside the pull
# form's decode and build of the same fleet. A few minutes; RW_NODES=1000 for one size.
RW_NODES ?= 1000,5000
bench-remote-write: venv
	python extender/benchmarks/bench_remote_write.py --nodes $(RW_NODES)

# The real kube-scheduler's pods/s without the extender, with it (KUBE_API on, as deployed) and with the GPUScore
# plugin, side by side; minutes at the default size. NODES=5000 for the large fleet; BENCH_ARGS for more, e.g.
# "--metrics push" (Prometheus sends the load), "--metrics push --sender rw-sender" (a stand-in sender for 5,000).
NODES ?= 1000
PODS ?= 1000
BENCH_ARGS ?=
bench-scheduler: venv collection-link $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets)
	python benchmarks/bench_scheduler.py --nodes $(NODES) --pods $(PODS) $(BENCH_ARGS)

# Prometheus' own CPU while it scrapes a fleet and sends it to one or four receivers, against scraping alone.
bench-prometheus-push: venv
	python benchmarks/bench_prometheus_push.py --nodes $(RW_NODES)

# --- the images the project builds ----------------------------------------------------------------------------
# `make images` builds both with podman on this machine, no registry needed, tagged with the collection's version
# (galaxy.yml), and prints their digests; push them to your registry and set the roles' image variables
# (docs/images.md). Rebuilt each time (a minute or two; the Debian base is built once, by molecule-images).
IMAGE_VERSION := $(shell awk '$$1 == "version:" {print $$2}' galaxy.yml)
EXTENDER_IMAGE ?= localhost/gpufleet-extender:$(IMAGE_VERSION)
SCHEDULER_IMAGE ?= localhost/gpufleet-scheduler:$(IMAGE_VERSION)
IMAGE_BASE := localhost/gpufleet-debian-base:bookworm
images: extender-image scheduler-image
	@source tests/molecule/podman-env.sh && for image in $(EXTENDER_IMAGE) $(SCHEDULER_IMAGE); do \
	  echo "$$image $$(podman image inspect --format '{{.Digest}}' $$image)"; done

# The extender's serve image (extender/Containerfile) on Debian's python3 (3.11): the server's wheel (the server alone,
# extender/tests/test_wheel.py) and its packages are installed here for that Python and platform (binary wheels only,
# from pip's cache or index), and podman adds them to the base. pip's console scripts (site/bin: their first line
# names this machine's Python) stay out of the build context (.containerignore).
EXTENDER_IMAGE_DIR := build/extender-image
extender-image: venv molecule-images
	rm -rf $(EXTENDER_IMAGE_DIR) && mkdir -p $(EXTENDER_IMAGE_DIR)
	pip wheel --quiet --no-deps --wheel-dir $(EXTENDER_IMAGE_DIR)/wheels ./extender && rm -rf extender/build
	pip install --quiet --no-compile --target $(EXTENDER_IMAGE_DIR)/site --only-binary=:all: \
	  --implementation cp --python-version 3.11 \
	  $(foreach p,manylinux2014 manylinux_2_17 manylinux_2_28,--platform $(p)_$(shell uname -m)) \
	  "$$(ls $(EXTENDER_IMAGE_DIR)/wheels/gpufleet_extender-*.whl)[k8s]"
	echo site/bin > $(EXTENDER_IMAGE_DIR)/.containerignore
	source tests/molecule/podman-env.sh && podman build --quiet --build-arg BASE=$(IMAGE_BASE) \
	  --tag $(EXTENDER_IMAGE) --file extender/Containerfile $(EXTENDER_IMAGE_DIR)

# gpufleet-scheduler's image from the binary k8s-assets built (k8s/Containerfile.prebuilt: no registry needed);
# k8s/Dockerfile builds the same image from source where a golang image can be pulled.
scheduler-image: system-deps $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets)
	rm -rf build/scheduler-image && mkdir -p build/scheduler-image
	cp $(KUBE_ASSETS)/gpufleet-scheduler /etc/ssl/certs/ca-certificates.crt build/scheduler-image/
	source tests/molecule/podman-env.sh && podman build --quiet --tag $(SCHEDULER_IMAGE) \
		--file k8s/Containerfile.prebuilt build/scheduler-image

# The execution environment's build context (execution-environment.yml, docs/controller.md) in build/ee: the
# collection's artifact as build/ee-collection/gpufleet-mig.tar.gz, then `ansible-builder create`, which needs no
# registry; `ansible-builder build` builds the image from it where the base image can be pulled.
ee: venv
	rm -rf build/ee-collection build/ee && mkdir -p build/ee-collection
	ansible-galaxy collection build --force --output-path build/ee-collection .
	mv build/ee-collection/gpufleet-mig-*.tar.gz build/ee-collection/gpufleet-mig.tar.gz
	ansible-builder create --file execution-environment.yml --context build/ee --output-filename Containerfile

sanity: venv
	tests/sanity/run.sh

# System packages the suite talks to for real: podman (molecule), debootstrap (image), prometheus (extender).
system-deps:
	tests/setup-system.sh

molecule-images: system-deps
	tests/molecule/build-images.sh

molecule: venv collection-link molecule-images
	source tests/molecule/podman-env.sh && molecule test --all

clean:
	rm -rf build $(VENV)
