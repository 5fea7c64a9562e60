/* libFuzzer target: the store protocol, both directions.
 *
 * First input byte: 0 = the bytes are frames from an authenticated client (the server's
 * frame parser and command handlers, with their caps); 1 = the bytes are a fresh,
 * unauthenticated connection (only the handshake proof may be read, which a fuzzer cannot
 * forge); 2 = the bytes are a server's reply to a GET (the client's reply parser, which must
 * refuse lengths over one value). Invariants checked inside: the server never buffers more
 * than CT_STORE_MAX_CLIENT_BYTES for the client; nothing crashes, leaks or over-reads. */
#include "comm/comm_internal.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 3) {
    case 0:
        cm_store_fuzz_feed(p, n, 1);
        break;
    case 1:
        if (cm_store_fuzz_feed(p, n, 0) > CM_HS_CHALLENGE_BYTES) __builtin_trap(); /* no proof */
        break;
    default:
        cm_store_fuzz_reply(p, n);
        break;
    }
    return 0;
}
