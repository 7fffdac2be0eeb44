# One command runs the main job on the lab (`make lab`), one passes every test
# (`make test`). Both install what they need. `make help` lists the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help
.ONESHELL:
.SHELLFLAGS := -eu -o pipefail -c

VENV ?= .venv
# The controller's Python (ansible-core 2.19: >= 3.11); an Ubuntu 22.04 host: make venv PYTHON=python3.11
PYTHON ?= python3
BIN := $(CURDIR)/$(VENV)/bin
# the node-side unit tests' venv, of the nodes' Python (Ubuntu 22.04: 3.10; scripts/node-python.py)
NODE_VENV ?= .venv310
export PATH := $(BIN):$(PATH)
export CONTAINERS_CONF ?= $(CURDIR)/tests/lab/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
LAB_INVENTORY := inventories/lab/hosts.yml
PLAYBOOKS := $(wildcard playbooks/*.yml playbooks/remediate/*.yml)
# node-side unit test files that run under the controller's Python too (make unit): parts of them need serve/,
# which only the controller's .venv has, and skip under the nodes' Python; every other node-side file runs
# under the nodes' Python only
NODE_TESTS_ON_CONTROLLER_TOO := tests/unit/test_monitoring_names.py tests/unit/test_monitoring_prometheus.py
MOLECULE_SCENARIOS := $(notdir $(patsubst %/molecule.yml,%,$(wildcard molecule/*/molecule.yml)))
# `make test` runs none of them: CI stops at 90 minutes, and with real Kubernetes the lab tests alone take most
# of it (docs/benchmarks.md). The lab tests converge the same roles on three real nodes (test_site_on_lab.py:
# converge, --check --diff, drift put back); what only a scenario has (gpu_node's SXM platform with NVSwitch and
# fabric manager: the lab's nodes are PCIe A100s) runs in `make molecule` and `make test-all`.

.PHONY: help deps venv node-venv lab lab-up lab-status lab-destroy lab-image-rebuild lint syntax sanity unit molecule lab-test lab-test-all test test-all

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

deps: ## install the host's Debian packages (podman, runc, debootstrap, ...) if missing
	@scripts/ensure-host-deps.sh

venv: $(VENV)/.installed ## the pinned Python toolchain in .venv

$(VENV)/.installed: pyproject.toml $(wildcard serve/pyproject.toml serve/tools/pyproject.toml)
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(None if v >= (3, 11) else f"venv: ansible-core 2.19 needs Python >= 3.11 on the controller; $(PYTHON) is {v.major}.{v.minor}: make venv PYTHON=python3.11 (README.md, On the real servers)")'
	@echo "venv: installing the pinned toolchain into $(VENV) (a few minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	if [ -f serve/pyproject.toml ]; then $(BIN)/pip install -q -e './serve[test]' -e ./serve/tools; fi
	touch $@

node-venv: $(NODE_VENV)/.installed ## the node-side unit tests' venv, of the nodes' Python (3.10)

# Its interpreter is python3.10 on PATH, else pyenv's newest 3.10.* (no 3.10 found: fails saying how to get
# one; CI must run the node-side tests under the nodes' Python). It gets the test harness at the dev pins,
# the packages the roles put into the nodes' /opt venvs at the roles' pins, and ansible-core at its pin
# without dependencies and past its Requires-Python (>=3.11, for its controller): only its module_utils
# are imported there, the files AnsiballZ ships to a node, which ansible-core 2.19 supports on target
# Pythons 3.8-3.13; its controller code is never imported there.
$(NODE_VENV)/.installed: pyproject.toml scripts/node-python.py module_utils/model_tools.py roles/model_sync/files/model_tools_contract.py roles/kubernetes_api_client/defaults/main.yml roles/nvidia_driver/defaults/main.yml | $(VENV)/.installed
	python310=$$($(BIN)/python scripts/node-python.py interpreter)
	echo "venv: the node-side tests' venv $(NODE_VENV) from $$python310"
	rm -rf $(NODE_VENV)
	"$$python310" -m venv $(NODE_VENV)
	$(NODE_VENV)/bin/pip install -q --upgrade pip
	$(BIN)/python scripts/node-python.py requirements > $(NODE_VENV)/requirements.txt
	$(NODE_VENV)/bin/pip install -q -r $(NODE_VENV)/requirements.txt
	$(NODE_VENV)/bin/pip install -q --no-deps --ignore-requires-python "$$($(BIN)/python scripts/node-python.py ansible-core)"
	touch $@

lab-up: deps venv ## start (or repair) the three lab nodes and the mirror
	$(BIN)/python tests/lab/labctl.py up

