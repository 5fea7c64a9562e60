/* libFuzzer target: device names (ct_device_parse: "cpu", "cuda", "cuda:N" with N a decimal in
 * [0, 1024) without leading zeros) against a reference written here: any byte string either
 * parses to the reference's kind and index or is refused with a message naming the accepted
 * forms; never a crash, a read past the string, or an index outside the range. */
#include "ctorch/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_device_parse: invariant failed: %s\n", #c);                      \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* 0 cpu, 1 cuda (index in *idx), -1 refused */
static int reference(const char *s, int *idx)
{
    *idx = 0;
    if (!strcmp(s, "cpu")) return 0;
    if (!strcmp(s, "cuda")) return 1;
    if (strncmp(s, "cuda:", 5)) return -1;
    const char *d = s + 5;
    size_t n = strlen(d);
    if (n < 1 || n > 4 || (n > 1 && d[0] == '0')) return -1;
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] < '0' || d[i] > '9') return -1;
        v = v * 10 + (d[i] - '0');
    }
    if (v >= 1024) return -1;
    *idx = v;
    return 1;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
    if (size > 64) return 0;
    char *s = malloc(size + 1);
    if (!s) return 0;
    memcpy(s, data, size);
    s[size] = 0; /* the API takes a C string: bytes after a NUL are not part of it */
    ct_device_options o = ct_device_options_default();
    o.index = 77;
    ct_status st = ct_device_parse(s, &o);
    int idx, want = reference(s, &idx);
    if (want < 0) {
        FUZZ_REQUIRE(st == CT_EINVAL);
        FUZZ_REQUIRE(strstr(ct_last_error(), "cuda:N") != NULL);
    } else {
        FUZZ_REQUIRE(st == CT_OK);
        FUZZ_REQUIRE((int)o.kind == (want ? CT_DEVICE_CUDA : CT_DEVICE_CPU));
        FUZZ_REQUIRE(o.index == idx && o.index >= 0 && o.index < 1024);
    }
    free(s);
    return 0;
}
