"""The network front end between the LiteEth core and the engines (``docs/network.md``).

- :mod:`hdl.net.front_end.front_end`: :class:`NetworkFrontEnd`, every block below wired;
- in: :mod:`~hdl.net.front_end.ingress` (datagrams buffered whole, the core's verdict),
  :class:`hdl.stream.width.Upsizer` (32-bit core words to 256-bit beats; the replies'
  :class:`~hdl.stream.width.Downsizer` sits in each output buffer),
  :mod:`~hdl.net.front_end.source_check` (job and worker against the sender),
  :mod:`~hdl.net.front_end.dispatch` (to a service by destination port);
- the control service: :mod:`~hdl.net.front_end.ctrl_service` (keyed register reads and
  writes), :mod:`~hdl.net.front_end.registers` (the network's registers, the router to the
  engines'), :mod:`~hdl.net.front_end.worker_table` (workers' addresses),
  :mod:`~hdl.net.front_end.job_workers` (the jobs' worker counts, as the switch has them);
- out: :mod:`~hdl.net.front_end.reply` (one request in flight, its reply's address),
  :mod:`~hdl.net.front_end.fanout` (a switch result to every worker of its job),
  :mod:`~hdl.net.front_end.egress` (replies buffered whole),
  :class:`hdl.stream.arbiter.PacketArbiter` (one of them to the core at a time);
- :mod:`~hdl.net.front_end.layouts`: the beats and tags they pass between them.
"""
