# gpufleet.mig — two commands do all the set-up on a fresh machine:
#   make lab    the main job: the Hong Kong fleet, simulated (see README.md)
#   make test   the whole suite: lint, sanity, unit tests, extender tests, molecule scenarios
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
COLLECTION_LINK := build/collections/ansible_collections/gpufleet/mig
LAB_DIR := build/lab

.PHONY: help venv collection-link lab lab-reset test mutation bench-mig bench-extender bench-scheduler lint sanity pytest integration k8s-assets go-test molecule molecule-images scheduler-image system-deps build clean

help:
	@echo "make lab   - run playbooks/site.yml on the simulated Hong Kong fleet (inventories/lab)"
	@echo "make test  - ruff, ansible-lint, ansible-test sanity, pytest, galaxy build, every molecule scenario"

# --- set-up ------------------------------------------------------------------------------------------------
$(VENV)/.installed: requirements.txt extender/pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is required (Python 3.11 or newer)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet -e ./extender
	touch $@

venv: $(VENV)/.installed

# ansible finds gpufleet.mig through ansible.cfg's collections_path: build/collections -> this checkout.
collection-link:
	@mkdir -p $(dir $(COLLECTION_LINK))
	@ln -sfn ../../../.. $(COLLECTION_LINK)

# --- the lab -----------------------------------------------------------------------------------------------
# The lab keeps its state (simulated GPUs, host files) between runs like a real fleet: a second run changes
# nothing. `make lab-reset` starts it over from GPUs fresh out of the box.
lab: venv collection-link
	mkdir -p $(LAB_DIR)
	# The lab's GPUs are files: roll each pool in one batch (production rolls 25% of a pool at a time).
	ansible-playbook -i inventories/lab playbooks/site.yml -e mig_partition_serial=100%
	# Would the load-aware extender place this fleet's pods better than counting GPUs? (docs/simulator.md)
	gpufleet-extender simulate --inventory inventories/lab --output $(LAB_DIR)/sim --seed 1
	# ... and whether packing at night frees whole GPUs and nodes (spread vs pack vs auto).
	gpufleet-extender simulate --inventory inventories/lab --scenario quiet-night --output $(LAB_DIR)/sim-quiet --seed 1

lab-reset:
	rm -rf $(LAB_DIR)

# --- the suite ---------------------------------------------------------------------------------------------
test: venv collection-link lint build pytest go-test integration bench-mig sanity molecule
	@echo "make test: all checks passed"

lint: venv collection-link
	ruff check .
	ruff format --check .
	ansible-lint --profile production

build: venv
	rm -rf build/dist && mkdir -p build/dist
	ansible-galaxy collection build --force --output-path build/dist .
	ansible-galaxy collection install --force --no-deps -p build/dist/installed build/dist/gpufleet-mig-*.tar.gz

# Two runs: the collection's tests and the extender package's each have their own rootdir, conftest and helpers.
# The tests against the real control plane are their own target (`make integration`).
pytest: venv collection-link system-deps
	pytest tests -m "not integration"
	cd extender && GPUFLEET_REQUIRE_PROMETHEUS=1 pytest

# --- the real control plane ----------------------------------------------------------------------------------
# kube-apiserver, kube-scheduler, kube-controller-manager (k8s.io/kubernetes, k8s/go.mod) and etcd (k8s/etcd/go.mod),
# built from Go modules into build/k8s/bin; rebuilt only when the modules or the project's Go sources change.
# KUBE_ASSETS=/dir (or KUBEBUILDER_ASSETS) makes every user of the control plane take the binaries from /dir.
KUBE_ASSETS ?= $(or $(KUBEBUILDER_ASSETS),$(CURDIR)/build/k8s/bin)
export KUBE_ASSETS

k8s-assets:
	k8s/build.sh $(CURDIR)/build/k8s/bin

# The GPUScore plugin (k8s/gpuscore): gofmt, go vet, and go test, which checks every decision vector that
# extender/tests/test_conformance.py regenerates from scoring.py.
go-test:
	cd k8s && unformatted=$$(gofmt -l .) && { [ -z "$$unformatted" ] || { echo "gofmt needed: $$unformatted"; exit 1; }; }
	cd k8s && GOTOOLCHAIN=local CGO_ENABLED=0 go vet ./... && GOTOOLCHAIN=local CGO_ENABLED=0 go test ./...

# Roles, playbooks and the extender against a real etcd + kube-apiserver + controller-manager + kube-scheduler on
# 127.0.0.1. A missing binary fails here (GPUFLEET_REQUIRE_K8S); plain `pytest` skips these tests with one line.
integration: venv collection-link $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets)
	GPUFLEET_REQUIRE_K8S=1 pytest tests -m integration

# Benchmarks print figures (no timing asserts). bench-mig is quick and exits 1 unless every transition ends with the
# target on the simulated GPU, the brute-force minimum destroyed and every busy instance alive, so the suite runs it;
# bench-extender takes minutes.
bench-mig: venv collection-link
	python benchmarks/bench_mig.py --transitions 500 --seed 7

# Mutation testing of the core (planner, runner, spec; the extender's scoring, pods, wire, snapshot): prints the
# killed share per file and writes the survivors to build/mutation/survivors.txt. Tens of minutes on two cores, so
# not part of `make test`; tests/mutation/run_mutation.py --suite extender runs one half.
mutation: venv collection-link
	python tests/mutation/run_mutation.py

bench-extender: venv
	python extender/benchmarks/bench_extender.py

# The real kube-scheduler's pods/s without the extender, with it (KUBE_API on, as deployed) and with the GPUScore
# plugin, side by side; minutes at the default size. NODES=5000 for the large fleet.
NODES ?= 1000
PODS ?= 1000
bench-scheduler: venv collection-link $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets)
	python benchmarks/bench_scheduler.py --nodes $(NODES) --pods $(PODS)

# gpufleet-scheduler's image from the binary k8s-assets built (k8s/Containerfile.prebuilt: no registry needed);
# k8s/Dockerfile builds the same image from source where a golang image can be pulled.
SCHEDULER_IMAGE ?= localhost/gpufleet-scheduler:$(shell awk '$$1 == "k8s.io/kubernetes" {print $$2}' k8s/go.mod)
scheduler-image: system-deps $(if $(filter $(CURDIR)/build/k8s/bin,$(KUBE_ASSETS)),k8s-assets)
	rm -rf build/scheduler-image && mkdir -p build/scheduler-image
	cp $(KUBE_ASSETS)/gpufleet-scheduler /etc/ssl/certs/ca-certificates.crt build/scheduler-image/
	source tests/molecule/podman-env.sh && podman build --quiet --tag $(SCHEDULER_IMAGE) \
		--file k8s/Containerfile.prebuilt build/scheduler-image

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
