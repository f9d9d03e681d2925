// The compiled PHY harness: the Verilated network top (LiteEth's ECP5 RGMII core, the clock
// crossing, the front end and the engines) with the PHY chip played in C++ on its RGMII pins.
//
// The host (sim/harness/network.py) sends whole Ethernet frames (destination MAC to the end
// of the payload, no FCS); this file adds what a PHY chip puts on the wire and takes off it:
//
// * receive (PHY -> design, rgmii_rx_*): 7 preamble bytes 0x55, the SFD 0xD5, the frame
//   padded with zeros to 60 bytes, its FCS (CRC-32, least significant byte first), then at
//   least 12 idle bytes (the inter-frame gap). Each byte goes out as two nibbles at double
//   data rate: the low nibble with RX_DV on rgmii_rx_ctl for the rising edge of
//   rgmii_rx_clk, the high nibble with RX_DV xor RX_ER (0: no errors) for the falling edge.
//   A nibble changes right after the edge before the one that samples it (half a period of
//   setup and hold, as a PHY with its RGMII-ID delay gives it). Between frames the PHY sends
//   RGMII in-band status (RX_CTL low, RXD = 0b1101: link up, 1000 Mb/s, full duplex), which
//   is what LiteEth's ECP5 PHY reads its link state from.
// * transmit (design -> PHY, rgmii_tx_*): the design's ODDRX1F cells present the low nibble
//   and TX_EN while rgmii_tx_clk is high, the high nibble and TX_EN xor TX_ER while it is
//   low; the harness samples each half period, collects the bytes of every TX_EN burst,
//   strips the preamble and SFD, checks the FCS and hands the frames back (a frame with a
//   bad FCS, a bad preamble or TX_ER is counted, not returned).
//
// Clocks (sim/harness/network.py gives the periods): `clk` (engines and front end),
// `eth_clk` (LiteEth's user side), `rgmii_rx_clk` (the PHY's receive clock; LiteEth's ECP5
// PHY also transmits on it). An event loop in picoseconds toggles each at its own half
// period; edges that fall together are evaluated together (Verilator gives every process of
// one eval the values from before the edge, as non-blocking assignments do).
//
// A run ends once every frame was sent and nothing has happened for `idle` engine cycles:
// no receive or transmit activity on the pins and no change of the top's `counters` output
// (every datagram a service takes, drops or sends moves a counter).
// With the ARP flag a run also ends right after the design sent an ARP frame, so that the
// host can answer it without waiting out the idle time. With the expect flag it ends
// earlier too: once the design has sent `expect` UDP frames and been quiet for `settle`
// cycles (the host knows how many replies a batch of requests can bring at most).
//
// Protocol: sim/harness/pipe.h, on the file descriptors argv[1] and argv[2]. stdout goes to
// stderr (the log) so the model cannot corrupt it.

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
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
    OP_RUN = 1, OP_IDLE = 4, OP_CYCLE = 5, OP_CLOSE = 6, OP_INFO = 9, OP_COUNTERS = 10,
};

enum RunFlags : uint8_t { STOP_ON_ARP = 1, EXPECT = 2 };

constexpr uint8_t PREAMBLE = 0x55, SFD = 0xD5;
constexpr size_t PREAMBLE_BYTES = 7, MIN_FRAME = 60, FCS_BYTES = 4, IFG_BYTES = 12;
constexpr uint8_t INBAND_STATUS = 0xD;   // link up, 1000 Mb/s (0b10), full duplex

uint32_t crc32_table[256];

void init_crc32() {
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc32_table[i] = c;
    }
}

// The Ethernet FCS: CRC-32 (IEEE 802.3), reflected, initial and final xor 0xFFFFFFFF.
uint32_t crc32(const uint8_t* p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) c = crc32_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

struct Clock {
    uint8_t* pin;
    uint64_t half_ps;
    uint64_t next_ps;
    bool level = false;
};

struct RunStats {
    uint64_t cycles = 0, max_gap = 0, rx_frames = 0, rx_bytes = 0, tx_frames = 0;
    uint64_t tx_bytes = 0, bad_frames = 0;
};

