"""The LiteEth core: Ethernet/IPv4/UDP from the RGMII pins to typed UDP streams.

- :mod:`hdl.net.core.liteeth`: the board's network configuration (``constraints/network.toml``)
  and the generator that turns it into ``liteeth_core.v`` (cached in ``build/liteeth/``);
- :mod:`hdl.net.core.liteeth_migen`: the generator's Migen side, LiteEth's blocks with the
  changes the network contract needs (run in a subprocess);
- :mod:`hdl.net.core.eth_core`: :class:`LiteEthCore`, the generated core in Amaranth with
  typed streams, and the board's RGMII pins;
- (:mod:`hdl.wire.mac`: LiteEth's PHY and MAC on both ports of a two-port board, with raw
  frame streams, is the NIC in the wire's; ``hdl.net.core.wire_core`` keeps its old path);
- :mod:`hdl.net.core.cdc`: :class:`EthCrossing`, from the core's clock to the engines';
- :mod:`hdl.net.core.echo`: :class:`UdpEcho`, a bring-up echo behind the core (the Verilator
  top ``sim/eth_echo.py`` and the Yosys check :mod:`hdl.board.eth_synth`).
"""
