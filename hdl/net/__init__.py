"""The network: Ethernet/IPv4/UDP (LiteEth) and the front end between it and the engines.

RGMII pins -> :mod:`hdl.net.core` (the LiteEth core, its generator, the clock crossing) ->
:mod:`hdl.net.front_end` (buffers, checks, dispatch, the control service, replies) -> the
engines; :mod:`hdl.net.top` is :class:`NetworkTop`, all of it behind one RGMII port.
"""