class PhyHarness : public RequestPipe {
public:
    PhyHarness(int in_fd, int out_fd, const char* waves, uint64_t clk_ps, uint64_t eth_ps,
               uint64_t rgmii_ps, uint64_t rgmii_phase_ps)
        : RequestPipe(in_fd, out_fd) {
        context_ = std::make_unique<VerilatedContext>();
        context_->timeunit(-9);
        context_->timeprecision(-12);
        top_ = std::make_unique<Vtop>(context_.get(), "top");
        clocks_[0] = Clock{&top_->clk, clk_ps / 2, clk_ps / 2};
        clocks_[1] = Clock{&top_->eth_clk, eth_ps / 2, eth_ps / 2};
        clocks_[2] = Clock{&top_->rgmii_rx_clk, rgmii_ps / 2, rgmii_ps / 2 + rgmii_phase_ps};
        counters_size_ = sizeof(top_->counters);
        last_counters_.assign(counters_size_, 0);
#if VM_TRACE
        if (waves && *waves) {
            context_->traceEverOn(true);
            trace_ = std::make_unique<TraceFile>();
            top_->trace(trace_.get(), 99);
            trace_->open(waves);
        }
#else
        if (waves && *waves) std::fprintf(stderr, "phy harness: built without tracing\n");
#endif
        reset();
    }

    ~PhyHarness() {
        top_->final();
#if VM_TRACE
        if (trace_) trace_->close();
#endif
    }

    int serve() {
        return RequestPipe::serve([this](uint8_t op, bool& close) -> std::string {
            switch (op) {
            case OP_RUN: return run();
            case OP_IDLE: {
                uint64_t n = read_u64();
                uint64_t end = cycle_ + n;
                while (cycle_ < end) step();
                return "";
            }
            case OP_CYCLE: put_u64(cycle_); return "";
            case OP_CLOSE: close = true; return "";
            case OP_INFO: info(); return "";
            case OP_COUNTERS: {
                const uint8_t* c = reinterpret_cast<const uint8_t*>(&top_->counters);
                reply_.insert(reply_.end(), c, c + counters_size_);
                return "";
            }
            default:
                close = true;   // the byte stream is out of step: nothing after is a request
                return "unknown request " + std::to_string(op);
            }
        });
    }

private:
    // ---- the clocks -------------------------------------------------------------------------

    void reset() {
        top_->rst = 1;
        top_->eth_rst = 1;
        top_->rgmii_rx_ctl = 0;
        top_->rgmii_rx_data = INBAND_STATUS;
        for (int i = 0; i < 16; ++i) step();
        top_->rst = 0;
        top_->eth_rst = 0;
        // LiteEth's ARP cache clears one entry per cycle after reset; 256 covers any cache.
        for (int i = 0; i < 300; ++i) step();
        cycle_ = 0;
        std::memcpy(last_counters_.data(), &top_->counters, counters_size_);
        tx_out_.clear();
        bad_frames_ = 0;
    }

    // Advance to the next rising edge of the engine clock (one engine cycle), handling every
    // clock edge on the way.
    void step() {
        for (;;) {
            uint64_t t = clocks_[0].next_ps;
            for (const Clock& c : clocks_) t = c.next_ps < t ? c.next_ps : t;
            bool engine_rise = false, rgmii_edge = false;
            for (int i = 0; i < 3; ++i) {
                Clock& c = clocks_[i];
                if (c.next_ps != t) continue;
                c.level = !c.level;
                *c.pin = c.level;
                c.next_ps += c.half_ps;
                if (i == 0 && c.level) engine_rise = true;
                if (i == 2) rgmii_edge = true;
            }
            now_ps_ = t;
            top_->eval();
            dump();
            if (rgmii_edge) {
                if (clocks_[2].level) after_rgmii_rise();
                else after_rgmii_fall();
            }
            if (engine_rise) {
                ++cycle_;
                after_engine_cycle();
                return;
            }
        }
    }

    void dump() {
#if VM_TRACE
        if (trace_) trace_->dump(now_ps_);
#endif
    }

    // ---- receive: the PHY sends --------------------------------------------------------------

    // The rising edge took the low nibble; put up the high nibble for the falling edge.
    void after_rgmii_rise() {
        sample_tx_low();
        set_rx(rx_byte_ >> 4, rx_en_);
    }

    // The falling edge took the high nibble: the byte is done; put up the next one's low
    // nibble for the coming rising edge.
    void after_rgmii_fall() {
        sample_tx_high();
        next_rx_byte();
        set_rx(rx_byte_ & 0xF, rx_en_);
    }

    void set_rx(uint8_t nibble, bool ctl) {
        if (top_->rgmii_rx_data == nibble && top_->rgmii_rx_ctl == ctl) return;
        top_->rgmii_rx_data = nibble;
        top_->rgmii_rx_ctl = ctl;
        top_->eval();     // settle before the edge that samples it
    }

