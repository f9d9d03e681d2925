# gradwire: every target sets up the project virtualenv by itself when it is missing.
#
#   make test        the whole test suite (golden models, Amaranth simulator, cocotb on Verilator)
#   make sim         the end-to-end system simulation on Verilator (WORKERS=2..32, BOARDS=1..8,
#                    TREE=LxW: a tree of aggregators, L leaves of W workers, each board
#                    the Verilated network top; SIM_ARGS=...)
#   make bench       benchmarks (golden models and gateware cycle counts), ratios vs baselines
#   make verilog     Verilog of every top into build/verilog/
#   make accuracy    training with the compressed DDP hooks vs fp32 (4 gloo processes)
#   make bitstream   ECP5 bitstream (BOARD=ecpix5 | versa | colorlight, TOP=network |
#                    selftest | wire (default: network, selftest on the Colorlight, where the
#                    network top does not fit; wire: the NIC in the wire between the Versa's
#                    two Ethernet ports), ENGINE=all | nic | switch | none
#                    (selftest), ROUTER=router1 | router2, SEED=N (default the board's
#                    seed), FREQ=<engine MHz> (default the board's engine_mhz for the
#                    top); network and wire tops: MAC=...,
#                    IP=..., KEY=<hex> (default random, in the build's summary.json only,
#                    mode 0600)), into build/bitstream/
#   make program     load the latest bitstream (same BOARD/TOP/ENGINE) into the board's SRAM
#                    with openFPGALoader, FLASH=1 into its SPI flash, CABLE=<name> to override
#                    the board's cable
#   make bench-timing  Fmax of each engine alone (compressor, decompressor, aggregator, front
#                    end, SipHash) at 125 and 156.25 MHz: a measurement, about 50 minutes
#   make setup       just create/refresh the virtualenv
#   make clean       remove build outputs (keeps the virtualenv; `make distclean` removes it too)

PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.gradwire-installed
BOARD   ?= ecpix5
ENGINE  ?= all
TOP     ?=
PYTEST_ARGS ?=

export AMARANTH_USE_YOSYS := builtin

.PHONY: setup test bench bench-timing verilog sim bitstream program clean distclean accuracy

setup: $(STAMP)

# Reinstall whenever pyproject.toml changes. The editable install puts `gradwire` on the
# venv's PATH and makes host/, hdl/ and sim/ importable from anywhere.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bitstream,program,ddp,net]'
	@touch $@

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m host.bench

bench-timing: $(STAMP)
	$(PY) -m hdl.board.engine_timing all --freq 125,156.25

verilog: $(STAMP)
	$(PY) -m hdl.export build/verilog

# `make sim WORKERS=32` (2..32); `BOARDS=2`: the LHC jobs striped over two switches (one
# gateware instance each); `TREE=4x8`: a tree of aggregators (4 leaves of 8 workers and a
# root) alone, each board the Verilated network top (`SIM_ARGS="--backend golden"`: golden
# boards); SIM_ARGS passes anything else to `gradwire sim`.
sim: $(STAMP)
	$(PY) -m host.cli sim --backend verilator \
		$(if $(WORKERS),--workers $(WORKERS)) $(if $(BOARDS),--boards $(BOARDS)) \
		$(if $(TREE),--tree $(TREE)) $(SIM_ARGS)

accuracy: $(STAMP)
	$(PY) -m host.cli accuracy

bitstream: $(STAMP)
	@# the key goes through the environment (not echoed, not in the process list)
	@GRADWIRE_KEY='$(KEY)' $(PY) -m hdl.board.build --board $(BOARD) $(if $(TOP),--top $(TOP)) \
		--engine $(ENGINE) $(if $(ROUTER),--router $(ROUTER)) $(if $(SEED),--seed $(SEED)) \
		$(if $(FREQ),--freq $(FREQ)) \
		$(if $(MAC),--mac $(MAC)) $(if $(IP),--ip $(IP))

program: $(STAMP)
	@$(PY) -m hdl.board.program --board $(BOARD) $(if $(TOP),--top $(TOP)) --engine $(ENGINE) \
		$(if $(filter 1 yes true,$(FLASH)),--flash) $(if $(CABLE),--cable $(CABLE))

clean:
	rm -rf build .pytest_cache .hypothesis
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
