/* librdaq's C test program (tests/test_c_api.py builds and runs it): checks that misuse
 * returns errors, then receives the frames an emulator sends and writes them to a file
 * (frame number, then the raw words) for the test to hash against the emulator's manifest.
 *
 * usage: receive FRAMES MODULES MAP_OUT FRAMES_OUT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdaq.h"
#include "expect.h"

static void misuse(void) {
    uint64_t h = 0;
    RdaqFrame f;
    EXPECT(rdaq_receiver_open(NULL, &h) == RDAQ_STATUS_NULL, "a null config");
    EXPECT(strstr(rdaq_last_error(), "config") != NULL, "the message names the argument");
    EXPECT(rdaq_receiver_open("modules = 1", NULL) == RDAQ_STATUS_NULL, "a null handle");
    EXPECT(rdaq_receiver_open("modulez = 1", &h) == RDAQ_STATUS_CONFIG, "an unknown field");
    EXPECT(strstr(rdaq_last_error(), "modulez") != NULL, "the message names the field");
    EXPECT(rdaq_receiver_open("policy = \"sometimes\"", &h) == RDAQ_STATUS_CONFIG, "a bad policy");
    EXPECT(rdaq_next_frame(987654321, 0, &f) == RDAQ_STATUS_BAD_HANDLE, "a wrong handle");
    EXPECT(rdaq_release(987654321, 1) == RDAQ_STATUS_BAD_HANDLE, "a wrong handle");
    EXPECT(rdaq_receiver_close(987654321) == RDAQ_STATUS_BAD_HANDLE, "closing a wrong handle");
    EXPECT(rdaq_counters(987654321, NULL) == RDAQ_STATUS_NULL, "null checked first");
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: receive FRAMES MODULES MAP_OUT FRAMES_OUT\n");
        return 2;
    }
    long frames = atol(argv[1]), modules = atol(argv[2]);
    misuse();

    char config[256];
    snprintf(config, sizeof config, "modules = %ld\nframes = %ld\nslots = 8\n", modules, frames);
    uint64_t rx;
    if (rdaq_receiver_open(config, &rx) != RDAQ_STATUS_OK) {
        fprintf(stderr, "open: %s\n", rdaq_last_error());
        return 1;
    }
    RdaqFrame f;
    EXPECT(rdaq_next_frame(rx, 0, NULL) == RDAQ_STATUS_NULL, "a null frame");
    EXPECT(rdaq_next_frame(rx, 10, &f) == RDAQ_STATUS_TIMEOUT, "nothing sent yet");

    size_t needed = 0;
    EXPECT(rdaq_receiver_buffer_map(rx, NULL, 0, &needed) == RDAQ_STATUS_NULL && needed > 1, "the size of the map");
    char small[4];
    EXPECT(rdaq_receiver_buffer_map(rx, small, sizeof small, &needed) == RDAQ_STATUS_BUFFER, "a buffer too small");
    char *map = malloc(needed);
    EXPECT(rdaq_receiver_buffer_map(rx, map, needed, NULL) == RDAQ_STATUS_OK, "the map");
    FILE *mf = fopen(argv[3], "w");
    fputs(map, mf);
    fclose(mf);
    free(map);
    printf("READY\n");
    fflush(stdout);

    FILE *out = fopen(argv[4], "wb");
    size_t pixels = (size_t)modules * 512 * 1024;
    uint8_t *mask = malloc(pixels);
    long got = 0;
    RdaqStatus s;
    while ((s = rdaq_next_frame(rx, 30000, &f)) == RDAQ_STATUS_OK) {
        EXPECT(f.status == 0 && f.len == pixels * 2 && f.modules == modules, "frame %llu complete, whole", (unsigned long long)f.number);
        EXPECT(rdaq_frame_missing(rx, f.id, mask, pixels - 1) == RDAQ_STATUS_BUFFER, "a mask too small");
        EXPECT(rdaq_frame_missing(rx, f.id, mask, pixels) == RDAQ_STATUS_OK, "the mask");
        size_t missing = 0;
        for (size_t i = 0; i < pixels; i++) missing += mask[i];
        EXPECT(missing == 0, "nothing missing in a complete frame");
        fwrite(&f.number, sizeof f.number, 1, out);
        fwrite(f.data, 1, f.len, out);
        EXPECT(rdaq_release(rx, f.id) == RDAQ_STATUS_OK, "release");
        EXPECT(rdaq_release(rx, f.id) == RDAQ_STATUS_BAD_FRAME, "a second release");
        EXPECT(rdaq_frame_missing(rx, f.id, mask, pixels) == RDAQ_STATUS_BAD_FRAME, "a released frame");
        got++;
    }
    fclose(out);
    free(mask);
    EXPECT(s == RDAQ_STATUS_FINISHED, "the receiver finished (status %d)", s);
    RdaqCounters c;
    EXPECT(rdaq_counters(rx, &c) == RDAQ_STATUS_OK && c.frames_complete == (uint64_t)frames && c.dropped == 0, "the counters");
    EXPECT(rdaq_receiver_close(rx) == RDAQ_STATUS_OK, "close");
    EXPECT(rdaq_receiver_close(rx) == RDAQ_STATUS_BAD_HANDLE, "a second close");
    EXPECT(rdaq_next_frame(rx, 0, &f) == RDAQ_STATUS_BAD_HANDLE, "a closed receiver");
    printf("OK %ld frames, %d failures\n", got, failures);
    return failures == 0 && got == frames ? 0 : 1;
}