    void next_rx_byte() {
        if (rx_at_ < rx_wire_.size()) {
            rx_byte_ = rx_wire_[rx_at_++];
            rx_en_ = true;
            if (rx_at_ == rx_wire_.size()) gap_left_ = IFG_BYTES;
            return;
        }
        rx_en_ = false;
        rx_byte_ = INBAND_STATUS | INBAND_STATUS << 4;
        if (gap_left_) {
            --gap_left_;
            return;
        }
        if (rx_queue_.empty()) {
            rx_busy_ = false;
            return;
        }
        // Start the next frame: its first preamble byte goes out now.
        const std::vector<uint8_t>& f = rx_queue_.front();
        rx_wire_.assign(PREAMBLE_BYTES, PREAMBLE);
        rx_wire_.push_back(SFD);
        size_t begin = rx_wire_.size();
        rx_wire_.insert(rx_wire_.end(), f.begin(), f.end());
        if (f.size() < MIN_FRAME) rx_wire_.resize(begin + MIN_FRAME, 0);
        uint32_t fcs = crc32(rx_wire_.data() + begin, rx_wire_.size() - begin);
        for (int i = 0; i < 4; ++i) rx_wire_.push_back(static_cast<uint8_t>(fcs >> (8 * i)));
        rx_queue_.pop_front();
        rx_busy_ = true;
        ++stats_.rx_frames;
        stats_.rx_bytes += f.size();
        rx_at_ = 0;
        rx_byte_ = rx_wire_[rx_at_++];
        rx_en_ = true;
    }

    // ---- transmit: the PHY receives ----------------------------------------------------------

    void sample_tx_low() {
        tx_low_ = top_->rgmii_tx_data & 0xF;
        tx_en_ = top_->rgmii_tx_ctl & 1;
    }

    void sample_tx_high() {
        bool ctl = top_->rgmii_tx_ctl & 1;
        uint8_t byte = static_cast<uint8_t>(tx_low_ | (top_->rgmii_tx_data & 0xF) << 4);
        if (tx_en_) {
            tx_active_ = true;
            tx_cycle_ = true;
            if (ctl != tx_en_) tx_error_ = true;    // TX_ER during the frame
            tx_wire_.push_back(byte);
        } else if (tx_active_) {
            tx_active_ = false;
            tx_cycle_ = true;
            end_tx_frame();
        }
    }

    void end_tx_frame() {
        size_t at = 0;
        while (at < tx_wire_.size() && tx_wire_[at] == PREAMBLE) ++at;
        bool good = !tx_error_ && at >= 1 && at <= PREAMBLE_BYTES && at < tx_wire_.size()
                    && tx_wire_[at] == SFD;
        ++at;
        if (good && tx_wire_.size() >= at + MIN_FRAME + FCS_BYTES) {
            size_t n = tx_wire_.size() - at - FCS_BYTES;
            const uint8_t* frame = tx_wire_.data() + at;
            uint32_t fcs = 0;
            for (int i = 0; i < 4; ++i) fcs |= static_cast<uint32_t>(frame[n + i]) << (8 * i);
            if (crc32(frame, n) == fcs) {
                tx_out_.emplace_back(frame, frame + n);
                ++stats_.tx_frames;
                stats_.tx_bytes += n;
                if (n >= 14 && frame[12] == 0x08 && frame[13] == 0x06) arp_seen_ = true;
                if (n >= 24 && frame[12] == 0x08 && frame[13] == 0x00 && frame[23] == 17) ++udp_out_;
            } else {
                good = false;
            }
        } else {
            good = false;
        }
        if (!good) ++bad_frames_;
        tx_wire_.clear();
        tx_error_ = false;
    }

    // ---- activity -----------------------------------------------------------------------------

    void after_engine_cycle() {
        bool active = rx_busy_ || tx_cycle_ || tx_active_;
        tx_cycle_ = false;
        if (std::memcmp(last_counters_.data(), &top_->counters, counters_size_) != 0) {
            std::memcpy(last_counters_.data(), &top_->counters, counters_size_);
            active = true;
        }
        if (active) {
            if (quiet_ > stats_.max_gap && !rx_busy_) stats_.max_gap = quiet_;
            quiet_ = 0;
        } else {
            ++quiet_;
        }
    }

    // ---- requests -----------------------------------------------------------------------------

