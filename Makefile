# Sluice — the two commands a newcomer needs:
#   make run    a local cluster on embedded defaults (installs deps, builds)
#   make test   every test (installs deps, builds, runs ctest)
# Other targets: check (a contributor's loop), deps, deps-build, build, bench,
# test-asan, test-tsan, test-fuzz (or fuzz), asan, image-deps, image,
# test-image, screenshot, clean.

SHELL := /bin/bash
BUILD_DIR ?= build
JOBS ?= $(shell nproc)

# The Debian bookworm packages, in three groups.
# BUILD: compile the servers, sluicectl and the Python package (enough for
# `make run`: the demo is C++ end to end); the etcd sources are the etcd
# client's protos, GoogleTest and libnetfilter-queue (a test tool) are found
# at configure time.
BUILD_PACKAGES := \
  build-essential cmake ninja-build pkg-config git ca-certificates openssl curl \
  protobuf-compiler libprotobuf-dev protobuf-compiler-grpc libgrpc++-dev grpc-proto \
  libabsl-dev libarchive-dev prometheus-cpp-dev libssl-dev libcurl4-openssl-dev nlohmann-json3-dev \
  zlib1g-dev libjemalloc-dev libturbojpeg0-dev libjpeg62-turbo-dev libswscale-dev libyuv-dev \
  librandom123-dev libimath-dev libpng-dev libgtest-dev libgmock-dev libnetfilter-queue-dev \
  golang-etcd-server-dev golang-github-gogo-protobuf-dev golang-github-grpc-ecosystem-grpc-gateway-dev \
  python3 python3-dev pybind11-dev python3-grpcio python3-protobuf python3-numpy
# TEST: what `make check` and `make test` add: the sanitizer and lint
# toolchain, PyTorch, the real etcd, Prometheus, nginx, SLURM and Open MPI
# the suites run against.
TEST_PACKAGES := \
  clang clang-format clang-tidy libclang-rt-14-dev nodejs systemd nginx-light \
  python3-pytest python3-torch python3-torchvision \
  etcd-server etcd-client \
  prometheus python3-matplotlib python3-yaml python3-pil python3-pip python3-setuptools python3-wheel \
  slurm-wlm munge openmpi-bin python3-mpi4py \
  iproute2 nftables iptables iperf3
DEB_PACKAGES := $(BUILD_PACKAGES) $(TEST_PACKAGES)

SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: deps deps-build build check test test-asan test-tsan test-fuzz fuzz run bench asan clean \
  screenshot image-deps image test-image

# Seconds of libFuzzer in `make test` (CI); `make fuzz FUZZ_SECONDS=600` for more.
FUZZ_SECONDS ?= 60
# The same for the coordinator's request handling (the two run side by side).
COORDINATOR_FUZZ_SECONDS ?= 60

# Idempotent and fast when everything is present: apt runs only for what is
# missing.
# $(call APT_INSTALL_MISSING,TARGET,PACKAGES): installs those of PACKAGES
# that dpkg does not have (apt runs only then).
define APT_INSTALL_MISSING
@missing=$$(for p in $(2); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; \
	  done); \
	if [ -n "$$missing" ]; then \
	  echo "make $(1): installing:" $$missing; \
	  $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends $$missing; \
	else echo "make $(1): all $(words $(2)) packages present"; fi
endef

# What `make run` needs.
deps-build:
	$(call APT_INSTALL_MISSING,deps-build,$(BUILD_PACKAGES))

deps: deps-build
	$(call APT_INSTALL_MISSING,deps,$(TEST_PACKAGES))
	@# npm ships inside some nodejs builds and as Debian's own package in others.
	@command -v npm > /dev/null || DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q npm
	@command -v kubectl > /dev/null || echo "make deps: kubectl not found; the k8s tests need it (not a bookworm package: see README, Tests)"

$(BUILD_DIR)/build.ninja:
	cmake --preset release -B $(BUILD_DIR) -G Ninja

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600
	@$(MAKE) --no-print-directory test-asan test-tsan test-fuzz

