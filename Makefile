# Two commands on a fresh machine (Python >= 3.10 and make):
#   make demo   normalize the shipped GPU-saved DDP checkpoint and load it on CPU
#   make test   run the test suite
#   make release  build the sdist and wheel, install the wheel the way a user would, use it
# torch is pinned to the 2.13.0 CPU build for the demo and tests. Where pip's
# default index would hand out a CUDA build, point it at the CPU wheels:
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu

VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_INDEX ?=
OUT := build/demo

SIZE ?= 2
MINUTES ?= 30

.PHONY: demo test release lint bench fuzz clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# the tests also read files DeepSpeed writes: an sdist, built against the torch above;
# GPTQModel's pure-torch dequantizer is the GPTQ oracle: 7.6.0 is the last that takes torch
# 2.13, and it pins numpy==2.2.6 and pulls datasets and maturin, none of which its
# dequantizer needs, so it goes in without its dependencies, with the few its import needs
$(VENV)/.test-installed: $(VENV)/.installed
	$(PY) -m pip install -q setuptools wheel
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation deepspeed
	$(PY) -m pip install -q --no-deps gptqmodel==7.6.0 pypcre==0.6.4 logbar==0.4.15 \
		device-smi==0.5.7 tokenicer==0.0.14 defuser==0.0.28 threadpoolctl==3.8.0
	touch $@

demo: $(VENV)/.installed
	mkdir -p $(OUT)
	$(VENV)/bin/ckptport normalize fixtures/ddp_cuda3.pth $(OUT)/model.pth --overwrite -q
	$(VENV)/bin/ckptport normalize fixtures/ddp_cuda3.pth $(OUT)/model.safetensors --overwrite -q
	$(PY) -m examples.load_clean fixtures/ddp_cuda3.pth $(OUT)/model.pth $(OUT)/model.safetensors

# bytecode is written even where the environment turns it off (PYTHONDONTWRITEBYTECODE): the
# tests start about a hundred interpreters on this checkout, and each would compile it anew
test: $(VENV)/.test-installed
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q

# the release as a user gets it: sdist and wheel built, the wheel installed into a fresh
# venv (torch first), the README's first walk, the pre-commit hook, docs/ci.md's step
release: $(VENV)/.installed
	TORCH_INDEX=$(TORCH_INDEX) $(PY) -m pytest -q -m release tests/test_release.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check ckptport tests fixtures bench examples
	$(VENV)/bin/mypy

bench: $(VENV)/.installed
	$(PY) bench/run.py --size-gb $(SIZE)

fuzz: $(VENV)/.installed
	$(PY) bench/fuzz.py --minutes $(MINUTES) --out bench/out/crashes

clean:
	rm -rf build bench/out
