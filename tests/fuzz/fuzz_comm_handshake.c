/* libFuzzer target: the parsers of the rank and store handshakes (challenge, hello), and a
 * hello checked against a fixed key the way a rank listener checks it: a fuzzer must never
 * produce an accepted proof, and a parse must never read past its input. */
#include "comm/comm_internal.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copies of exactly `size` bytes so ASan catches any read past the message. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    uint8_t ns[CM_NONCE_BYTES];
    if (cm_hs_parse_challenge(buf, size, CM_HS_RANK_MAGIC, ns) == 0 &&
        size != CM_HS_CHALLENGE_BYTES)
        __builtin_trap();
    cm_hs_parse_challenge(buf, size, CM_HS_STORE_MAGIC, ns);
    cm_hello h;
    if (cm_hs_parse_hello(buf, size, &h) == 0) {
        if (size != CM_HS_HELLO_BYTES) __builtin_trap();
        static const char secret[] = "fuzz-secret-0123456789";
        cm_key k;
        if (cm_key_resolve("fuzz", secret, &k) == CT_OK) {
            uint8_t fixed_ns[CM_NONCE_BYTES] = {1, 2, 3}, ctx[520], want[CM_MAC_BYTES];
            size_t cl;
            cm_hs_rank_ctx("ctc/fuzz/1", h.rank, 0, ctx, &cl);
            cm_mac(&k, "ctorch rank hello v1", fixed_ns, h.nc, ctx, cl, want);
            if (cm_mac_equal(want, h.mac)) __builtin_trap(); /* a forged proof was accepted */
        }
    }
    /* The same bytes as the start of an unauthenticated store connection. */
    if (cm_store_fuzz_feed(buf, size, 0) > CM_HS_CHALLENGE_BYTES) __builtin_trap();
    free(buf);
    return 0;
}
