"""``gradwire board``: a board on the network, or a virtual one on 127.0.0.1.

::

    gradwire board serve [--key HEX] [--port-base 47570] [--fault-rate R --fault-seed S]
    gradwire board serve --backend verilator --tap NAME
    gradwire board status [--json]
    gradwire board wire-status [--json]
    gradwire board ping [-c COUNT]
    gradwire board configure-job JOB --workers N --slots BASE:COUNT [--worker IP:PORT ...]
                                 [--group ADDR:PORT]
                                 [--upstream HOST:PORT --upstream-job J --upstream-worker W]
                                 [--auth --epoch E]
    gradwire board job-key JOB --epoch E
    gradwire board compress IN.npy OUT.gwz [-k K]
    gradwire board decompress IN.gwz OUT.npy

``serve`` runs a virtual board (``host.board.VirtualBoard``: the golden board behind real
UDP sockets) until SIGINT or SIGTERM; it prints a line with ``ready`` once it answers. With
``--tap NAME`` it puts the Verilated network top on a Linux TAP interface instead
(:mod:`host.board.tap`), for the host's own network stack at the board's address. The
other commands talk to a board through ``host.driver.udp.UdpTransport``: its address, port
base, control key and MTU come from the options or from the environment variables
``GRADWIRE_BOARD`` (``HOST`` or ``HOST:PORT_BASE``), ``GRADWIRE_PORT_BASE``,
``GRADWIRE_KEY`` (hex digits) and ``GRADWIRE_MTU``. Data commands (compress, decompress)
need no key; control ones (status, wire-status, ping, configure-job) do. ``wire-status`` is
for a board built with the wire top (the NIC in the wire, ``network.md`` section 6), from
the host behind its port 0. ``configure-job --group ADDR:PORT`` gives the job a result group
(``network.md`` section 3: each multicast result leaves the board once, to that IPv4
multicast address and UDP port, for the workers that joined it); ``--group 0`` or no
``--group`` configures the job without one. ``configure-job --upstream HOST:PORT
--upstream-job J --upstream-worker W`` makes the job a leaf of a parent aggregator's job J
(``aggregator-protocol.md`` section 4: a tree of aggregators), the parent being the board at
HOST whose switch port is PORT (its port base + 2), this board's job its worker W; its
completed slots go there and its workers get the parent's results. ``--upstream 0`` or no
``--upstream`` configures the job without one. ``status`` shows each job's upstream.
``configure-job --auth --epoch E`` gives the job authentication (``network.md`` section 7,
a board with a 32-digit key): its datagrams and results carry tags under the job key,
derived from the control key, the job and ``E``; it prints nothing secret. ``job-key JOB
--epoch E`` prints that job key (32 hex digits) for a worker that is not a Python process;
it needs the key, not the board.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import signal
import time


from contract.counters import (AGG_COUNTERS, AUTH_COUNTERS, NET_COUNTERS, NIC_RX_COUNTERS,
                               NIC_TX_COUNTERS, WIRE_COUNTERS)
from contract.header import Header, PacketType
from contract.network import (MAX_JOBS_IN_TABLE, MAX_WORKERS_IN_TABLE, NET_REGISTERS,
                              NIC_REGISTERS, PORT_BASE, SERVICE_OFFSETS, SWITCH_REGISTERS, Service,
                              group_active, network_address, service_ports)
from contract.packet import Packet
from contract.registers import (AUTH_FEATURE_CONTROL, AUTH_FEATURE_JOBS, AUTH_FEATURE_UPSTREAM,
                                AUTH_REGISTERS, WIRE_REGISTERS, JobStatus, decode_switch_params)

from ..cli import CliError
from ..driver.transport import TransportError
from ..golden.ctrl_auth import is_authenticated

__all__ = ["add_arguments", "run"]

_SERVICE_NAMES = {Service.NIC_TX: "NIC transmit path", Service.NIC_RX: "NIC receive path",
                  Service.SWITCH: "switch", Service.CTRL: "control"}
_JOB_REGS = SWITCH_REGISTERS["job"]
_TABLE = NET_REGISTERS["worker"]
_GROUPS = NET_REGISTERS["group"]
_UPSTREAMS = SWITCH_REGISTERS["upstream"]
_AUTH_COUNTERS = AUTH_REGISTERS["auth_counter"]
_JOB_AUTH = AUTH_REGISTERS["job_auth"]
#: ``auth_features``' bits as ``status`` names them
_AUTH_FEATURE_NAMES = ((AUTH_FEATURE_CONTROL, "control"), (AUTH_FEATURE_JOBS, "jobs"),
                       (AUTH_FEATURE_UPSTREAM, "upstream keys"))
#: values per progress step of compress / decompress


# -- arguments ---------------------------------------------------------------------------

def _probability(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _positive(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _slots(text):
    base, sep, count = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(base), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"give slots as BASE:COUNT (e.g. 0:64), not "
                                         f"{text!r}") from None


def _address(text):
    ip, sep, port = text.rpartition(":")
    try:
        import ipaddress
        ipaddress.IPv4Address(ip)
        port = int(port)
        if not sep or not 1 <= port <= 0xFFFF:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"give a worker as IPV4:PORT (e.g. "
                                         f"127.0.0.1:40000), not {text!r}") from None
    return ip, port


def _connection_arguments(p):
    g = p.add_argument_group("board", "where the board is (options win over the environment)")
    g.add_argument("--board", metavar="HOST[:PORT_BASE]",
                   help="the board's IPv4 address (env GRADWIRE_BOARD; default 127.0.0.1)")
    g.add_argument("--port-base", type=int, metavar="PORT",
                   help=f"its first service port (env GRADWIRE_PORT_BASE; default {PORT_BASE})")
    g.add_argument("--key", metavar="HEX", help="its control key (env GRADWIRE_KEY)")
    g.add_argument("--mtu", type=int, help="IP MTU of the path (env GRADWIRE_MTU; default "
                                           "1500, 9000 for jumbo frames)")
    g.add_argument("--timeout", type=_positive, default=3.0, metavar="SECONDS",
                   help="give up on a request the board leaves unanswered after about this "
                        "long (default 3)")
    g.add_argument("--retries", type=int, help="resends of one request (default: as many as "
                                               "--timeout allows)")


def add_arguments(p):
    sub = p.add_subparsers(dest="board_command", metavar="SUBCOMMAND", required=True)
    from host.board import BOARD_BACKENDS

    s = sub.add_parser("serve", help="serve a virtual board on 127.0.0.1 until SIGINT/SIGTERM",
                       description="Serve a virtual board (a board backend behind real UDP "
                                   "sockets on 127.0.0.1) until SIGINT or SIGTERM.")
    s.add_argument("--key", metavar="HEX",
                   help="control key (default: env GRADWIRE_KEY, else a random one, printed)")
    s.add_argument("--port-base", type=int, metavar="PORT",
                   help=f"first of the four ports (default: env GRADWIRE_PORT_BASE, else "
                        f"{PORT_BASE})")
    s.add_argument("--fault-rate", type=_probability, default=0.0, metavar="R",
                   help="probability of loss, duplication and delay of each datagram on the "
                        "board's wire (default 0)")
    s.add_argument("--fault-seed", type=int, default=0, metavar="S",
                   help="seed of the wire faults (default 0)")
    s.add_argument("--backend", choices=sorted(BOARD_BACKENDS), default="golden",
                   help="what is behind the sockets (default golden: the golden board)")
    s.add_argument("--tap", metavar="NAME",
                   help="put the board on the Linux TAP interface NAME instead of sockets on "
                        "127.0.0.1, for the host's own network stack (--backend verilator: "
                        "the Verilated network top; a bring-up rehearsal without a board)")
    s.add_argument("--without", action="append", default=[], metavar="SERVICE",
                   choices=[svc.value for svc in Service],
                   help="build the board without this service (repeatable)")
    for name, default, help_text in (
            ("slots", 64, "aggregator slots"), ("lanes", 64, "lanes P per slot"),
            ("jobs", 4, "jobs"), ("max-workers", 32, "workers per job"),
            ("max-count", 2048, "largest NIC packet (values)")):
        s.add_argument(f"--{name}", type=int, default=default,
                       help=f"golden board: {help_text} (default {default})")
    s.set_defaults(board_run=_serve)

    st = sub.add_parser("status", help="addresses, link, services, engines, every counter",
                        description="Read the board's identity, its engines' parameters, its "
                                    "jobs and worker table, and every counter over the network.")
    _connection_arguments(st)
    st.add_argument("--json", action="store_true", help="print JSON")
    st.set_defaults(board_run=_status)

    ws = sub.add_parser("wire-status", help="a NIC in the wire: both ports' and the NIC "
                                            "engines' counters",
                        description="Read every counter of a board built with the wire top "
                                    "(make bitstream BOARD=versa TOP=wire) over the network, "
                                    "from its host-side port: each port's frames and drops, "
                                    "the NIC engines' packets.")
    _connection_arguments(ws)
    ws.add_argument("--json", action="store_true", help="print JSON")
    ws.set_defaults(board_run=_wire_status)

    pg = sub.add_parser("ping", help="control read round trips and their time",
                        description="Time control read round trips (each one datagram, no "
                                    "resend).")
    _connection_arguments(pg)
    pg.add_argument("-c", "--count", type=int, default=4, help="round trips (default 4)")
    pg.add_argument("-i", "--interval", type=float, default=0.2,
                    help="seconds between them (default 0.2)")
    pg.set_defaults(board_run=_ping)

    cj = sub.add_parser("configure-job", help="configure a job: workers, slots, addresses",
                        description="Configure a job of the board's switch: its worker count, "
                                    "its slot range, and where each worker receives results.")
    _connection_arguments(cj)
    cj.add_argument("job", type=int, help="job number")
    cj.add_argument("--workers", type=int, help="workers of the job (1..32)")
    cj.add_argument("--slots", type=_slots, metavar="BASE:COUNT",
                    help="the job's slots (default: the whole pool)")
    cj.add_argument("--worker", type=_address, action="append", default=[], metavar="IP:PORT",
                    help="worker w's result address, in worker order (give all or none)")
    cj.add_argument("--group", metavar="ADDR:PORT",
                    help="the job's result group: each multicast result leaves the board once, "
                         "to this IPv4 multicast address and UDP port (use 239.0.0.0/8; the "
                         "workers join it), instead of once per worker; 0 or absent: no "
                         "group")
    cj.add_argument("--upstream", metavar="HOST:PORT",
                    help="make the job a leaf of a parent aggregator (a tree of aggregators): "
                         "the parent board's address and its switch port (its port base + 2, "
                         "47572 by default); needs --upstream-job and --upstream-worker; 0 or "
                         "absent: no upstream")
    cj.add_argument("--upstream-job", type=int, metavar="J",
                    help="with --upstream: the parent's job number")
    cj.add_argument("--upstream-worker", type=int, metavar="W",
                    help="with --upstream: this job's worker number in the parent's job")
    cj.add_argument("--auth", action="store_true",
                    help="authenticate the job (section 7; a board with a 32-digit key): "
                         "tags under the job key on its datagrams and results; needs --epoch")
    cj.add_argument("--epoch", type=_epoch, metavar="E",
                    help="with --auth: the epoch (0..2^32-1) the job key is derived with; a "
                         "new epoch makes the old key's packets worthless")
    cj.add_argument("--clear", action="store_true", help="unconfigure the job instead")
    cj.set_defaults(board_run=_configure_job)

    jk = sub.add_parser("job-key", help="print a job's key (section 7) for its workers",
                        description="Print the job key of an authenticated job, derived from "
                                    "the 128-bit control key, the job and its epoch (32 hex "
                                    "digits), for a worker that is not a Python process. "
                                    "Needs the key only; nothing is sent.")
    jk.add_argument("job", type=int, help="job number")
    jk.add_argument("--epoch", type=_epoch, metavar="E", required=True,
                    help="the epoch the job was configured with")
    jk.add_argument("--key", help="the control key, 32 hex digits (default: GRADWIRE_KEY)")
    jk.set_defaults(board_run=_job_key)

    for name, func, (inp, out), text in (
            ("compress", _compress, ("IN.npy", "OUT.gwz"),
             "compress a float32 .npy through the board's NIC transmit path"),
            ("decompress", _decompress, ("IN.gwz", "OUT.npy"),
             "decompress a .gwz through the board's NIC receive path")):
        c = sub.add_parser(name, help=text, description=text + " (packets sized for the MTU).")
        _connection_arguments(c)
        c.add_argument("input", metavar=inp)
        c.add_argument("output", metavar=out)
        if name == "compress":
            c.add_argument("-k", type=int, default=10, help="error bound 2^-k (default 10)")
            c.add_argument("--packet-values", type=int,
                           help="values per packet (default: the most the MTU allows)")
            c.add_argument("--cast", action="store_true",
                           help="accept float64/float16 input, rounded to float32 first")
        c.set_defaults(board_run=func)


def run(args):
    return args.board_run(args)


# -- connecting --------------------------------------------------------------------------

def _retries_within(seconds, initial, maximum):
    """Resends whose timeouts (doubling from ``initial`` up to ``maximum``) fit ``seconds``."""
    total, timeout, retries = initial, initial, 0
    while retries < 64:
        timeout = min(timeout * 2, maximum)
        if total + timeout > seconds:
            break
        total += timeout
        retries += 1
    return retries


def _settings(args, need_key):
    from ..driver.settings import board_settings
    try:
        settings = board_settings(args.board, port_base=args.port_base, key=args.key,
                                  mtu=args.mtu)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if need_key and settings["key"] is None:
        raise CliError("no control key: give --key HEX or set GRADWIRE_KEY (gradwire board "
                       "serve prints the key of a virtual board)")
    return settings


def _open(args, *, region=None, need_key=True, single=False):
    """A transport to the board of ``args``; ``single``: one datagram per request, waited
    for ``--timeout`` seconds (ping)."""
    from ..driver.udp import UdpTransport
    settings = _settings(args, need_key)
    if single:
        # every request waits exactly --timeout: the transport's estimate of the round trip
        # would time out a reply slower than the last ones, and ping would count a loss
        initial = minimum = maximum = args.timeout
        retries = 0
    else:
        initial = min(0.1, args.timeout / 4)
        minimum = min(0.02, initial)
        maximum = max(initial, min(1.0, args.timeout / 2))
        retries = args.retries if args.retries is not None else \
            _retries_within(args.timeout, initial, maximum)
    try:
        return UdpTransport(settings["host"], port_base=settings["port_base"],
                            key=settings["key"], mtu=settings["mtu"], region=region,
                            timeout=initial, min_timeout=minimum, max_timeout=maximum,
                            retries=retries), settings
    except (ValueError, TransportError) as exc:
        raise CliError(str(exc)) from None


def _where(settings):
    return f"{settings['host']} ports {settings['port_base']}-{settings['port_base'] + 3}"


def _diagnose(settings, args):
    """Why control requests go unanswered: a NIC port that answers means a wrong key."""
    from ..driver.udp import UdpTransport
    probe = UdpTransport(settings["host"], port_base=settings["port_base"],
                         timeout=min(0.2, args.timeout / 4), max_timeout=0.5, retries=2)
    try:
        for stream, service in (("tx", Service.NIC_TX), ("rx", Service.NIC_RX)):
            try:
                # a RAW_F32 packet without COMPRESS passes either path unchanged
                probe.exchange(stream, [Packet(Header(type=PacketType.RAW_F32))])
            except TransportError:
                continue
            return (f"the board at {_where(settings)} answers on its "
                    f"{_SERVICE_NAMES[service]} port but not to control requests: the control "
                    f"key is wrong (--key or GRADWIRE_KEY), or the board is built without its "
                    f"control service")
    finally:
        probe.close()
    return (f"no reply from the board at {_where(settings)} within about {args.timeout:g} s: "
            f"is it running (gradwire board serve for a virtual one), and are the address "
            f"and port base right?")


def _control(args, settings, call):
    """Run ``call()`` (control traffic) and turn an unanswered request into one clear line."""
    from ..driver.transport import NoReplyError
    try:
        return call()
    except NoReplyError as exc:
        if exc.service is Service.CTRL:
            raise CliError(_diagnose(settings, args)) from None
        raise CliError(str(exc)) from None
    except TransportError as exc:
        raise CliError(str(exc)) from None


def _services(transport, settings, args):
    word, = _control(args, settings, lambda: transport.read_many(
        [network_address("net", NET_REGISTERS["services"].address)], full=True))
    return {s for s, offset in SERVICE_OFFSETS.items() if word >> offset & 1}


def _require_service(transport, settings, args, service):
    if settings["key"] is None:
        return          # cannot ask without the key; a missing service then times out
    built = _services(transport, settings, args)
    if service not in built:
        names = ", ".join(s.value for s in Service if s in built) or "none"
        raise CliError(f"the board at {_where(settings)} is built without the "
                       f"{_SERVICE_NAMES[service]} (its services: {names})")


# -- serve -------------------------------------------------------------------------------

@contextlib.contextmanager
def _serving(board, stop):
    """SIGINT and SIGTERM ask ``board`` to stop serving; on the way out the handlers before
    are put back and ``stop`` (the board's own) ends it."""
    previous = {signum: signal.signal(signum, lambda signum, frame: board.request_stop())
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        stop()


def _serve(args):
    if args.tap is not None:
        return _serve_tap(args)
    from host.board import VirtualBoard, WireFaults
    from ..driver.settings import ENV_KEY, ENV_PORT_BASE, format_key, parse_key

    key_text = args.key or os.environ.get(ENV_KEY)
    try:
        key = parse_key(key_text) if key_text else None
        port_base = args.port_base if args.port_base is not None else \
            int(os.environ.get(ENV_PORT_BASE, PORT_BASE))
        service_ports(port_base)
        faults = WireFaults(args.fault_rate, seed=args.fault_seed) if args.fault_rate else None
        params = {}
        if args.backend == "golden":
            params = dict(slots=args.slots, lanes=args.lanes, jobs=args.jobs,
                          max_workers=args.max_workers, max_count=args.max_count,
                          services=[s for s in Service if s.value not in args.without])
        elif args.without:
            raise ValueError("--without applies to the golden backend")
        board = VirtualBoard(args.backend, port_base=port_base, key=key, faults=faults, **params)
        board.open()
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    with _serving(board, board.stop):
        print(f"gradwire board: {board.describe()}", flush=True)
        if key is None:
            print(f"gradwire board: control key {format_key(board.key)} (random: give --key "
                  f"or GRADWIRE_KEY to choose it)", flush=True)
        print(f"gradwire board: ready on {board.host}:{board.port_base}-{board.port_base + 3}",
              flush=True)
        board.serve_forever()
    s = board.stats
    print(f"gradwire board: stopped after {s['received']:,} datagrams in, {s['sent']:,} out"
          + (f"; wire faults {board.faults.stats()}" if board.faults else ""), flush=True)
    return 0


def _serve_tap(args):
    """``serve --tap NAME``: the Verilated network top on a TAP interface
    (:mod:`host.board.tap`). Its address and ports are those it is built with, so the
    options that would choose them are refused unless they agree; its key is the
    simulation key, or the one given (that key's build)."""
    from ..driver.settings import ENV_KEY, ENV_PORT_BASE, format_key, parse_key

    if args.backend != "verilator":
        raise CliError(f"--tap serves the Verilated network top: give --backend verilator "
                       f"(not {args.backend})")
    if args.fault_rate:
        raise CliError("--fault-rate applies to the sockets of a virtual board, not to --tap "
                       "(lose frames on the TAP with tc netem instead)")
    if args.without:
        raise CliError("--without applies to the golden backend")
    # the key the Verilated top is built with: the simulation key, or the one given (a
    # build of its own: a 128-bit key's is section 7's gateware, as `make bitstream` builds
    # it by default)
    from contract.network import SIMULATION_KEY
    key_text, source = (args.key, "--key") if args.key else (os.environ.get(ENV_KEY), ENV_KEY)
    key = SIMULATION_KEY
    if key_text:
        try:
            key = parse_key(key_text)
        except ValueError as exc:
            raise CliError(f"{source}: {exc}") from None
    port_text = args.port_base if args.port_base is not None else os.environ.get(ENV_PORT_BASE)
    if port_text is not None and str(port_text).strip() != str(PORT_BASE):
        raise CliError(f"the TAP board serves the ports it is built with, "
                       f"{PORT_BASE}-{PORT_BASE + 3}; leave --port-base out (and "
                       f"{ENV_PORT_BASE} unset), not {port_text}")
    from host.board.tap import TapBoard
    try:
        board = TapBoard(args.tap, key=key)
    except (ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    started = time.perf_counter()
    with _serving(board, board.close):
        _serve_tap_forever(board)
    s = board.stats
    seconds = time.perf_counter() - started
    print(f"gradwire board: stopped after {s['frames_in']:,} frames in, {s['frames_out']:,} out "
          f"({s['arp_out']:,} ARP), {s['ticks']:,} idle ticks; {s['cycles']:,} engine cycles "
          f"simulated in {seconds:.1f} s "
          f"({s['cycles'] / max(board.sim_seconds, 1e-9):,.0f} cycles/s while running)"
          + (f"; {s['write_errors']:,} frames the TAP refused (interface down)"
             if s["write_errors"] else ""), flush=True)
    return 0


def _serve_tap_forever(board):
    """Say how the TAP interface stands, then serve until asked to stop."""
    from host.board.tap import interface_state

    from ..driver.settings import format_key
    print(f"gradwire board: {board.describe()}", flush=True)
    from contract.network import SIMULATION_KEY
    if board.key == SIMULATION_KEY:
        print(f"gradwire board: control key {format_key(board.key)} (the simulation key the "
              f"Verilated top is built with)", flush=True)
    else:
        # the user's own key: never echoed
        print(f"gradwire board: control key as given ({4 * len(format_key(board.key))} bits; "
              f"the Verilated top is built with it)", flush=True)
    # the interface is the user's to configure; say what is missing, serve anyway (it
    # may be configured after this line)
    up, address = interface_state(board.name)
    if address is None:
        print(f"gradwire board: {board.name} has no IPv4 address yet: give the host one "
              f"on the board's subnet (ip addr add 192.168.77.1/24 dev {board.name})",
              flush=True)
    elif ipaddress.IPv4Address(board.ip) not in address.network \
            or address.ip == ipaddress.IPv4Address(board.ip):
        print(f"gradwire board: {board.name} has {address}, which does not reach the "
              f"board at {board.ip}: give the host another address on its subnet",
              flush=True)
    if not up:
        print(f"gradwire board: {board.name} is down (ip link set {board.name} up)",
              flush=True)
    print(f"gradwire board: ready on TAP {board.name}: board {board.ip} ({board.mac}) ports "
          f"{board.port_base}-{board.port_base + 3}", flush=True)
    try:
        board.serve_forever()
    except TransportError as exc:
        raise CliError(f"the Verilated board stopped: {exc}") from None


# -- status and ping ---------------------------------------------------------------------

def _read_status(transport):
    """Everything ``status`` shows, read in a few batched CTRL packets."""
    from ..driver.switch import UPSTREAM_FIELDS
    from ..golden.aggregator import Upstream
    names, addresses = [], []

    def want(name, region, local):
        names.append(name)
        addresses.append(network_address(region, local))

    for register in ("mac_high", "mac_low", "ip", "port_base", "services", "link"):
        want(("net", register), "net", NET_REGISTERS[register].address)
    for counter, local in NET_REGISTERS["counter"].items():
        want(("net_counter", counter), "net", local)
    for path in ("tx", "rx"):
        for counter, local in NIC_REGISTERS[path].items():
            want((f"nic_{path}", counter), "nic", local)
    for counter, local in SWITCH_REGISTERS["counter"].items():
        want(("switch_counter", counter), "switch", local)
    want(("switch", "params"), "switch", SWITCH_REGISTERS["params"].address)
    for job in range(_JOB_REGS.count):
        for f in _JOB_REGS.fields:
            want(("job", job, f.name), "switch", _JOB_REGS.address(job, f.name))
    values = dict(zip(names, transport.read_many(addresses, full=True)))
    jobs = {}
    for job in range(_JOB_REGS.count):
        fields = {f.name: values[("job", job, f.name)] for f in _JOB_REGS.fields}
        if fields["workers"]:
            jobs[job] = fields
    table = {}
    if jobs:
        entries = [(job, w) for job, f in jobs.items()
                   for w in range(min(f["workers"], MAX_WORKERS_IN_TABLE))]
        addresses = [network_address("net", _TABLE.address(j * MAX_WORKERS_IN_TABLE + w, field))
                     for j, w in entries for field in ("ip", "port")]
        # each job's result group and upstream, in the same requests
        addresses += [network_address("net", _GROUPS.address(j, field))
                      for j in jobs for field in ("ip", "port")]
        addresses += [network_address("switch", _UPSTREAMS.address(j, field))
                      for j in jobs for field in UPSTREAM_FIELDS]
        words = transport.read_many(addresses, full=True)
        groups = words[2 * len(entries):2 * len(entries) + 2 * len(jobs)]
        upstreams = words[2 * len(entries) + 2 * len(jobs):]
        for (j, w), ip, port in zip(entries, words[0::2], words[1::2]):
            table.setdefault(j, {})[w] = (ip, port)
        for j, ip, port in zip(jobs, groups[0::2], groups[1::2]):
            jobs[j]["group"] = (ip, port)
        fields = len(UPSTREAM_FIELDS)
        for i, j in enumerate(jobs):
            # a board whose switch predates trees reads them as 0: no upstream
            jobs[j]["upstream"] = Upstream.from_registers(*upstreams[fields * i:fields * (i + 1)])
    auth = None
    if is_authenticated(transport.key):
        # section 7's registers (a board with a 128-bit key): its counters, the largest
        # accepted write counter, and each job's authentication
        singles = ("write_counter_low", "write_counter_high", "auth_features")
        addresses = [network_address("net", _AUTH_COUNTERS.address(c)) for c in AUTH_COUNTERS]
        addresses += [network_address("net", AUTH_REGISTERS[name].address) for name in singles]
        addresses += [network_address("net", _JOB_AUTH.address(j, field))
                      for j in jobs for field in ("enable", "epoch")]
        words = transport.read_many(addresses, full=True)
        n = len(AUTH_COUNTERS)
        low, high, features = words[n:n + len(singles)]
        auth = {"counters": dict(zip(AUTH_COUNTERS, words[:n])),
                "write_counter": low | high << 32,
                "features": [name for bit, name in _AUTH_FEATURE_NAMES if features & bit]}
        for i, j in enumerate(jobs):
            enable, epoch = words[n + len(singles) + 2 * i:n + len(singles) + 2 + 2 * i]
            jobs[j]["epoch"] = epoch if enable & 1 else None
    return values, jobs, table, auth


def _upstream_json(upstream):
    """A job's upstream as ``status --json`` shows it (None: no upstream)."""
    if upstream is None:
        return None
    return {"address": f"{_ip_text(upstream.ip)}:{upstream.port}", "job": upstream.job,
            "worker": upstream.worker}


def _ip_text(value):
    return ".".join(str(value >> shift & 0xFF) for shift in (24, 16, 8, 0))


def _status(args):
    transport, settings = _open(args)
    try:
        started = time.perf_counter()
        values, jobs, table, auth = _control(args, settings, lambda: _read_status(transport))
        elapsed = time.perf_counter() - started
    finally:
        transport.close()
    mac = values[("net", "mac_high")] << 32 | values[("net", "mac_low")]
    mac_text = ":".join(f"{mac >> shift & 0xFF:02x}" for shift in range(40, -8, -8))
    built = [s.value for s, off in SERVICE_OFFSETS.items()
             if values[("net", "services")] >> off & 1]
    params = decode_switch_params(values[("switch", "params")])
    status = {
        "address": {"host": settings["host"], "port_base": settings["port_base"]},
        "board": {"mac": mac_text, "ip": _ip_text(values[("net", "ip")]),
                  "port_base": values[("net", "port_base")],
                  "link": bool(values[("net", "link")] & 1), "services": built},
        "switch": {**params, "jobs": {
            job: {"workers": f["workers"], "slot_base": f["slot_base"],
                  "slot_count": f["slot_count"],
                  "status": str(JobStatus(f["commit"] & (JobStatus.BUSY | JobStatus.REJECTED))),
                  "group": (f"{_ip_text(f['group'][0])}:{f['group'][1]}"
                            if group_active(*f["group"]) else None),
                  "upstream": _upstream_json(f["upstream"]),
                  "auth_epoch": f.get("epoch"),
                  "worker_table": {w: f"{_ip_text(ip)}:{port}" if port else None
                                   for w, (ip, port) in table.get(job, {}).items()}}
            for job, f in jobs.items()}},
        "counters": {
            "net": {c: values[("net_counter", c)] for c in NET_COUNTERS},
            "nic_tx": {c: values[("nic_tx", c)] for c in NIC_TX_COUNTERS},
            "nic_rx": {c: values[("nic_rx", c)] for c in NIC_RX_COUNTERS},
            "switch": {c: values[("switch_counter", c)] for c in AGG_COUNTERS},
            **({"auth": auth["counters"]} if auth else {})},
        "write_counter": auth["write_counter"] if auth else None,
        "auth_features": auth["features"] if auth else None,
        "read_seconds": round(elapsed, 4),
        "control_packets": transport.network[Service.CTRL].requests,
    }
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    b = status["board"]
    print(f"board at {_where(settings)}: link {'up' if b['link'] else 'DOWN'}")
    print(f"  MAC {b['mac']}  IP {b['ip']}  port base {b['port_base']}")
    print(f"  services    {', '.join(built) or 'none'}")
    if status["auth_features"] is not None:
        # what of section 7 the board does (a board with a 128-bit key)
        have = status["auth_features"]
        missing = [name for _, name in _AUTH_FEATURE_NAMES if name not in have]
        print(f"  section 7   {', '.join(have) or 'none'}"
              + (f" (not: {', '.join(missing)})" if missing else ""))
    if "switch" in built:
        print(f"  switch      {params['slots']} slots of {params['lanes']} lanes")
        for job, j in status["switch"]["jobs"].items():
            print(f"  job {job:<7} {j['workers']} workers, slots {j['slot_base']}.."
                  f"{j['slot_base'] + j['slot_count'] - 1}, status {j['status']}")
            if j["group"]:
                print(f"    result group {j['group']} (each multicast result once)")
            if j["auth_epoch"] is not None:
                print(f"    authenticated, epoch {j['auth_epoch']} (tags under its job key)")
            if j["upstream"]:
                u = j["upstream"]
                print(f"    upstream {u['address']} job {u['job']} worker {u['worker']} (a leaf: "
                      f"completed slots go there, its results to the workers)")
            for w, address in j["worker_table"].items():
                print(f"    worker {w:<3} {address or '(no entry)'}")
    for group, counters in status["counters"].items():
        print(f"  counters {group}:")
        items = list(counters.items())
        for i in range(0, len(items), 3):
            print("    " + "".join(f"{name:<20}{value:>12,}  " for name, value in
                                   items[i:i + 3]).rstrip())
    print(f"  (read in {status['control_packets']} control packets, {elapsed * 1e3:.1f} ms)")
    return 0


def _wire_status(args):
    transport, settings = _open(args)
    entries = list(WIRE_REGISTERS)
    addresses = [network_address("wire", local) for entry in entries
                 for _, local in entry.items()]
    try:
        values = iter(_control(args, settings, lambda: transport.read_many(addresses,
                                                                           full=True)))
    finally:
        transport.close()
    counters = {entry.name: {name: next(values) for name, _ in entry.items()}
                for entry in entries}
    if args.json:
        print(json.dumps({"address": {"host": settings["host"],
                                      "port_base": settings["port_base"]},
                          "counters": counters}, indent=2))
        return 0
    if not any(any(block.values()) for block in counters.values()):
        print(f"gradwire board wire-status: every counter reads 0 at {_where(settings)}: "
              f"a board built with the network top reads the wire's region as 0")
    print(f"NIC in the wire at {_where(settings)}:")
    print(f"  {'counter':<20}{'port 0 (host)':>16}{'port 1 (network)':>18}")
    for name in WIRE_COUNTERS:
        print(f"  {name:<20}{counters['port0'][name]:>16,}{counters['port1'][name]:>18,}")
    for block, title in (("tx", "NIC transmit path"), ("rx", "NIC receive path")):
        print(f"  {title}: " + ", ".join(f"{name} {value:,}"
                                         for name, value in counters[block].items()))
    return 0


def _ping(args):
    if args.count < 1:
        raise CliError("--count must be at least 1")
    transport, settings = _open(args, single=True)
    address = network_address("net", NET_REGISTERS["link"].address)
    times = []
    print(f"PING board {settings['host']}:{service_ports(settings['port_base'])[Service.CTRL]} "
          f"(control read of net.link)")
    try:
        for i in range(args.count):
            if i:
                time.sleep(args.interval)
            started = time.perf_counter()
            try:
                transport.read_many([address], full=True)
            except TransportError:
                print(f"  seq {i}: no reply within {args.timeout:g} s")
                continue
            times.append((time.perf_counter() - started) * 1e3)
            print(f"  seq {i}: reply in {times[-1]:.3f} ms")
    finally:
        transport.close()
    lost = args.count - len(times)
    summary = f"--- {args.count} requests, {len(times)} replies, {100 * lost / args.count:.0f}% lost"
    if times:
        summary += (f"; round trip min/avg/max {min(times):.3f}/{sum(times) / len(times):.3f}/"
                    f"{max(times):.3f} ms")
    print(summary)
    if not times:
        raise CliError(_diagnose(settings, args))
    return 0


# -- configure-job -----------------------------------------------------------------------

def _configure_job(args):
    from ..driver.switch import NoUpstreamError, SwitchInterface, format_upstream
    if not 0 <= args.job < _JOB_REGS.count:
        raise CliError(f"job must be in 0..{_JOB_REGS.count - 1}, not {args.job}")
    upstream_given = any(value is not None for value in (args.upstream, args.upstream_job,
                                                         args.upstream_worker))
    if args.clear and (args.workers or args.slots or args.worker or args.group is not None
                       or upstream_given or args.auth or args.epoch is not None):
        raise CliError("--clear takes no --workers, --slots, --worker, --group, --upstream, "
                       "--auth or --epoch")
    if args.auth != (args.epoch is not None):
        raise CliError("--auth and --epoch E go together (the job key derives from the "
                       "epoch)")
    if not args.clear and args.workers is None:
        raise CliError("give --workers N (or --clear)")
    if args.worker and len(args.worker) != args.workers:
        raise CliError(f"give one --worker address per worker ({args.workers}), or none; got "
                       f"{len(args.worker)}")
    from ..driver.sockets import parse_group
    try:
        group = parse_group(args.group)
    except ValueError as exc:
        raise CliError(f"--group: {exc}") from None
    upstream = _upstream_option(args)
    transport, settings = _open(args, region="switch")
    try:
        switch = _control(args, settings, lambda: SwitchInterface(transport))
        if args.clear:
            _control(args, settings, lambda: switch.clear_job(args.job))
            print(f"job {args.job} cleared")
            return 0
        base, count = args.slots if args.slots else (0, switch.slots)
        if args.worker:
            from contract.network import ip_to_int
            pairs = []
            for w, (ip, port) in enumerate(args.worker):
                entry = args.job * MAX_WORKERS_IN_TABLE + w
                pairs += [(network_address("net", _TABLE.address(entry, "ip")), ip_to_int(ip)),
                          (network_address("net", _TABLE.address(entry, "port")), port)]
            _control(args, settings, lambda: transport.write_many(pairs, full=True))
        from ..driver.udp_worker import write_group, write_job_auth
        # before the commit, always: without --group a job configured again loses its group
        _control(args, settings, lambda: write_group(transport, args.job, group))
        # likewise its authentication: without --auth a job configured again loses it
        try:
            _control(args, settings, lambda: write_job_auth(transport, args.job, args.epoch))
        except TransportError as exc:
            if args.epoch is None:
                raise
            raise CliError(f"--auth: {exc}") from None

        def configure():
            # the upstream registers before the commit, always: without --upstream a job
            # configured again loses its upstream
            try:
                switch.configure_job(args.job, args.workers, base, count, upstream=upstream)
            except NoUpstreamError as exc:
                raise CliError(f"--upstream: {exc}") from None

        try:
            _control(args, settings, configure)
        except ValueError as exc:
            raise CliError(f"{exc} (another job's slots overlap, or the board's switch has "
                           f"fewer jobs or workers)") from None
    finally:
        transport.close()
    print(f"job {args.job}: {args.workers} workers, slots {base}..{base + count - 1}"
          + (", worker table " + " ".join(f"{ip}:{port}" for ip, port in args.worker)
             if args.worker else "")
          + (f", result group {group[0]}:{group[1]}" if group else "")
          + (f", upstream {format_upstream(upstream)}" if upstream else "")
          + (f", authenticated, epoch {args.epoch} (its workers need the job key: "
             f"gradwire board job-key {args.job} --epoch {args.epoch})"
             if args.auth else ""))
    return 0


def _epoch(text: str) -> int:
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 0 <= value <= 0xFFFF_FFFF:
        raise argparse.ArgumentTypeError(f"an epoch is 0..{0xFFFF_FFFF}, not {value}")
    return value


def _job_key(args):
    from ..driver.settings import parse_key
    from ..golden.ctrl_auth import is_authenticated
    from ..golden.siphash import job_key

    if not 0 <= args.job < _JOB_REGS.count:
        raise CliError(f"job must be in 0..{_JOB_REGS.count - 1}, not {args.job}")
    text = args.key if args.key is not None else os.environ.get("GRADWIRE_KEY")
    if not text:
        raise CliError("no control key: give --key or set GRADWIRE_KEY (32 hex digits)")
    try:
        key = parse_key(text)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if not is_authenticated(key):
        raise CliError("a job key derives from a 128-bit control key (32 hex digits); this "
                       "one has 16 (section 4's key has no authenticated jobs)")
    print(job_key(key, args.job, args.epoch).hex())
    return 0


def _upstream_option(args):
    """``--upstream``, ``--upstream-job`` and ``--upstream-worker`` as an ``Upstream`` (or
    None: no upstream), checked before anything is written."""
    from ..driver.switch import parse_upstream
    no_upstream = args.upstream is None or args.upstream.strip() == "0"
    if no_upstream:
        if args.upstream_job is not None or args.upstream_worker is not None:
            raise CliError("--upstream-job and --upstream-worker need --upstream HOST:PORT")
        return None
    missing = [name for name, value in (("--upstream-job J", args.upstream_job),
                                        ("--upstream-worker W", args.upstream_worker))
               if value is None]
    if missing:
        raise CliError(f"--upstream needs {' and '.join(missing)} (the parent's job number and "
                       f"this job's worker number in it)")
    for option, value, count in (("--upstream-job", args.upstream_job, MAX_JOBS_IN_TABLE),
                                 ("--upstream-worker", args.upstream_worker,
                                  MAX_WORKERS_IN_TABLE)):
        if not 0 <= value < count:
            raise CliError(f"{option} must be in 0..{count - 1}, not {value}")
    try:
        return parse_upstream(args.upstream, args.upstream_job, args.upstream_worker)
    except ValueError as exc:
        raise CliError(f"--upstream: {exc}") from None


# -- compress / decompress ---------------------------------------------------------------

def _rates(values, packets, seconds, transport, service):
    s = transport.network[service]
    seconds = max(seconds, 1e-9)
    return (f"  throughput  {values / seconds:,.0f} values/s ({4 * values / seconds / 1e6:.2f} MB/s "
            f"of fp32), {packets / seconds:,.0f} packets/s; {s.datagrams:,} datagrams, "
            f"{s.resends:,} resends, round trip {s.srtt_ms or 0:.2f} ms")


def _compress(args):
    from . import codec
    from ..driver.nic import NicInterface
    from ..golden import inceptionn as inc

    try:
        k = inc.check_k(args.k)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    transport, settings = _open(args, region="nic", need_key=False)
    try:
        _require_service(transport, settings, args, Service.NIC_TX)
        per_packet = args.packet_values or transport.max_packet_values
        if not 1 <= per_packet <= transport.max_packet_values:
            raise CliError(f"--packet-values must be in 1..{transport.max_packet_values} at an "
                           f"MTU of {transport.mtu} (jumbo frames: --mtu 9000)")
        nic = NicInterface(transport, packet_values=per_packet)

        def encode(chunk, base):
            try:
                return nic.transmit(chunk, k, seq=base // per_packet, offset=base)
            except TransportError as exc:
                raise CliError(f"{exc}") from None

        started = time.perf_counter()
        header, source, _, _ = codec.compress_file(
            args.input, args.output, k=k, packet_values=per_packet, cast=args.cast,
            encode=encode, command="board compress")
        elapsed = time.perf_counter() - started
    finally:
        transport.close()
    n = source.size
    payload = header.packets_bytes - 32 * header.packet_count
    print(f"{args.input} -> {args.output} through the board at {_where(settings)}")
    print(f"  values      {n:,} float32 in {header.packet_count:,} INC_F32 packets of <= "
          f"{per_packet} values, k={k}")
    print(f"  payload     {4 * n:,} B raw -> {payload:,} B compressed "
          f"(ratio {4 * n / payload if payload else float('nan'):.2f}x)")
    print(_rates(n, header.packet_count, elapsed, transport, Service.NIC_TX))
    return 0


def _decompress(args):
    from . import codec
    from ..driver.nic import NicInterface

    transport, settings = _open(args, region="nic", need_key=False)
    try:
        _require_service(transport, settings, args, Service.NIC_RX)
        nic = None

        def check(h):
            nonlocal nic
            if h.packet_values > transport.max_packet_values:
                raise CliError(f"{args.input} holds packets of {h.packet_values} values; an "
                               f"MTU of {transport.mtu} carries {transport.max_packet_values} "
                               f"at most (jumbo frames: --mtu 9000)")
            nic = NicInterface(transport, packet_values=h.packet_values)

        def decode(packets, count, base):
            try:
                return nic.receive(packets, count, offset=base)
            except TransportError as exc:
                raise CliError(f"{exc} (the receive path drops a malformed packet without "
                               f"a reply: `gradwire info {args.input}` checks the file)") \
                    from None

        started = time.perf_counter()
        h = codec.decompress_file(args.input, args.output, decode=decode, check=check,
                                  command="board decompress")
        elapsed = time.perf_counter() - started
    finally:
        transport.close()
    print(f"{args.input} -> {args.output} through the board at {_where(settings)}: "
          f"{h.value_count:,} float32 values, shape {h.shape}, k={h.k}")
    print(_rates(h.value_count, h.packet_count, elapsed, transport, Service.NIC_RX))
    return 0
