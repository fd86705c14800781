# dflash-mlx build. `make` installs dependencies (first time) and builds everything;
# `make test` runs the test suite; `make demo` runs the whole pipeline offline on a tiny
# generated model pair. MLX_BACKEND=cpu|cuda|metal picks the MLX wheel (default: metal on
# macOS, cpu elsewhere).
SHELL := /bin/bash
ROOT := $(CURDIR)
GO ?= go
BIN := $(ROOT)/bin/dflash-mlx
export CGO_ENABLED := 1
# On Linux the binaries export our NVRTC entry points (mlxc/csrc/nvrtc_cache.cpp), so that
# libmlx's calls to NVRTC reach the compiled-kernel cache first.
# (Linkers before binutils 2.35 lack the option: there the cache stays unused, and
# `dflash-mlx doctor` says so.)
ifeq ($(shell uname -s),Linux)
ifneq ($(shell $${CC:-cc} -Wl,--help 2>/dev/null | grep -c -- --export-dynamic-symbol),0)
EXPORT_NVRTC := -Wl,--export-dynamic-symbol=nvrtc*
endif
endif
export CGO_LDFLAGS := -L$(ROOT)/third_party/tokenizers -L$(ROOT)/third_party/llguidance $(EXPORT_NVRTC) $(CGO_LDFLAGS)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PREFIX ?= /usr/local
# Where binaries look for libmlx (RUNPATH on Linux, LC_RPATH on macOS). bin/dflash-mlx looks
# in this checkout first (mlxc/rpath_checkout.go), then beside itself as in a checkout, so a
# moved checkout still runs. The installed binary is built with the dflash_installed tag and
# looks only beside itself, so it never loads a checkout's libmlx. scripts/test_install.sh
# checks both.
ifeq ($(shell uname -s),Darwin)
ORIGIN := @loader_path
else
ORIGIN := \$$ORIGIN
endif
VERSION_LDFLAGS := -X github.com/dflash-mlx/dflash-mlx/cli.Version=$(VERSION)
GOFLAGS_BUILD := -ldflags "$(VERSION_LDFLAGS) -extldflags '-Wl,-rpath,$(ORIGIN)/../third_party/mlx/lib'"
GOFLAGS_INSTALL := -tags dflash_installed -ldflags "$(VERSION_LDFLAGS) -extldflags '-Wl,-rpath,$(ORIGIN)/../lib/dflash-mlx/mlx/lib'"

.PHONY: all deps lib build test test-short test-install demo bench bench-ref install lint lint-workflows check-kernels clean distclean

all: build

deps:
	@bash scripts/deps_mlx.sh
	@bash scripts/deps_tokenizers.sh
	@bash scripts/deps_llguidance.sh
	@bash scripts/deps_testdata.sh
	@bash scripts/deps_pyref.sh
	@bash scripts/deps_node.sh

# The MLX wheel must be there before anything is compiled; the other deps are needed by
# the tokenizer and grammar packages (link) and the tests.
third_party/mlx/.installed:
	@bash scripts/deps_mlx.sh
third_party/tokenizers/libtokenizers.a:
	@bash scripts/deps_tokenizers.sh
third_party/llguidance/libllguidance.a:
	@bash scripts/deps_llguidance.sh

lib: third_party/mlx/.installed
	@mkdir -p build
	@if [ ! -f build/build.ninja ] && [ ! -f build/Makefile ]; then \
	  if command -v ninja >/dev/null; then cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null; \
	  else cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null; fi; fi
	@cmake --build build --parallel

build: lib third_party/tokenizers/libtokenizers.a third_party/llguidance/libllguidance.a
	$(GO) build $(GOFLAGS_BUILD) -o $(BIN) ./cmd/dflash-mlx

test: deps build
	DFLASH_REQUIRE_REFERENCE=$${DFLASH_REQUIRE_REFERENCE:-$${CI:+1}} $(GO) test -count=1 -timeout 45m ./...
	@bash scripts/test_install.sh

# Installs into a temporary PREFIX and checks which libmlx the installed and the checkout's
# binaries load, with the checkout's or the installed libraries out of the way.
test-install: build
	@bash scripts/test_install.sh

test-short: build
	$(GO) test -count=1 -short ./...

demo: build third_party/testdata/qwen3/STAMP
	$(BIN) demo

third_party/testdata/qwen3/STAMP:
	@bash scripts/deps_testdata.sh

bench: build
	$(BIN) bench --demo

bench-ref: deps build
	bash bench/bench_ref.sh

# The installed binary finds libmlx under $(PREFIX)/lib/dflash-mlx (relative to itself, and
# only there), laid out as in the wheel so libmlx's own RPATH finds its vendored BLAS; the
# checkout is not needed, and not used while it exists.
install: lib third_party/tokenizers/libtokenizers.a third_party/llguidance/libllguidance.a
	install -d $(PREFIX)/bin $(PREFIX)/lib/dflash-mlx/mlx
	$(GO) build $(GOFLAGS_INSTALL) -o $(PREFIX)/bin/dflash-mlx ./cmd/dflash-mlx
	rm -rf $(PREFIX)/lib/dflash-mlx/mlx/lib && cp -a third_party/mlx/lib $(PREFIX)/lib/dflash-mlx/mlx/lib
	@for d in third_party/mlx_*.libs; do [ -d "$$d" ] && cp -a "$$d" $(PREFIX)/lib/dflash-mlx/; done; true

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...

# Compiles our custom CUDA kernels with NVRTC (from PyPI) on a machine without a GPU.
check-kernels: deps build
	@bash scripts/deps_nvrtc.sh
	DFLASH_NVRTC_DIR=$(ROOT)/third_party/nvrtc $(GO) test -count=1 -run TestCUDAKernelSourcesCompile -v ./model

ACTIONLINT_VERSION := v1.7.7
lint-workflows:
	@GOBIN=$(ROOT)/build/tools $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)
	$(ROOT)/build/tools/actionlint .github/workflows/*.yml

clean:
	rm -rf build bin

distclean: clean
	rm -rf third_party/mlx third_party/mlx_*.libs third_party/tokenizers third_party/llguidance third_party/testdata third_party/pyref
