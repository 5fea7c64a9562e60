/* libFuzzer target: the safetensors header parser, with the data buffer made to fit.
 *
 * The input is the JSON header (or a whole safetensors file, whose header is taken out, so
 * the same seed corpus serves both targets). The harness reads the largest data_offsets end
 * with a lenient parse of its own and appends that many zero bytes (up to 1 MiB), so the
 * fuzzer spends its time on the header rules instead of on getting the file length right;
 * the resulting file then goes through the whole-loader checks of fuzz_safetensors.c. */
#ifndef CT_FUZZ_NO_ENTRY /* this file's entry point, not the included one's */
#define CT_FUZZ_HEADER_ENTRY
#define CT_FUZZ_NO_ENTRY
#endif
#include "fuzz_safetensors.c"

#include <jansson.h>

static size_t fuzz_data_len(const uint8_t *h, size_t n)
{
    json_t *root = json_loadb((const char *)h, n, JSON_DISABLE_EOF_CHECK, NULL);
    size_t end = 0;
    const char *k;
    json_t *v;
    if (json_is_object(root)) {
        json_object_foreach(root, k, v)
        {
            json_t *e = json_array_get(json_object_get(v, "data_offsets"), 1);
            if (json_is_integer(e) && json_integer_value(e) > 0 &&
                json_integer_value(e) <= (1 << 20) && (size_t)json_integer_value(e) > end)
                end = (size_t)json_integer_value(e);
        }
    }
    json_decref(root);
    return end;
}

static int fuzz_header_one(const uint8_t *data, size_t size)
{
    const uint8_t *h = data;
    size_t n = size;
    if (size >= 9 && data[8] == '{') { /* a whole file: take its header out */
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--)
            hl = hl << 8 | data[i];
        if (hl <= size - 8) {
            h = data + 8;
            n = (size_t)hl;
        }
    }
    size_t dn = fuzz_data_len(h, n);
    uint8_t *img = calloc(8 + n + dn + 1, 1);
    if (!img) return 0;
    for (int i = 0; i < 8; i++)
        img[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memcpy(img + 8, h, n);
    fuzz_safetensors_one(img, 8 + n + dn);
    free(img);
    return 0;
}

#ifdef CT_FUZZ_HEADER_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_header_one(data, size);
}
#endif
