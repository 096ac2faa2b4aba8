# Strata: every target sets up what it needs on a fresh Debian machine first.
#   make demo   — the main job: real F3 volume -> hub -> spoke cache -> FUSE mount -> trainer
#   make test   — protocol freshness, lint, types, import contracts, the whole test suite
#   make bench  — Strata side by side with local disk, copy-first, rclone and httpdirfs
#                 over an emulated WAN (BENCH_ARGS="--size 2GiB" etc.; see BENCHMARKS.md),
#                 then prewarm link use, small-file misses, hit ratios simulated and
#                 through a real mount

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.strata-installed
TORCH  := torch==2.13.0
# Every package comes from a lock, pinned with hashes (regenerate: make lock): torch, the
# CPU build, from its own (from TORCH_WHEELS, a local wheel directory or the PyTorch CPU
# index), everything else from the dev lock
LOCK       := requirements-dev.lock
TORCH_LOCK := requirements-torch.lock
# TORCH_WHEELS: a wheel directory (this machine's /opt/wheels) or the URL of PyTorch's CPU
# package index, either holding the wheel whose hash requirements-torch.lock pins
TORCH_WHEELS ?= /opt/wheels
# FUSE passthrough: libfuse >= 3.17 and a patched pyfuse3, built under .build (native/)
NATIVE   := .build
LIBFUSE  := $(NATIVE)/libfuse/lib/pkgconfig/fuse3.pc
PT_WHEEL := $(NATIVE)/wheels/.built
READY    := $(VENV)/.strata-passthrough
# checkov, for the manifest checks, in its own venv (see its rule below)
CHECKOV_VENV  := .checkov-venv
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
# MLPerf Storage's DLIO, for python -m bench.dlio, in its own venv (see dlio-deps below)
DLIO_VENV  := .dlio-venv
DLIO_STAMP := $(DLIO_VENV)/.installed
DLIO_LOCK  := requirements-dlio.lock

.PHONY: checkov-lock dlio-lock dlio-deps dlio-system-deps demo test check pytest system-deps deploy-deps native-deps passthrough bench bench-deps \
	setup gen lock clean

demo: $(READY)
	$(BIN)/strata-demo

test: $(READY) check pytest

