// The harness side of the request/reply pipes, shared by the engine tops' harness
// (harness.cpp) and the network top's PHY harness (phy.cpp); the host side is
// sim/harness/child.py.
//
// Protocol (little-endian): a request is one opcode byte and its fields; a reply is a
// status byte, 0 (ok) or 1 (error), a u64 length and that many bytes: the answer, or the
// error message. A harness derives from RequestPipe, reads a request's fields with
// read_u8/u32/u64 (exiting quietly when the host went away mid-request), appends its answer
// with put_*, and runs `serve` with its opcode handler.

#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

class RequestPipe {
public:
    RequestPipe(int in_fd, int out_fd) : in_fd_(in_fd), out_fd_(out_fd) {}

    // Answers requests until the host closes its pipe (0), `handle` sets `close` (0), or
    // the reply pipe breaks (3). `handle(op, close)` returns an error message, or "".
    template <typename Handler> int serve(Handler&& handle) {
        for (;;) {
            uint8_t op;
            if (!read_exact(&op, 1)) return 0;   // the host went away: end quietly
            reply_.clear();
            bool close = false;
            std::string error = handle(op, close);
            if (!error.empty()) reply_.assign(error.begin(), error.end());
            uint8_t head[9];
            head[0] = error.empty() ? 0 : 1;
            uint64_t length = reply_.size();
            std::memcpy(head + 1, &length, 8);
            if (!write_all(head, sizeof head) || !write_all(reply_.data(), reply_.size())) {
                return 3;
            }
            if (close) return 0;
        }
    }

protected:
    // Buffered: a request of many small frames costs a few large reads, not two per frame.
    bool read_exact(void* to, size_t n) {
        uint8_t* p = static_cast<uint8_t*>(to);
        for (;;) {
            size_t have = in_end_ - in_at_;
            size_t take = have < n ? have : n;
            std::memcpy(p, in_buf_.data() + in_at_, take);
            in_at_ += take;
            p += take;
            n -= take;
            if (!n) return true;
            if (n >= in_buf_.size()) {   // a large frame: straight into its place
                ssize_t got = ::read(in_fd_, p, n);
                if (got < 0 && errno == EINTR) continue;
                if (got <= 0) return false;
                p += got;
                n -= static_cast<size_t>(got);
                if (!n) return true;
                continue;
            }
            ssize_t got = ::read(in_fd_, in_buf_.data(), in_buf_.size());
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) return false;
            in_at_ = 0;
            in_end_ = static_cast<size_t>(got);
        }
    }

    template <typename T> T read_le() {
        T v;
        if (!read_exact(&v, sizeof v)) std::exit(0);   // the host went away mid-request
        return v;
    }
    uint8_t read_u8() { return read_le<uint8_t>(); }
    uint32_t read_u32() { return read_le<uint32_t>(); }
    uint64_t read_u64() { return read_le<uint64_t>(); }

    template <typename T> void put_le(T v) {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
        reply_.insert(reply_.end(), p, p + sizeof v);
    }
    void put_u8(uint8_t v) { reply_.push_back(v); }
    void put_u32(uint32_t v) { put_le(v); }
    void put_u64(uint64_t v) { put_le(v); }
    void put_i64(int64_t v) { put_le(v); }

    std::vector<uint8_t> reply_;   // the answer being built

private:
    bool write_all(const void* from, size_t n) {
        const uint8_t* p = static_cast<const uint8_t*>(from);
        while (n) {
            ssize_t put = ::write(out_fd_, p, n);
            if (put < 0 && errno == EINTR) continue;
            if (put <= 0) return false;
            p += put;
            n -= static_cast<size_t>(put);
        }
        return true;
    }

    int in_fd_, out_fd_;
    std::vector<uint8_t> in_buf_ = std::vector<uint8_t>(1 << 20);
    size_t in_at_ = 0, in_end_ = 0;
};