    std::string run() {
        uint64_t idle = read_u64(), max_cycles = read_u64(), settle = read_u64();
        uint32_t expect = read_u32();
        uint8_t flags = read_u8();
        uint32_t count = read_u32();
        for (uint32_t i = 0; i < count; ++i) {
            uint32_t length = read_u32();
            std::vector<uint8_t> frame(length);
            if (!read_exact(frame.data(), length)) std::exit(0);
            rx_queue_.push_back(std::move(frame));
        }
        if (count) rx_busy_ = true;
        stats_ = RunStats{};
        uint64_t start = cycle_;
        quiet_ = 0;
        arp_seen_ = false;
        udp_out_ = 0;
        uint64_t bad_before = bad_frames_;
        auto started = std::chrono::steady_clock::now();
        std::string error;
        uint64_t stopped_on_arp = 0;
        for (;;) {
            step();
            if (!rx_busy_ && quiet_ >= idle) break;
            if ((flags & EXPECT) && !rx_busy_ && udp_out_ >= expect && quiet_ >= settle) break;
            if ((flags & STOP_ON_ARP) && arp_seen_ && !tx_active_) {
                stopped_on_arp = 1;
                break;
            }
            if (cycle_ - start >= max_cycles) {
                error = "the network top did not settle within max_cycles=" +
                        std::to_string(max_cycles) + " cycles (" +
                        std::to_string(stats_.rx_frames) + " frames sent to it, " +
                        std::to_string(tx_out_.size()) + " frames from it so far)";
                break;
            }
        }
        auto loop_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::steady_clock::now() - started).count();
        if (!error.empty()) return error;
        stats_.cycles = cycle_ - start;
        stats_.bad_frames = bad_frames_ - bad_before;
        put_u64(static_cast<uint64_t>(loop_ns));
        put_u64(stats_.cycles);
        put_u64(stats_.max_gap);
        put_u64(stats_.rx_frames);
        put_u64(stats_.rx_bytes);
        put_u64(stats_.tx_frames);
        put_u64(stats_.tx_bytes);
        put_u64(stats_.bad_frames);
        put_u64(stopped_on_arp);
        put_u32(static_cast<uint32_t>(tx_out_.size()));
        for (const std::vector<uint8_t>& f : tx_out_) {
            put_u32(static_cast<uint32_t>(f.size()));
            reply_.insert(reply_.end(), f.begin(), f.end());
        }
        tx_out_.clear();
        return "";
    }

    void info() {
        for (const Clock& c : clocks_) put_u64(2 * c.half_ps);
        put_u32(static_cast<uint32_t>(counters_size_));
#if VM_TRACE
        put_u8(1);
#else
        put_u8(0);
#endif
    }

    std::unique_ptr<VerilatedContext> context_;
    std::unique_ptr<Vtop> top_;
#if VM_TRACE
    std::unique_ptr<TraceFile> trace_;
#endif
    Clock clocks_[3];
    uint64_t now_ps_ = 0, cycle_ = 0, quiet_ = 0, bad_frames_ = 0;
    size_t counters_size_ = 0;
    std::vector<uint8_t> last_counters_;
    RunStats stats_;

    // receive side
    std::deque<std::vector<uint8_t>> rx_queue_;
    std::vector<uint8_t> rx_wire_;
    size_t rx_at_ = 0, gap_left_ = 0;
    uint8_t rx_byte_ = INBAND_STATUS | INBAND_STATUS << 4;
    bool rx_en_ = false, rx_busy_ = false;

    // transmit side
    std::vector<uint8_t> tx_wire_;
    std::vector<std::vector<uint8_t>> tx_out_;
    uint8_t tx_low_ = 0;
    bool tx_en_ = false, tx_active_ = false, tx_error_ = false, tx_cycle_ = false;
    bool arp_seen_ = false;
    uint64_t udp_out_ = 0;   // UDP frames from the design in this run
};

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3) {
        std::fprintf(stderr, "usage: %s IN_FD OUT_FD [--waves FILE] [--clk-ps N] [--eth-ps N] "
                             "[--rgmii-ps N] [--rgmii-phase-ps N]\n", argv[0]);
        return 2;
    }
    init_crc32();
    int in_fd = std::atoi(argv[1]), out_fd = std::atoi(argv[2]);
    const char* waves = nullptr;
    uint64_t clk_ps = 8000, eth_ps = 16000, rgmii_ps = 8000, phase_ps = 0;
    for (int i = 3; i + 1 < argc; i += 2) {
        uint64_t v = std::strtoull(argv[i + 1], nullptr, 10);
        if (!std::strcmp(argv[i], "--waves")) waves = argv[i + 1];
        else if (!std::strcmp(argv[i], "--clk-ps")) clk_ps = v;
        else if (!std::strcmp(argv[i], "--eth-ps")) eth_ps = v;
        else if (!std::strcmp(argv[i], "--rgmii-ps")) rgmii_ps = v;
        else if (!std::strcmp(argv[i], "--rgmii-phase-ps")) phase_ps = v;
    }
    if (clk_ps < 2 || eth_ps < 2 || rgmii_ps < 2 || clk_ps % 2 || eth_ps % 2 || rgmii_ps % 2) {
        std::fprintf(stderr, "clock periods must be even numbers of picoseconds\n");
        return 2;
    }
    ::dup2(2, 1);
    Verilated::commandArgs(1, argv);
    int rc;
    {
        PhyHarness harness(in_fd, out_fd, waves, clk_ps, eth_ps, rgmii_ps, phase_ps);
        rc = harness.serve();
    }
    std::fflush(stderr);
    return rc;
}