check: $(READY)
	$(BIN)/python -m protocol.gen --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite on every core: one test file a worker (a file's module fixtures are set up once),
# handed out in collection order, the longest files first (tests/conftest.py LONGEST_FILES;
# xdist's own order, most tests first, left the one-test minute-long files to the end);
# TEST_WORKERS=0 runs it in this process (pdb, -s). Tests that assert a wall-clock duration
# (marker timing) run after, alone, so the other workers' load cannot stretch them.
TEST_WORKERS ?= auto
pytest: $(READY) deploy-deps $(CHECKOV_STAMP)
	CHECKOV=$(CHECKOV_VENV)/bin/checkov $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile \
	  --no-loadscope-reorder -m "not timing"
	$(BIN)/pytest -m timing

# checkov (tests/deploy/test_checkov.py: the rendered manifests' hardening) in a venv of its
# own, from its own hashed lock: it brings about 100 packages the project does not use
# (regenerate: make checkov-lock)
$(CHECKOV_STAMP): requirements-checkov.lock
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --require-hashes --no-deps -r requirements-checkov.lock
	touch $@
checkov-lock:
	$(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install -q uv
	echo "checkov==3.3.30" > .lock-venv/checkov.in
	.lock-venv/bin/uv pip compile .lock-venv/checkov.in --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --custom-compile-command "make checkov-lock" \
	  -o requirements-checkov.lock
	rm -rf .lock-venv

# MLPerf Storage's DLIO (python -m bench.dlio; BENCHMARKS.md) in a venv of its own, from its
# own hashed lock, for the bench by hand only (not make test, not make bench: it is about
# 2.5 GB). dlio-benchmark is locked without its declared dependencies (NVIDIA DALI, full
# TensorFlow, torchvision, torchaudio); the lock holds instead what its PyTorch path imports,
# tensorflow-cpu (its profiler factory imports TensorFlow whatever the framework) and torch's
# CPU build as requirements-torch.lock pins it (from TORCH_WHEELS). mpirun and the MPI that
# mpi4py loads come from Debian (regenerate the lock: make dlio-lock)
dlio-deps: $(DLIO_STAMP)
$(DLIO_STAMP): $(DLIO_LOCK) $(TORCH_LOCK) | dlio-system-deps
	$(PYTHON) -m venv $(DLIO_VENV)
	$(DLIO_VENV)/bin/pip install -q --require-hashes --no-deps --find-links $(TORCH_WHEELS) \
	  -r $(DLIO_LOCK)
	$(DLIO_VENV)/bin/dlio_benchmark --help >/dev/null
	touch $@
dlio-system-deps:
	$(call apt-missing,mpirun:openmpi-bin mpicc:libopenmpi-dev)
DLIO_NEEDS := mpi4py hydra-core omegaconf h5py pandas psutil PyYAML Pillow pydftracer==1.0.2 \
	tensorflow-cpu==2.21.0
DLIO_COMPILE = --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--custom-compile-command "make dlio-lock"
dlio-lock:
	$(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install -q uv
	printf '%s\n' $(DLIO_NEEDS) "$$(sed -n 's/^\(torch==[^ ]*\).*/\1/p' $(TORCH_LOCK))" \
	  > .lock-venv/dlio.in
	echo "dlio-benchmark==2.0.0" > .lock-venv/dlio-nodeps.in
	.lock-venv/bin/uv pip compile .lock-venv/dlio.in $(DLIO_COMPILE) --find-links $(TORCH_WHEELS) \
	  -o $(DLIO_LOCK)
	.lock-venv/bin/uv pip compile .lock-venv/dlio-nodeps.in $(DLIO_COMPILE) --no-deps \
	  --no-header --no-annotate >> $(DLIO_LOCK)
	rm -rf .lock-venv

setup: $(READY)

bench: $(READY) bench-deps
	$(BIN)/python -m bench.run $(BENCH_ARGS)
	$(BIN)/python -m bench.prewarm_link
	$(BIN)/python -m bench.ingest
	$(BIN)/python -m bench.small_files
	$(BIN)/python -m bench.policy_sim
	$(BIN)/python -m bench.hints_mount
	$(BIN)/python -m bench.hub_ha
	$(BIN)/python -m bench.handover

# The tools the benchmark compares against, from Debian: fio, rclone, httpdirfs. Only
# `make bench` installs them; the smoke run in `make test` reports their scenarios as
# skipped where they are missing, so CI does not pay for them.
bench-deps:
	$(call apt-missing,fio:fio rclone:rclone httpdirfs:httpdirfs)

# $(call apt-missing,COMMAND:PACKAGE ...): apt-get install the packages whose command is
# missing (as root, or through sudo); nothing when every command is there.
define apt-missing
	@missing=; for pair in $(1); do \
	  command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  echo "installing Debian packages:$$missing"; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi
endef

# Debian packages the deploy checks run (tests/deploy): promtool, prometheus and
# alertmanager (amtool), and systemd-analyze; ss (iproute2: a listening socket's queue);
# PostgreSQL, the shared catalog's engine the hub replica tests start (tests/pgserver.py);
# with STRATA_DEPLOY_TESTS=1 (.ci/run) also what builds and runs the container image.
# Installed only when missing.
DEPLOY_TOOLS := promtool:prometheus prometheus:prometheus systemd-analyze:systemd \
	pg_ctlcluster:postgresql amtool:prometheus-alertmanager ss:iproute2
ifeq ($(STRATA_DEPLOY_TESTS),1)
DEPLOY_TOOLS += podman:podman buildah:buildah mmdebstrap:mmdebstrap runc:runc
endif
deploy-deps:
	$(call apt-missing,$(DEPLOY_TOOLS))

# Debian packages the mount needs: fusermount3 at run time, libfuse3-dev and
# pkg-config to build pyfuse3. Installed only when missing.
system-deps:
	@if ! command -v fusermount3 >/dev/null 2>&1 || ! pkg-config --exists fuse3 2>/dev/null; then \
	  SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  echo "installing Debian packages: fuse3 libfuse3-dev pkg-config"; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq fuse3 libfuse3-dev pkg-config; \
	fi

# What native/build.sh needs: meson and ninja for libfuse, dpkg-source (dpkg-dev) for
# `apt-get source`, patch and a C compiler. Installed only when missing.
NATIVE_TOOLS := meson:meson ninja:ninja-build dpkg-source:dpkg-dev patch:patch cc:gcc
native-deps:
	$(call apt-missing,$(NATIVE_TOOLS))

# FUSE passthrough (fusemount/passthrough.py, native/DESIGN.md): libfuse >= 3.17 from Debian
# trixie's fuse3 source package (apt checks signature and hashes) and pyfuse3 3.5.0 from its
# hash-checked sdist with native/pyfuse3-passthrough.patch, linked to it; the wheel replaces
# the lock's pyfuse3 in the venv. Rebuilt only when native/ changes; any failure stops make.
passthrough: $(READY)

$(LIBFUSE): native/build.sh | native-deps system-deps
	PYTHON=$(PYTHON) native/build.sh libfuse $(NATIVE)

$(PT_WHEEL): $(LIBFUSE) native/build.sh native/pyfuse3-passthrough.patch native/build-requirements.txt
	PYTHON=$(PYTHON) native/build.sh pyfuse3 $(NATIVE)
	touch $@

$(READY): $(STAMP) $(PT_WHEEL)
	$(BIN)/pip install -q --no-deps --force-reinstall $(NATIVE)/wheels/pyfuse3-*.whl
	$(BIN)/python -c "import pyfuse3; pyfuse3.passthrough_state()"
	$(BIN)/pip check
	touch $@

# torch first (the CPU build, from its own lock), then exactly the locked versions, hashes
# checked for both, then Strata itself without resolving anything again.
$(STAMP): pyproject.toml $(LOCK) $(TORCH_LOCK) | system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --require-hashes --no-deps --find-links $(TORCH_WHEELS) -r $(TORCH_LOCK) \
	  || { echo "torch's CPU build is not in TORCH_WHEELS=$(TORCH_WHEELS): set it to a wheel" \
	       "directory or PyTorch's CPU package index" >&2; exit 1; }
	$(BIN)/pip install -q --require-hashes --no-deps -r $(LOCK)
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip check
	touch $(STAMP)

# Re-resolve the locks after a change of pyproject.toml or TORCH (runtime:
# requirements.lock, for the runtime image; everything make installs: requirements-dev.lock
# and requirements-torch.lock, also the trainer image's). Needs network access; uv runs
# from a throwaway venv. torch is resolved as its CPU build from TORCH_WHEELS (a local
# wheel directory, or the URL of PyTorch's CPU package index) and left
# out of the uv locks: its dependencies are in the dev lock, and its hash is refreshed by
# fetching that one wheel (CPython 3.11, x86_64, as the locks are) and hashing it
# (sha256sum), so a new TORCH or a rebuilt wheel changes requirements-torch.lock.
UV_COMPILE = compile pyproject.toml --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --override requirements-overrides.txt \
	--find-links $(TORCH_WHEELS) --no-emit-package torch --custom-compile-command "make lock"
TORCH_FETCH = download -q --no-deps --no-index --find-links $(TORCH_WHEELS) --only-binary :all: \
	--python-version 3.11 --platform manylinux_2_28_x86_64 --dest .lock-venv/torch
lock:
	$(PYTHON) -m venv .lock-venv && .lock-venv/bin/pip install -q uv
	.lock-venv/bin/uv pip $(UV_COMPILE) -o requirements.lock
	.lock-venv/bin/uv pip $(UV_COMPILE) --extra train --extra dev -o requirements-dev.lock
	.lock-venv/bin/pip $(TORCH_FETCH) '$(TORCH)'
	set -e; wheel=$$(ls .lock-venv/torch/torch-*.whl); \
	  version=$$(basename "$$wheel" | cut -d- -f2); sum=$$(sha256sum "$$wheel" | cut -d' ' -f1); \
	  { sed -n '/^#/p' $(TORCH_LOCK); \
	    printf 'torch==%s \\\n    --hash=sha256:%s\n' "$$version" "$$sum"; } > $(TORCH_LOCK).new
	mv $(TORCH_LOCK).new $(TORCH_LOCK)
	rm -rf .lock-venv

gen: $(STAMP)
	$(BIN)/python -m protocol.gen

clean:
	rm -rf $(VENV) $(NATIVE) .mypy_cache .pytest_cache .ruff_cache build dist *.egg-info
