/* libFuzzer target: ct_token_ids_parse (the ids of `ctorch generate --prompt-ids`).
 *
 * The first two bytes pick the vocabulary size (1 .. 65536, or 2^31 when both are 0xff); the
 * rest is the text. On success every id is in range, there are at most len / 2 + 1 of them,
 * and writing them back with single spaces parses to the same ids. */
#include "ctorch/ctorch.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int64_t vocab = data[0] == 0xff && data[1] == 0xff ? (INT64_C(1) << 31)
                                                         : 1 + (int64_t)(data[0] | data[1] << 8);
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    int32_t *ids = NULL;
    int64_t n = -1;
    if (ct_token_ids_parse(text, len, vocab, &ids, &n) != CT_OK) {
        if (ids || n != 0) abort();
        return 0;
    }
    if (n < 0 || (size_t)n > len / 2 + 1 || (n == 0) != (ids == NULL)) abort();
    char *back = malloc((size_t)n * 12 + 1);
    size_t bl = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) abort();
        bl += (size_t)snprintf(back + bl, 13, i ? " %d" : "%d", ids[i]);
    }
    int32_t *again = NULL;
    int64_t m = -1;
    if (ct_token_ids_parse(back, bl, vocab, &again, &m) != CT_OK || m != n ||
        (n && memcmp(ids, again, (size_t)n * sizeof *ids) != 0))
        abort();
    free(back);
    ct_free(ids);
    ct_free(again);
    return 0;
}
