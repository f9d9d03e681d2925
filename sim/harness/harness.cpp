// The compiled co-simulation harness: a Verilated top, its clock loop and its AXI-Stream
// handshakes in C++, driven by the host over a binary protocol on two pipes.
//
// Written once for any top. `sim/harness/build.py` generates `harness_ports.h` from the
// top's stream table (which flat AXI-Stream port pairs exist, and the optional ctrl_* port)
// and builds this file with the model (`--prefix Vtop`), so the model class is always Vtop.
//
// The cycle accounting is the cocotb bridge's (`sim/bridge.py`), reproduced exactly:
//
// * every cycle the inputs for the coming cycle are set, the model settles (clk low), the
//   handshake signals are sampled (the values of the cycle that ends at the edge), then the
//   clock rises; "after the edge" every source and sink updates its outputs from those
//   samples, as cocotbext-axi's AxiStreamSource and AxiStreamSink do after RisingEdge;
// * a source presents its next beat only when its previous beat was taken (or it presented
//   none) and its pause pattern does not pause at this edge; frames follow each other
//   back to back; the last beat carries tkeep for the bytes it holds, zeros above;
// * a sink sets tready for the next cycle from the pause value it read after the previous
//   edge (cocotbext-axi samples `pause` before awaiting the edge), and keeps only the bytes
//   whose tkeep bit is set;
// * pause patterns are sim/harness/patterns.py's (splitmix64, counter based), active from
//   the first edge of the exchange up to and including its last.
//
// Protocol: sim/harness/pipe.h (the host is sim/harness/transport.py), on the file
// descriptors the host passes as argv[1] and argv[2]; stdout is redirected to stderr (the
// harness log) so that nothing the model prints can corrupt it.

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "Vtop.h"
#include "pipe.h"
#include "verilated.h"
#if VM_TRACE_FST
#include "verilated_fst_c.h"
typedef VerilatedFstC TraceFile;
#elif VM_TRACE
#include "verilated_vcd_c.h"
typedef VerilatedVcdC TraceFile;
#endif

namespace {

enum Op : uint8_t {
    OP_EXCHANGE = 1, OP_WRITE = 2, OP_READ = 3, OP_IDLE = 4, OP_CYCLE = 5, OP_CLOSE = 6,
    OP_PATTERN = 7, OP_BARE = 8, OP_INFO = 9,
};

// ---- pause patterns (the definition is sim/harness/patterns.py) ---------------------------

inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

struct Pattern {
    uint64_t key = 0;
    uint64_t threshold = 0;   // paused when the hash's top 32 bits are below; 2^32: always
    uint64_t burst = 1;

    static Pattern make(uint64_t seed, uint32_t side, uint64_t threshold, uint64_t burst) {
        Pattern p;
        p.key = splitmix64(seed * 4 + side);
        p.threshold = threshold;
        p.burst = burst ? burst : 1;
        return p;
    }
    // Pause after the c-th edge of the exchange (c >= 1).
    bool paused(uint64_t c) const {
        if (threshold == 0 || c < 1) return false;
        return (splitmix64(key ^ splitmix64((c - 1) / burst)) >> 32) < threshold;
    }
};

// ---- ports of the model -------------------------------------------------------------------

// A port of the Verilated model: Verilator stores a signal of up to 8 bits in a uint8_t, up
// to 16 in a uint16_t, 32 in a uint32_t, 64 in a uint64_t, wider ones in 32-bit words, all
// little-endian on the hosts this runs on; so a pointer and a size are enough for any.
struct Port {
    void* ptr = nullptr;
    size_t size = 0;

    bool present() const { return ptr != nullptr; }
    uint64_t get() const {
        uint64_t v = 0;
        std::memcpy(&v, ptr, size < 8 ? size : 8);
        return v;
    }
    void set(uint64_t v) const {
        if (size >= 8) {
            std::memset(ptr, 0, size);
            std::memcpy(ptr, &v, 8);
        } else {
            std::memcpy(ptr, &v, size);
        }
    }
};

template <typename T> Port port(T& member) { return Port{static_cast<void*>(&member), sizeof(T)}; }

// One flat AXI-Stream port group (prefix_tdata, _tkeep, _tlast, _tvalid, _tready).
struct AxisPorts {
    Port tdata, tkeep, tlast, tvalid, tready;
    size_t beat_bytes = 0;   // tdata width / 8
};

struct StreamBinding {
    const char* name;
    AxisPorts in;    // into the design (the design's sink port)
    AxisPorts out;   // out of the design (its source port)
};

struct CtrlBinding {
    Port addr, re, rdata, we, wdata;
};

}  // namespace

