# Two commands on a fresh machine: `make demo` and `make test` (each installs what it needs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint proto native clean

$(STAMP): setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Train on MovieLens-100K, build the index, start the server, query it, stop it. Data: ml-100k
## under ../shared/data when that folder exists (a MITT_DATA of your own wins), else a download.
demo: $(STAMP)
	$(if $(wildcard ../shared/data),MITT_DATA="$${MITT_DATA:-$(abspath ../shared/data)}" )$(BIN)/python tools/demo.py $(DEMO_ARGS)

## Two pytest-xdist workers, a test module whole on one of them, long modules first (tests/conftest.py):
## on 2 cores the child processes' start-up and the servers' waits of one overlap the other's work.
WORKERS := -n 2 --dist loadfile --no-loadscope-reorder

## Lint, type-check, build the native engine and run the whole test suite (the 20 slowest listed).
test: $(STAMP) lint native
	$(BIN)/pytest -q $(WORKERS) --durations=20

## The edit loop: every test not marked slow or network, no lint (`make test` runs them all).
test-fast: $(STAMP)
	$(BIN)/pytest -q $(WORKERS) -m "not slow and not network"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## Regenerate the gRPC/protobuf code (retrieval/api/v1/) after editing proto/retrieval.proto. The -I
## mapping files the .proto under that package, so the generated imports name retrieval.api.v1.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iretrieval/api/v1=proto --python_out=. --pyi_out=. \
		--grpc_python_out=. proto/retrieval.proto

## The native engine (native/README.md): CMake builds retrieval/serving/_native*.so against Debian's
## gRPC C++; the Debian packages (as root) and nanobind are installed when missing. `pip install`
## never builds it. Keep NATIVE_PACKAGES equal to retrieval.serving.native.PACKAGES (a test checks).
NATIVE_PACKAGES := libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev cmake g++ pkg-config
native: $(STAMP)
	@missing="$$(for p in $(NATIVE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done)"; \
	if [ -n "$$missing" ]; then apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; fi
	$(BIN)/python -c 'import nanobind' 2>/dev/null || $(BIN)/pip install --quiet 'nanobind>=2.9,<4'
	cmake -S native -B native/build -DPython_EXECUTABLE=$(abspath $(BIN)/python)
	cmake --build native/build -j 2

clean:
	rm -rf $(VENV) runs *.egg-info .pytest_cache .mypy_cache .ruff_cache native/build retrieval/serving/_native*.so