# The code that faces corrupt shards (tar reader, index, decoders, framing)
# under AddressSanitizer + UBSan, built in the fuzz tree (clang), whose
# objects the fuzzers share: one sanitizer build of the data server's code,
# not two. `make asan` runs every test in a GCC ASan tree instead.
test-asan: deps
	@test -f build-fuzz/build.ninja || cmake --preset fuzz -G Ninja >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target dataserver_format_tests
	./build-fuzz/bin/dataserver_format_tests --gtest_brief=1

# The concurrent components (lease table, outbox, once/barrier, shard cache,
# the C++ Reader) under ThreadSanitizer. Debian's Abseil is rebuilt from its
# source package with -fsanitize=thread first (a minute, once), so TSan sees
# every absl::Mutex; the Reader's tests start the release build's servers.
TSAN_OPTIONS_RUN := halt_on_error=1 suppressions=$(CURDIR)/tests/tsan/suppressions.txt
test-tsan: build
	@JOBS=$(JOBS) sh tests/tsan/build_abseil.sh $(CURDIR)/build-tsan/abseil
	@test -f build-tsan/build.ninja || cmake --preset tsan -G Ninja >/dev/null
	cmake --build build-tsan -j $(JOBS) --target tsan_tests
	TSAN_OPTIONS="$(TSAN_OPTIONS_RUN)" ./build-tsan/bin/tsan_tests --gtest_brief=1

# Short libFuzzer runs (clang) over the tar reader + decoders, and over the
# coordinator's request handling: side by side, one per core.
test-fuzz fuzz: deps
	@test -f build-fuzz/build.ninja || cmake --preset fuzz -G Ninja >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target tar_reader_fuzzer coordinator_fuzzer
	@/usr/bin/python3 tests/fuzz/make_seed_corpus.py build-fuzz/corpus
	@/usr/bin/python3 tests/fuzz/make_coordinator_seeds.py build-fuzz/coordinator-corpus
	@./build-fuzz/bin/tar_reader_fuzzer -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 \
	  -print_final_stats=1 build-fuzz/corpus > build-fuzz/fuzz.log 2>&1 & tar=$$!; \
	  ./build-fuzz/bin/coordinator_fuzzer -max_total_time=$(COORDINATOR_FUZZ_SECONDS) \
	  -rss_limit_mb=2048 -print_final_stats=1 build-fuzz/coordinator-corpus \
	  > build-fuzz/coordinator-fuzz.log 2>&1; coordinator_rc=$$?; \
	  wait $$tar; tar_rc=$$?; \
	  tail -n 12 build-fuzz/fuzz.log; tail -n 12 build-fuzz/coordinator-fuzz.log; \
	  echo "tar_reader_fuzzer: exit $$tar_rc; coordinator_fuzzer: exit $$coordinator_rc"; \
	  test $$tar_rc -eq 0 -a $$coordinator_rc -eq 0

# The demo: a synthetic dataset, a coordinator and 2 data servers, 4 trainer
# ranks for 2 epochs with a trainer and a data server SIGKILLed mid-epoch,
# then the verification (exit 0 only if it holds). `sluicectl up` runs a
# cluster in the foreground instead. Installs and builds only what it needs
# (the servers, sluicectl and the Python package with its extension), not
# the tests.
run: deps-build $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS) --target sluicectl sluice-coordinator sluice-dataserver \
	  sluice_core_py
	./$(BUILD_DIR)/bin/sluicectl demo --dir=.sluice

# A contributor's loop before each commit (a few minutes from a warm
# build): the unit tests, the in-process and single-host integration tests
# (real servers on 127.0.0.1) and formatting.
# `make test` runs everything else too (chaos, Python and PyTorch suites,
# launchers, monitoring, deploy, clang-tidy, sanitizers, fuzzing).
check: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 300 -L 'unit|integration' \
	  -LE chaos
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) \
	  -R '^(style\.clang_format|style\.include_boundaries|style\.doc_links)$$'

# Every benchmark; each prints its figure next to a baseline measured in the
# same run and ends with one line of JSON. Not part of `make test`.
# Each benchmark's closing JSON line is also collected, with the date and
# commit, in $(BENCH_RESULTS) (one JSON object per line).
BENCH_RESULTS ?= $(BUILD_DIR)/bench-results.jsonl
BENCH = set -o pipefail; $(1) | tee /dev/stderr | tail -n 1 | \
  sed "s/^{/{\"date\":\"$$(date -u +%FT%TZ)\",\"commit\":\"$$(git rev-parse --short HEAD 2>/dev/null)\",/" \
  >> $(BENCH_RESULTS)