// Generated from the top's stream table: bind_ports(top, streams, ctrl), PORT_CLK, PORT_RST.
#include "harness_ports.h"

namespace {

struct Frame {
    size_t begin, length;   // into the exchange's byte buffer
};

// What cocotbext-axi's AxiStreamSource does, for the design's sink port.
struct Source {
    AxisPorts p;
    std::vector<uint8_t> bytes;
    std::vector<Frame> queue;
    size_t next_frame = 0;
    bool has_frame = false;
    Frame frame{0, 0};
    size_t offset = 0;
    bool active = false;
    bool tvalid = false;
    bool idle() const { return next_frame == queue.size() && !active; }
};

// What cocotbext-axi's AxiStreamSink does, for the design's source port.
struct Sink {
    AxisPorts p;
    bool tready = false;
    bool pause_sample = false;
    std::vector<uint8_t> current;   // the frame being received
    std::vector<std::vector<uint8_t>> done;   // complete frames not yet handed to the host
};

struct Stream {
    std::string name;
    Source source;
    Sink sink;
    // pause patterns of the current (or last) exchange, active for edges (start, end]
    Pattern in_pattern, out_pattern;
    uint64_t start = 0, end = 0;
    bool open_ended = false;
    // samples of the cycle that ends at the coming edge
    bool in_valid = false, in_ready = false, out_valid = false, out_ready = false;

    bool pause(const Pattern& p, uint64_t edge) const {
        if (edge <= start || (!open_ended && edge > end)) return false;
        return p.paused(edge - start);
    }
};

struct ExchangeStats {
    uint64_t cycles = 0, in_beats = 0, out_beats = 0, stall_in = 0, stall_out = 0;
    int64_t first_in = -1, last_in = -1, first_out = -1, last_out = -1;
};

class Harness : public RequestPipe {
public:
    Harness(int in_fd, int out_fd, const char* waves, uint64_t period_ps)
        : RequestPipe(in_fd, out_fd), period_ps_(period_ps) {
        context_ = std::make_unique<VerilatedContext>();
        context_->timeunit(-9);
        context_->timeprecision(-12);
        top_ = std::make_unique<Vtop>(context_.get(), "top");
        std::vector<StreamBinding> bindings;
        bind_ports(top_.get(), bindings, ctrl_);
        for (const StreamBinding& b : bindings) {
            Stream s;
            s.name = b.name;
            s.source.p = b.in;
            s.sink.p = b.out;
            streams_.push_back(std::move(s));
        }
#if VM_TRACE
        if (waves && *waves) {
            context_->traceEverOn(true);
            trace_ = std::make_unique<TraceFile>();
            top_->trace(trace_.get(), 99);
            trace_->open(waves);
        }
#else
        if (waves && *waves) {
            std::fprintf(stderr, "harness: built without tracing, waves ignored\n");
        }
#endif
        reset();
    }

    ~Harness() {
        top_->final();
#if VM_TRACE
        if (trace_) trace_->close();
#endif
    }

    int serve() {
        return RequestPipe::serve([this](uint8_t op, bool& close) -> std::string {
            switch (op) {
            case OP_EXCHANGE: return exchange();
            case OP_WRITE: return write_register();
            case OP_READ: return read_register();
            case OP_IDLE: {
                uint64_t n = read_u64();
                for (uint64_t i = 0; i < n; ++i) step();
                return "";
            }
            case OP_CYCLE: put_u64(cycle_); return "";
            case OP_CLOSE: close = true; return "";
            case OP_PATTERN: pattern(); return "";
            case OP_BARE: return bare();
            case OP_INFO: info(); return "";
            default:
                close = true;   // the byte stream is out of step: nothing after is a request
                return "unknown request " + std::to_string(op);
            }
        });
    }

private:
    // ---- the clock loop -------------------------------------------------------------------

