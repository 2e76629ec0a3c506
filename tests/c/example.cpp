// librdaq from C++ (the example of docs/api.md, compiled and run by tests/test_c_api.py):
// a receiver that owns its handle, frames that release themselves (RAII).
//
// usage: example FRAMES MAP_OUT
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "rdaq.h"

static void check(RdaqStatus s, const char *what) {
    if (s != RDAQ_STATUS_OK) throw std::runtime_error(std::string(what) + ": " + rdaq_last_error());
}

class Frame {
  public:
    Frame(uint64_t rx, const RdaqFrame &f) : rx_(rx), f_(f) {}
    Frame(const Frame &) = delete;
    Frame &operator=(const Frame &) = delete;
    ~Frame() { rdaq_release(rx_, f_.id); }
    uint64_t number() const { return f_.number; }
    bool complete() const { return f_.status == 0; }
    const uint16_t *pixels() const { return reinterpret_cast<const uint16_t *>(f_.data); }
    size_t count() const { return f_.len / 2; }

  private:
    uint64_t rx_;
    RdaqFrame f_;
};

class Receiver {
  public:
    explicit Receiver(const std::string &config) { check(rdaq_receiver_open(config.c_str(), &h_), "open"); }
    Receiver(const Receiver &) = delete;
    Receiver &operator=(const Receiver &) = delete;
    ~Receiver() { rdaq_receiver_close(h_); }
    std::string buffer_map() const {
        size_t needed = 0;
        rdaq_receiver_buffer_map(h_, nullptr, 0, &needed);
        std::string map(needed, '\0');
        check(rdaq_receiver_buffer_map(h_, map.data(), map.size(), nullptr), "buffer map");
        map.resize(needed - 1);
        return map;
    }
    // The next frame, or false when the receiver has finished.
    bool next(RdaqFrame &f, int64_t timeout_ms) {
        RdaqStatus s = rdaq_next_frame(h_, timeout_ms, &f);
        if (s == RDAQ_STATUS_FINISHED) return false;
        check(s, "next frame");
        return true;
    }
    uint64_t handle() const { return h_; }

  private:
    uint64_t h_ = 0;
};

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    long frames = std::atol(argv[1]);
    Receiver rx("modules = 1\nslots = 8\nframes = " + std::to_string(frames) + "\n");
    FILE *m = std::fopen(argv[2], "w");
    std::fputs(rx.buffer_map().c_str(), m);
    std::fclose(m);
    std::printf("READY\n");
    std::fflush(stdout);
    RdaqFrame f;
    long n = 0;
    while (rx.next(f, 30000)) {
        Frame frame(rx.handle(), f);
        // the mean raw word, read in place in the receiver's ring
        double sum = std::accumulate(frame.pixels(), frame.pixels() + frame.count(), 0.0);
        std::printf("frame %llu %s mean %.1f\n", (unsigned long long)frame.number(), frame.complete() ? "complete" : "incomplete", sum / frame.count());
        n++;
    }
    return n == frames ? 0 : 1;
}
