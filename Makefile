# gradwire: every target sets up the project virtualenv by itself when it is missing.
#
#   make test        the whole test suite (golden models, Amaranth simulator, cocotb on Verilator)
#   make sim         the end-to-end system simulation on Verilator (WORKERS=2..32, SIM_ARGS=...)
#   make bench       benchmarks (golden models and gateware cycle counts), ratios vs baselines
#   make verilog     Verilog of every top into build/verilog/
#   make accuracy    training with the compressed DDP hooks vs fp32 (4 gloo processes)
#   make bitstream   ECP5 bitstream (BOARD=ecpix5 | versa | colorlight, TOP=selftest |
#                    network, ENGINE=all | nic | switch | none (selftest), ROUTER=router1 |
#                    router2, SEED=2,1,3 (default the board's seeds), FREQ=<engine MHz>
#                    (default the board's engine_mhz); network top: MAC=...,
#                    IP=..., KEY=<hex> (default random, in the build's summary.json only,
#                    mode 0600)), into build/bitstream/
#   make setup       just create/refresh the virtualenv
#   make clean       remove build outputs (keeps the virtualenv; `make distclean` removes it too)

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.gradwire-installed
BOARD   ?= ecpix5
ENGINE  ?= all
TOP     ?= selftest
PYTEST_ARGS ?=

export AMARANTH_USE_YOSYS := builtin

.PHONY: setup test bench verilog sim bitstream clean distclean accuracy

setup: $(STAMP)

# Reinstall whenever pyproject.toml changes. The editable install puts `gradwire` on the
# venv's PATH and makes host/, hdl/ and sim/ importable from anywhere.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bitstream,ddp,net]'
	@touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m host.bench

verilog: $(STAMP)
	$(PY) -m hdl.export build/verilog

# `make sim WORKERS=32` (2..32); SIM_ARGS passes anything else to `gradwire sim`.
sim: $(STAMP)
	$(PY) -m host.cli sim --backend verilator $(if $(WORKERS),--workers $(WORKERS)) $(SIM_ARGS)

accuracy: $(STAMP)
	$(PY) -m host.cli accuracy

bitstream: $(STAMP)
	@# the key goes through the environment (not echoed, not in the process list)
	@GRADWIRE_KEY='$(KEY)' $(PY) -m hdl.board.build --board $(BOARD) --top $(TOP) \
		--engine $(ENGINE) $(if $(ROUTER),--router $(ROUTER)) $(if $(SEED),--seed $(SEED)) \
		$(if $(FREQ),--freq $(FREQ)) \
		$(if $(MAC),--mac $(MAC)) $(if $(IP),--ip $(IP))

clean:
	rm -rf build .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