    void reset() {
        *static_cast<uint8_t*>(PORT_RST.ptr) = 1;
        for (Stream& s : streams_) {
            s.source.p.tvalid.set(0);
            s.source.p.tdata.set(0);
            if (s.source.p.tlast.present()) s.source.p.tlast.set(0);
            if (s.source.p.tkeep.present()) s.source.p.tkeep.set(0);
            s.sink.p.tready.set(0);
        }
        if (ctrl_.addr.present()) ctrl_.addr.set(0);
        if (ctrl_.re.present()) ctrl_.re.set(0);
        if (ctrl_.we.present()) ctrl_.we.set(0);
        if (ctrl_.wdata.present()) ctrl_.wdata.set(0);
        for (int i = 0; i < 4; ++i) edge(false);
        *static_cast<uint8_t*>(PORT_RST.ptr) = 0;
        // The sinks come out of reset and raise tready; the second edge is the bridge's (its
        // sources go idle before the first request).
        edge(true);
        edge(true);
        cycle_ = 0;
    }

    // One clock cycle: settle, sample, rising edge, then the sources and sinks react.
    void edge(bool run_ports) {
        *static_cast<uint8_t*>(PORT_CLK.ptr) = 0;
        top_->eval();
        dump(0);
        for (Stream& s : streams_) {
            s.in_valid = s.source.p.tvalid.get() & 1;
            s.in_ready = s.source.p.tready.get() & 1;
            s.out_valid = s.sink.p.tvalid.get() & 1;
            s.out_ready = s.sink.p.tready.get() & 1;
            if (run_ports && s.out_valid && s.out_ready) take_beat(s.sink);
        }
        if (ctrl_.rdata.present()) rdata_sample_ = ctrl_.rdata.get();
        *static_cast<uint8_t*>(PORT_CLK.ptr) = 1;
        top_->eval();
        dump(period_ps_ / 2);
        ++cycle_;
        ++edges_;
        if (!run_ports) return;
        for (Stream& s : streams_) {
            sink_after_edge(s);
            source_after_edge(s);
        }
    }

    void step() { edge(true); }

    void dump(uint64_t offset) {
#if VM_TRACE
        if (trace_) trace_->dump(edges_ * period_ps_ + offset);
#else
        (void)offset;
#endif
    }

    void take_beat(Sink& k) {
        const uint8_t* data = static_cast<const uint8_t*>(k.p.tdata.ptr);
        size_t n = k.p.beat_bytes;
        uint64_t keep = k.p.tkeep.present() ? k.p.tkeep.get() : ~0ull;
        uint64_t all = n >= 64 ? ~0ull : ((1ull << n) - 1);
        if ((keep & all) == all) {
            k.current.insert(k.current.end(), data, data + n);
        } else {
            for (size_t i = 0; i < n; ++i) {
                if (keep >> i & 1) k.current.push_back(data[i]);
            }
        }
        if (!k.p.tlast.present() || (k.p.tlast.get() & 1)) {
            k.done.push_back(std::move(k.current));
            k.current.clear();
        }
    }

    void sink_after_edge(Stream& s) {
        Sink& k = s.sink;
        k.tready = !k.pause_sample;
        k.p.tready.set(k.tready);
        k.pause_sample = s.pause(s.out_pattern, edges_);
    }

    void source_after_edge(Stream& s) {
        Source& src = s.source;
        if (!((s.in_valid && s.in_ready) || !s.in_valid)) return;   // a beat is held
        if (!src.has_frame && src.next_frame < src.queue.size()) {
            src.frame = src.queue[src.next_frame++];
            src.has_frame = true;
            src.offset = 0;
            src.active = true;
        }
        if (src.has_frame && !s.pause(s.in_pattern, edges_)) {
            size_t n = src.p.beat_bytes;
            size_t left = src.frame.length - src.offset;
            size_t take = left < n ? left : n;
            uint8_t* data = static_cast<uint8_t*>(src.p.tdata.ptr);
            const uint8_t* from = src.bytes.data() + src.frame.begin + src.offset;
            if (take == n && src.p.tdata.size == n) {
                std::memcpy(data, from, n);
            } else {
                std::memset(data, 0, src.p.tdata.size);
                std::memcpy(data, from, take);
            }
            src.offset += take;
            bool last = src.offset >= src.frame.length;
            if (src.p.tkeep.present()) src.p.tkeep.set(take >= 64 ? ~0ull : ((1ull << take) - 1));
            if (src.p.tlast.present()) src.p.tlast.set(last);
            src.p.tvalid.set(1);
            src.tvalid = true;
            if (last) src.has_frame = false;
        } else {
            src.p.tvalid.set(0);
            if (src.p.tlast.present()) src.p.tlast.set(0);
            src.tvalid = false;
            src.active = src.has_frame;
        }
    }

    // ---- requests --------------------------------------------------------------------------

