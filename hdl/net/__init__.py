"""The network: Ethernet/IPv4/UDP (LiteEth) and the front end between it and the engines.

:mod:`hdl.net.core.liteeth` generates the LiteEth core from ``constraints/network.toml``;
:class:`hdl.net.core.eth_core.LiteEthCore` instantiates it in Amaranth with typed UDP streams.
"""
