# The two commands of the quick start:
#   make demo   installs what is missing, builds, runs the main job
#   make test   installs what is missing (PyTorch 2 into the project's Python
#               environment, scripts/python-env), builds, runs every test, then runs
#               them again in an AddressSanitizer + UBSan build, the threaded
#               ones in a ThreadSanitizer build, and where clang is installed
#               runs every libFuzzer target for a while
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Tests at a time: twice the cores, as many tests spend much of their time
# waiting (on peers, on a process group's timeout, on torchrun starting its
# ranks). On 2 cores the release tests took 364 s at -j2 and 323 s at -j4,
# with less CPU (617 s against 667 s: fewer waiters spinning for a core).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) * 2 )))
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
TSAN_BUILD ?= build-tsan
# warnings as errors: the project's CI sets WERROR=ON (.ci/run)
WERROR ?= OFF

.PHONY: all deps build build-asan demo test test-release test-asan test-tsan test-fuzz soak install \
        bench clean

all: build

deps:
	@sh scripts/install-deps

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DREPIPE_WERROR=$(WERROR) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory

build-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DREPIPE_SANITIZE=ON \
	  -DREPIPE_WERROR=$(WERROR) >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS) -- --no-print-directory

demo: build
	@sh scripts/demo $(BUILD)/repipe

# The ThreadSanitizer and libFuzzer builds and runs side by side: each ends
# in one long test that leaves a core idle (test_checkpoint, the CLI's fuzz
# target), and together they fill both: from clean builds on 2 cores, 154
# and 150 s one after the other, 134 and 150 s side by side. (Not make -j:
# cmake's own make -j would then reset make's jobserver, and say so.)
test: test-release test-asan
	@$(MAKE) --no-print-directory test-tsan & tsan=$$!; \
	  $(MAKE) --no-print-directory test-fuzz; fuzz=$$?; \
	  wait $$tsan && exit $$fuzz

# The release build's tests, the PyTorch ones included: their environment
# (PyTorch 2 from PyPI) is made once by scripts/python-env and reused.
# The fuzz drivers' inputs run in the sanitizer build, where a fault shows.
test-release: build
	@py=$$(sh scripts/python-env) && \
	  cmake -S . -B $(BUILD) -DREPIPE_TORCH_PYTHON="$$py" -DREPIPE_SKIP_UNSANITIZED_FUZZ=ON >/dev/null
	@cd $(BUILD) && ctest --output-on-failure -j $(TEST_JOBS)

test-asan: build-asan
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		ctest --output-on-failure -j $(TEST_JOBS)

# ThreadSanitizer over the tests whose threads share memory (ctest -L
# threads), where the compiler has it.
test-tsan: deps
	@if echo 'int main(void){return 0;}' | $${CC:-cc} -fsanitize=thread -x c - -o /dev/null \
	    2>/dev/null; then \
	  cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREPIPE_TSAN=ON \
	    -DREPIPE_WERROR=$(WERROR) >/dev/null && \
	  cmake --build $(TSAN_BUILD) -j $(JOBS) --target tsan_tests -- --no-print-directory && \
	  cd $(TSAN_BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -L threads; \
	else \
	  echo "test-tsan: the compiler has no ThreadSanitizer, so the threaded tests ran" \
	       "without it"; \
	fi

# libFuzzer needs clang: each target runs a fixed number of inputs from its
# seeds, with the library instrumented, under ASan and UBSan.
test-fuzz: deps
	@if command -v clang >/dev/null 2>&1; then \
	  CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DREPIPE_SANITIZE=ON \
	    -DREPIPE_FUZZ=ON -DREPIPE_WERROR=$(WERROR) >/dev/null && \
	  cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers -- --no-print-directory && \
	  cd $(FUZZ_BUILD) && ctest --output-on-failure -j $(TEST_JOBS) -L libfuzzer; \
	else \
	  echo "test-fuzz: clang is not installed, so the libFuzzer targets were not run" \
	       "(the deterministic fuzz drivers above were; apt-get install clang adds these)"; \
	fi

# The long runs `make test` keeps short: the fault campaign (kills while
# checkpointing, then resumes, bit for bit) for up to SOAK_SECONDS, as many
# rounds as fit. .ci/run calls it with the time left of its ten minutes.
SOAK_SECONDS ?= 300
soak: build
	@env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 bash tests/faults.sh \
	  $(BUILD)/repipe "$$(command -v mpirun)" 1000 $(SOAK_SECONDS)

# The command, the libraries, headers, repipe.pc, manual page and docs.
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

bench: build
	@sh scripts/bench $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