    std::string exchange() {
        uint8_t index = read_u8();
        uint64_t seed = read_u64();
        uint64_t thr_in = read_u64(), thr_out = read_u64();
        uint64_t burst_in = read_u64(), burst_out = read_u64();
        uint64_t idle_limit = read_u64(), max_cycles = read_u64();
        uint32_t count = read_u32();
        if (index >= streams_.size()) {
            skip_frames(count);
            return "no stream " + std::to_string(index);
        }
        Stream& s = streams_[index];
        Source& src = s.source;
        if (!src.idle()) {   // only after an exchange that ran out of its cycle budget
            skip_frames(count);
            return "stream " + s.name + " is still sending the frames of an earlier exchange";
        }
        src.bytes.clear();
        src.queue.clear();
        src.next_frame = 0;
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t length = read_u32();
            size_t begin = src.bytes.size();
            src.bytes.resize(begin + length);
            if (!read_exact(src.bytes.data() + begin, length)) std::exit(0);
            src.queue.push_back(Frame{begin, length});
        }
        s.in_pattern = Pattern::make(seed, 1, thr_in, burst_in);
        s.out_pattern = Pattern::make(seed, 2, thr_out, burst_out);
        s.start = edges_;
        s.open_ended = true;

        ExchangeStats st;
        uint64_t quiet = 0, cycle = 0;
        std::string error;
        auto started = std::chrono::steady_clock::now();
        for (;;) {
            step();
            cycle = edges_ - s.start;
            ++quiet;
            if (s.in_valid && s.in_ready) {
                ++st.in_beats;
                if (st.first_in < 0) st.first_in = static_cast<int64_t>(cycle);
                st.last_in = static_cast<int64_t>(cycle);
                quiet = 0;
            } else if (s.in_valid) {
                ++st.stall_in;
            }
            if (s.out_valid) {
                quiet = 0;
                if (s.out_ready) {
                    ++st.out_beats;
                    if (st.first_out < 0) st.first_out = static_cast<int64_t>(cycle);
                    st.last_out = static_cast<int64_t>(cycle);
                } else {
                    ++st.stall_out;
                }
            }
            if (src.idle() && quiet >= idle_limit) break;
            if (cycle >= max_cycles) {
                error = "exchange did not settle within its budget of max_cycles=" +
                        std::to_string(max_cycles) + " cycles (" + std::to_string(st.in_beats) +
                        " beats in, " + std::to_string(st.out_beats) + " out, " +
                        std::to_string(s.sink.done.size()) + " frames out so far)";
                break;
            }
        }
        auto loop_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now() - started).count();
        s.end = edges_;
        s.open_ended = false;
        if (!error.empty()) return error;
        st.cycles = cycle;
        put_u64(static_cast<uint64_t>(loop_ns));
        put_u64(st.cycles);
        put_u64(st.in_beats);
        put_u64(st.out_beats);
        put_u64(st.stall_in);
        put_u64(st.stall_out);
        put_i64(st.first_in);
        put_i64(st.last_in);
        put_i64(st.first_out);
        put_i64(st.last_out);
        put_u32(static_cast<uint32_t>(s.sink.done.size()));
        for (const std::vector<uint8_t>& f : s.sink.done) {
            put_u32(static_cast<uint32_t>(f.size()));
            reply_.insert(reply_.end(), f.begin(), f.end());
        }
        s.sink.done.clear();
        return "";
    }

    std::string write_register() {
        uint32_t addr = read_u32(), value = read_u32();
        if (!ctrl_.we.present() || !ctrl_.wdata.present()) {
            return "this top has no writable register port (no ctrl_we/ctrl_wdata)";
        }
        ctrl_.addr.set(addr);
        ctrl_.wdata.set(value);
        ctrl_.we.set(1);
        step();
        ctrl_.we.set(0);
        step();
        return "";
    }

    std::string read_register() {
        uint32_t addr = read_u32();
        if (!ctrl_.re.present() || !ctrl_.rdata.present()) {
            return "this top has no register port (no ctrl_re/ctrl_rdata)";
        }
        ctrl_.addr.set(addr);
        ctrl_.re.set(1);
        step();
        ctrl_.re.set(0);
        step();   // ctrl_rdata is valid the cycle after ctrl_re: sampled before this edge
        put_u64(rdata_sample_);
        return "";
    }

    void pattern() {
        uint64_t seed = read_u64();
        uint32_t side = read_u32();
        uint64_t threshold = read_u64(), burst = read_u64(), n = read_u64();
        Pattern p = Pattern::make(seed, side, threshold, burst);
        put_u64(n);
        for (uint64_t c = 1; c <= n; ++c) put_u8(p.paused(c));
    }

    // The baseline: the same model and input bytes in the plainest loop there is (no
    // pauses, no accounting, every output always ready, the frames replayed cyclically).
    std::string bare() {
        uint8_t index = read_u8();
        uint64_t cycles = read_u64();
        uint32_t count = read_u32();
        std::vector<uint8_t> bytes;
        std::vector<Frame> frames;
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t length = read_u32();
            size_t begin = bytes.size();
            bytes.resize(begin + length);
            if (!read_exact(bytes.data() + begin, length)) std::exit(0);
            frames.push_back(Frame{begin, length});
        }
        if (index >= streams_.size()) return "no stream " + std::to_string(index);
        if (frames.empty()) return "the bare loop needs at least one frame";
        AxisPorts& in = streams_[index].source.p;
        for (Stream& s : streams_) s.sink.p.tready.set(1);
        size_t f = 0, offset = 0, n = in.beat_bytes;
        uint64_t beats = 0;
        auto load = [&]() {
            const Frame& fr = frames[f];
            size_t take = fr.length - offset < n ? fr.length - offset : n;
            std::memset(in.tdata.ptr, 0, in.tdata.size);
            std::memcpy(in.tdata.ptr, bytes.data() + fr.begin + offset, take);
            if (in.tkeep.present()) in.tkeep.set(take >= 64 ? ~0ull : ((1ull << take) - 1));
            if (in.tlast.present()) in.tlast.set(offset + take >= fr.length);
            offset += take;
            if (offset >= fr.length) { offset = 0; f = (f + 1) % frames.size(); }
        };
        load();
        in.tvalid.set(1);
        uint8_t* clk = static_cast<uint8_t*>(PORT_CLK.ptr);
        auto t0 = std::chrono::steady_clock::now();
        for (uint64_t i = 0; i < cycles; ++i) {
            *clk = 0;
            top_->eval();
            bool taken = in.tready.get() & 1;
            *clk = 1;
            top_->eval();
            if (taken) { ++beats; load(); }
        }
        auto t1 = std::chrono::steady_clock::now();
        in.tvalid.set(0);
        cycle_ += cycles;
        edges_ += cycles;
        // The design is left mid-packet: a bare run is the last thing a harness does.
        put_u64(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
        put_u64(beats);
        return "";
    }

    void info() {
        put_u32(static_cast<uint32_t>(streams_.size()));
        for (const Stream& s : streams_) {
            put_u32(static_cast<uint32_t>(s.name.size()));
            reply_.insert(reply_.end(), s.name.begin(), s.name.end());
            put_u32(static_cast<uint32_t>(s.source.p.beat_bytes));
            put_u32(static_cast<uint32_t>(s.sink.p.beat_bytes));
        }
        put_u8(ctrl_.re.present());
        put_u8(ctrl_.we.present());
#if VM_TRACE
        put_u8(1);
#else
        put_u8(0);
#endif
    }

    void skip_frames(uint32_t count) {
        std::vector<uint8_t> scratch;
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t length = read_u32();
            scratch.resize(length);
            if (!read_exact(scratch.data(), length)) std::exit(0);
        }
    }

    uint64_t period_ps_;
    std::unique_ptr<VerilatedContext> context_;
    std::unique_ptr<Vtop> top_;
#if VM_TRACE
    std::unique_ptr<TraceFile> trace_;
#endif
    std::vector<Stream> streams_;
    CtrlBinding ctrl_;
    uint64_t cycle_ = 0;   // cycles since reset, as the bridge's `cycle`
    uint64_t edges_ = 0;   // clock edges since power-up (pattern and wave time base)
    uint64_t rdata_sample_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s IN_FD OUT_FD [--waves FILE] [--period-ps N]\n", argv[0]);
        return 2;
    }
    int in_fd = std::atoi(argv[1]), out_fd = std::atoi(argv[2]);
    const char* waves = nullptr;
    uint64_t period_ps = 8000;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--waves")) waves = argv[i + 1];
        else if (!std::strcmp(argv[i], "--period-ps")) period_ps = std::strtoull(argv[i + 1], nullptr, 10);
    }
    // Anything the model prints goes to the log, never into the protocol.
    ::dup2(2, 1);
    Verilated::commandArgs(1, argv);
    int rc;
    {
        Harness harness(in_fd, out_fd, waves, period_ps);
        rc = harness.serve();
    }
    std::fflush(stderr);
    return rc;
}
