/* librdaq's acquisition from C (tests/test_c_api.py builds and runs it): checks that misuse
 * returns errors, then runs the acquisition a configuration file describes (the emulated
 * detector's, processed) and writes each processed frame to a file (frame number, pixel
 * type, width, height, spots, then the pixels as the files hold them) for the test to
 * compare with the NXmx file, and prints the summary.
 *
 * usage: acquire CONFIG FRAMES_OUT */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rdaq.h"
#include "expect.h"

static void misuse(void) {
    uint64_t h = 0;
    RdaqImage img;
    EXPECT(rdaq_acquisition_open(NULL, NULL, &h) == RDAQ_STATUS_NULL, "a null config");
    EXPECT(rdaq_acquisition_open("", NULL, NULL) == RDAQ_STATUS_NULL, "a null handle");
    EXPECT(rdaq_acquisition_open("[process]\nveto = \"yes\"\n", NULL, &h) == RDAQ_STATUS_CONFIG, "a bad field");
    EXPECT(strstr(rdaq_last_error(), "process.veto") != NULL, "the message names the field");
    EXPECT(rdaq_acquisition_open("", "lnk = \"10g\"\n", &h) == RDAQ_STATUS_CONFIG, "a bad source field");
    EXPECT(strstr(rdaq_last_error(), "source") != NULL && strstr(rdaq_last_error(), "lnk") != NULL, "the message names it");
    EXPECT(rdaq_acquisition_open("[process]\nmode = \"raw\"\n", NULL, &h) == RDAQ_STATUS_START, "raw frames are a receiver's");
    EXPECT(rdaq_acquisition_next(987654321, 0, &img) == RDAQ_STATUS_BAD_HANDLE, "a wrong handle");
    EXPECT(rdaq_acquisition_release(987654321, 1) == RDAQ_STATUS_BAD_HANDLE, "a wrong handle");
    EXPECT(rdaq_acquisition_close(987654321) == RDAQ_STATUS_BAD_HANDLE, "closing a wrong handle");
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc((size_t)n + 1, 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        text = NULL;
    }
    fclose(f);
    return text;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: acquire CONFIG FRAMES_OUT\n");
        return 2;
    }
    misuse();
    char *config = slurp(argv[1]);
    if (!config) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    uint64_t h = 0;
    if (rdaq_acquisition_open(config, NULL, &h) != RDAQ_STATUS_OK) {
        fprintf(stderr, "open: %s\n", rdaq_last_error());
        return 1;
    }
    free(config);
    uint16_t ports[4];
    size_t count = 99;
    EXPECT(rdaq_acquisition_ports(h, ports, 4, &count) == RDAQ_STATUS_OK && count == 0, "the emulated detector has no ports");
    char small[4];
    EXPECT(rdaq_acquisition_summary(h, small, sizeof small, NULL) == RDAQ_STATUS_RUNNING, "no summary while running");
    FILE *out = fopen(argv[2], "wb");
    if (!out) return 2;
    RdaqImage img;
    RdaqStatus s;
    int frames = 0;
    while ((s = rdaq_acquisition_next(h, -1, &img)) == RDAQ_STATUS_OK) {
        /* bytes per pixel of each pixel type (rdaq.h) */
        static const size_t item[] = {2, 4, 4, 1, 2, 4};
        EXPECT(img.pixel >= 0 && img.pixel <= 5, "frame %llu: pixel type %d", (unsigned long long)img.number, (int)img.pixel);
        if (img.pixel < 0 || img.pixel > 5) break;
        EXPECT(img.len == (size_t)img.width * img.height * item[img.pixel], "frame %llu: %zu bytes", (unsigned long long)img.number, img.len);
        fwrite(&img.number, sizeof img.number, 1, out);
        fwrite(&img.pixel, sizeof img.pixel, 1, out);
        fwrite(&img.width, sizeof img.width, 1, out);
        fwrite(&img.height, sizeof img.height, 1, out);
        fwrite(&img.spots, sizeof img.spots, 1, out);
        fwrite(img.data, 1, img.len, out);
        EXPECT(rdaq_acquisition_release(h, img.id) == RDAQ_STATUS_OK, "release");
        EXPECT(rdaq_acquisition_release(h, img.id) == RDAQ_STATUS_BAD_FRAME, "a double release");
        frames++;
    }
    fclose(out);
    EXPECT(s == RDAQ_STATUS_FINISHED, "the end: status %d", (int)s);
    size_t needed = 0;
    EXPECT(rdaq_acquisition_summary(h, small, sizeof small, &needed) == RDAQ_STATUS_BUFFER && needed > sizeof small, "a small buffer");
    char *summary = malloc(needed);
    EXPECT(summary && rdaq_acquisition_summary(h, summary, needed, NULL) == RDAQ_STATUS_OK, "the summary");
    if (summary) printf("SUMMARY %s\n", summary);
    free(summary);
    EXPECT(rdaq_acquisition_close(h) == RDAQ_STATUS_OK, "close");
    EXPECT(rdaq_acquisition_close(h) == RDAQ_STATUS_BAD_HANDLE, "a closed handle");
    printf("OK %d frames, %d failures\n", frames, failures);
    return failures ? 1 : 0;
}
