# The two commands a newcomer needs (see README.md):
#   make demo   installs what is missing, builds, trains the Fashion-MNIST MLP
#               on 2 workers for one epoch and prints the test accuracy
#   make test   installs what is missing, builds, runs the whole suite
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)

.PHONY: all deps build demo test test-asan bench install clean

all: build

deps:
	@bash deploy/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# Programs, libraries, headers and hpu.pc under PREFIX (default /usr/local).
PREFIX ?= /usr/local
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

demo: build
	$(BUILD)/bin/hpulaunch --devices 2 --metrics $(BUILD)/demo-metrics.jsonl \
		$(BUILD)/lib/fmnist_mlp.so

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 900
	$(MAKE) test-asan

# The unit tests once more, built with AddressSanitizer and UBSan.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DHPU_SANITIZE=ON >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -LE 'integration|matrix' --timeout 900

# The peers' packages go in before the build, so that mpi-allreduce is built.
bench:
	@bash deploy/install-deps.sh --bench
	$(MAKE) build
	bash bench/demo_throughput.sh $(BUILD)
	bash bench/strategies.sh $(BUILD)
	bash bench/coll_compare.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