lab: lab-up ## THE MAIN JOB on the lab: converge playbooks/site.yml on the three nodes
	# site.yml, then the summary (report.yml: one line per node: driver, GPUs, power, health)
	# in one run: one start, one inventory, the facts and SSH connections reused
	ansible-playbook -i $(LAB_INVENTORY) playbooks/site.yml playbooks/report.yml
	$(BIN)/python tests/lab/labctl.py status

lab-status: ## the lab's containers
	@$(BIN)/python tests/lab/labctl.py status

lab-destroy: ## remove the lab's containers, network, image and .lab/: nothing left behind
	$(BIN)/python tests/lab/labctl.py destroy

lab-image-rebuild: deps venv ## rebuild the node image even if it is current
	$(BIN)/python tests/lab/labctl.py image --rebuild

lint: venv ## ruff, ansible-lint (production profile), strict mypy on the gateway package
	ruff check .
	ruff format --check .
	# the code that runs on the nodes, held to their Python (3.10) by vermin: standard-library members too
	$(BIN)/python scripts/node-python.py lint
	ansible-lint
	if [ -f serve/pyproject.toml ]; then (cd serve && mypy); fi

syntax: venv ## --syntax-check every playbook against both inventories
	for inventory in inventories/production/hosts.yml $(LAB_INVENTORY); do
	  for playbook in $(PLAYBOOKS); do
	    ansible-playbook -i $$inventory --syntax-check $$playbook >/dev/null
	    echo "syntax ok: $$playbook ($$inventory)"
	  done
	done

sanity: venv ## ansible-test's validate-modules on library/ (in a throw-away collection)
	$(BIN)/python scripts/validate-modules.py

unit: venv node-venv ## unit tests (modules against the fake NVML; the gateway package's own suite), the node-side ones under 3.10
	# the real etcd, kube-apiserver, kube-controller-manager, kubeadm and kubectl some tests run on 127.0.0.1
	# (tests/unit/real_kube.py), built from their Go modules at the production pin, or reused from the cache
	$(BIN)/python tests/lab/gobuild/build.py kubernetes etcd
	# one worker per core (pytest-xdist): each test makes its own files, servers and ports. The node-side
	# test files run in the 3.10 pass below, not here (but NODE_TESTS_ON_CONTROLLER_TOO): what they test runs
	# on the nodes' Python (modules, the agent, the on-call playbooks' modules; an ansible-playbook they run is
	# the controller's .venv in either pass), and running them twice cost about 4 minutes of make test
	pytest -n auto tests/unit $$(for f in $$($(BIN)/python scripts/node-python.py tests); do \
	  case " $(NODE_TESTS_ON_CONTROLLER_TOO) " in *" $$f "*) ;; *) echo "--ignore=$$f" ;; esac; done)
	# The node-side tests under the nodes' Python (3.10, $(NODE_VENV)). Selected by a rule, not a list, so a
	# new one is not left out: a test file is node-side when it imports node-side code (a library/ module, one
	# of the project's ansible.module_utils), names a node-side file in a string ("gpu_tuning_apply.py"), or
	# imports a test file that is node-side (scripts/node-python.py tests; tests/unit/test_node_python.py
	# holds the rule to it).
	$(NODE_VENV)/bin/python -m pytest -n auto $$($(BIN)/python scripts/node-python.py tests)
	# serve/ is its own package with its own conftest: a separate run
	if [ -d serve/tests ]; then pytest serve/tests; fi
	# the lab's own Go programs (device plugin, Calico's and Grafana's stand-ins, pause): their Go tests
	(cd tests/lab/gobuild/lab-programs && GOFLAGS=-mod=readonly CGO_ENABLED=0 go test ./...)

molecule: lab-up ## every molecule scenario (role tests on lab-image containers)
	for scenario in $(MOLECULE_SCENARIOS); do
	  echo "molecule: scenario $$scenario"
	  molecule test -s $$scenario
	done

lab-test: lab-up ## acceptance tests on the running lab (site idempotence, GPU modules, faults), not the long ones
	# tests/lab/conftest.py runs test_site_on_lab.py first: it converges the nodes the others use; the long
	# lab tests it lists (LONG_LAB_TESTS, marked lab_long) are left to lab-test-all: CI stops at 90 minutes
	# the slowest lab tests named at the end (docs/benchmarks.md reads the make test figures from them)
	LAB_TESTS_REQUIRED=1 pytest -m "lab and not lab_long" --durations=30 tests/lab

lab-test-all: lab-up ## every lab acceptance test, the long ones too (their times: tests/lab/conftest.py)
	LAB_TESTS_REQUIRED=1 pytest -m lab --durations=30 tests/lab

test: deps venv lint syntax sanity unit lab-test ## the tests CI runs (within its 90 minutes): all but the molecule scenarios and the long lab tests
	@echo "make test: all green"

test-all: deps venv lint syntax sanity unit molecule lab-test-all ## every test: make test, every molecule scenario, the long lab tests
	@echo "make test-all: all green"