bench: build
	@rm -f $(BENCH_RESULTS)
	@$(call BENCH,./$(BUILD_DIR)/bin/dataserver_bench --mode=raw)
	@$(call BENCH,./$(BUILD_DIR)/bin/dataserver_bench --mode=decoded)
	@$(call BENCH,./$(BUILD_DIR)/bin/dataserver_bench --mode=decoded --resize=224)
	@$(call BENCH,./$(BUILD_DIR)/bin/dataserver_bench --mode=shuffle --shards=32)
	@$(call BENCH,./$(BUILD_DIR)/bin/transform_bench)
	@$(call BENCH,./$(BUILD_DIR)/bin/remote_bench)
	@$(call BENCH,./$(BUILD_DIR)/bin/reader_bench)
	@$(call BENCH,./$(BUILD_DIR)/bin/reader_bench --decode)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=leases)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=leases --progress=false)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=leases --shuffle_window=32)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=leases --sources=10)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=plan --sources=10)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=compaction --shards=200000)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=etcd)
	@$(call BENCH,./$(BUILD_DIR)/bin/coordinator_bench --mode=open)
	@$(call BENCH,/usr/bin/python3 tests/bench/python_reader_bench.py $(BUILD_DIR)/bin)
	@$(call BENCH,/usr/bin/python3 tests/bench/pipeline_bench.py $(BUILD_DIR)/bin)
	@$(call BENCH,/usr/bin/python3 tests/bench/shared_decode_bench.py $(BUILD_DIR)/bin)
	@$(call BENCH,/usr/bin/python3 tests/bench/fair_share_bench.py $(BUILD_DIR)/bin)
	@$(call BENCH,/usr/bin/python3 tests/bench/multihost_bench.py $(BUILD_DIR)/bin)
	@$(call BENCH,/usr/bin/python3 tests/bench/autoscale_bench.py $(BUILD_DIR)/bin)
	@echo "make bench: figures collected in $(BENCH_RESULTS)"

# dashboards/sluice-overview.png: the monitoring test with three minutes of
# workload history, its main panels rendered from the live Prometheus.
screenshot: build
	cd $(BUILD_DIR) && SLUICE_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin \
	  SLUICE_SCREENSHOT=$(CURDIR)/dashboards/sluice-overview.png SLUICE_MONITORING_HISTORY_S=180 \
	  /usr/bin/python3 -m pytest -q -p no:cacheprovider $(CURDIR)/tests/monitoring

# The container image, built with podman from k8s/image/Dockerfile (the
# file `docker build` uses); base images made with mmdebstrap when missing.
IMAGE ?= sluice:dev
IMAGE_PACKAGES := podman mmdebstrap runc
image-deps:
	$(call APT_INSTALL_MISSING,image-deps,$(IMAGE_PACKAGES))

image: image-deps
	$(SUDO) bash k8s/image/build.sh $(IMAGE)

# The image run as the manifests run it (tests/deploy/test_image.py), built
# from this tree's release binaries (build.sh --prebuilt: the runtime stage
# only; deploy.image_runtime_libraries keeps the in-image build's packages
# in step). Not in `make test` (podman as root); .ci/run runs it after.
test-image: build image-deps
	$(SUDO) env BUILD_DIR=$(BUILD_DIR) bash k8s/image/build.sh --prebuilt $(IMAGE)
	cd $(BUILD_DIR) && $(SUDO) env SLUICE_IMAGE=$(IMAGE) SLUICE_BIN_DIR=$(CURDIR)/$(BUILD_DIR)/bin \
	  PYTHONPATH=$(CURDIR)/$(BUILD_DIR)/python \
	  /usr/bin/python3 $(CURDIR)/tests/python/run_pytest.py -q -p no:cacheprovider \
	  $(CURDIR)/tests/deploy/test_image.py

asan: deps
	cmake --preset asan -G Ninja && cmake --build build-asan -j $(JOBS) && \
	  cd build-asan && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz
