/* Who may join a job: the job secret, HMAC-SHA256 challenge-response proofs (OpenSSL's
 * libcrypto does the cryptography), the wire format of the handshakes and their parsers, and
 * the loopback rule for jobs without a secret. See docs/comm.md, "Trust model". */
#include "comm/comm_internal.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

ct_status cm_key_resolve(const char *fn, const char *secret, cm_key *k)
{
    memset(k, 0, sizeof *k);
    if (!secret) secret = getenv("CT_JOB_SECRET");
    if (!secret || !*secret) return CT_OK;
    size_t n = strlen(secret);
    if (n < CT_COMM_SECRET_MIN || n > CT_COMM_SECRET_MAX)
        return ct_error(CT_EINVAL,
                        "%s: the job secret (CT_JOB_SECRET or options .secret) must be %d..%d "
                        "bytes, got %zu",
                        fn, CT_COMM_SECRET_MIN, CT_COMM_SECRET_MAX, n);
    memcpy(k->k, secret, n);
    k->n = n;
    k->set = 1;
    return CT_OK;
}

void cm_key_wipe(cm_key *k)
{
    OPENSSL_cleanse(k, sizeof *k);
}

ct_status cm_random(void *buf, size_t n)
{
    if (RAND_bytes(buf, (int)n) != 1)
        return ct_error(CT_EIO, "comm: the system random generator failed (RAND_bytes)");
    return CT_OK;
}

ct_status ct_comm_secret_generate(char *buf, size_t cap)
{
    if (!buf || cap < 65)
        return ct_error(CT_EINVAL, "ct_comm_secret_generate: need a buffer of at least 65 bytes");
    unsigned char r[32];
    CT_TRY(cm_random(r, sizeof r));
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        buf[2 * i] = hex[r[i] >> 4];
        buf[2 * i + 1] = hex[r[i] & 15];
    }
    buf[64] = 0;
    OPENSSL_cleanse(r, sizeof r);
    return CT_OK;
}

void cm_mac(const cm_key *k, const char *label, const uint8_t *ns, const uint8_t *nc,
            const void *ctx, size_t ctx_len, uint8_t out[CM_MAC_BYTES])
{
    /* message = label NUL server-nonce client-nonce context */
    uint8_t msg[64 + 2 * CM_NONCE_BYTES + 600];
    size_t ll = strlen(label);
    size_t n = 0;
    memcpy(msg, label, ll + 1);
    n += ll + 1;
    memcpy(msg + n, ns, CM_NONCE_BYTES);
    n += CM_NONCE_BYTES;
    memcpy(msg + n, nc, CM_NONCE_BYTES);
    n += CM_NONCE_BYTES;
    if (ctx_len > sizeof msg - n) ctx_len = sizeof msg - n;
    if (ctx_len) memcpy(msg + n, ctx, ctx_len);
    n += ctx_len;
    unsigned int ol = CM_MAC_BYTES;
    static const unsigned char nokey[1] = {0};
    if (!HMAC(EVP_sha256(), k->set ? k->k : nokey, k->set ? (int)k->n : 0, msg, n, out, &ol))
        memset(out, 0, CM_MAC_BYTES); /* never matches a real proof: the peer is refused */
    OPENSSL_cleanse(msg, sizeof msg);
}

int cm_mac_equal(const uint8_t *a, const uint8_t *b)
{
    return CRYPTO_memcmp(a, b, CM_MAC_BYTES) == 0;
}

/* ---- wire format -------------------------------------------------------------------------- */

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

void cm_hs_write_challenge(uint8_t out[CM_HS_CHALLENGE_BYTES], uint32_t magic,
                           const uint8_t ns[CM_NONCE_BYTES])
{
    wr32(out, magic);
    wr32(out + 4, CM_HS_VERSION);
    memcpy(out + 8, ns, CM_NONCE_BYTES);
}

int cm_hs_parse_challenge(const uint8_t *buf, size_t n, uint32_t magic,
                          uint8_t ns[CM_NONCE_BYTES])
{
    if (n != CM_HS_CHALLENGE_BYTES || rd32(buf) != magic || rd32(buf + 4) != CM_HS_VERSION)
        return -1;
    memcpy(ns, buf + 8, CM_NONCE_BYTES);
    return 0;
}

void cm_hs_write_hello(uint8_t out[CM_HS_HELLO_BYTES], const cm_hello *h)
{
    wr32(out, CM_HS_RANK_MAGIC);
    wr32(out + 4, h->rank);
    memcpy(out + 8, h->nc, CM_NONCE_BYTES);
    memcpy(out + 8 + CM_NONCE_BYTES, h->mac, CM_MAC_BYTES);
}

int cm_hs_parse_hello(const uint8_t *buf, size_t n, cm_hello *h)
{
    if (n != CM_HS_HELLO_BYTES || rd32(buf) != CM_HS_RANK_MAGIC) return -1;
    h->rank = rd32(buf + 4);
    memcpy(h->nc, buf + 8, CM_NONCE_BYTES);
    memcpy(h->mac, buf + 8 + CM_NONCE_BYTES, CM_MAC_BYTES);
    return 0;
}

void cm_hs_rank_ctx(const char *prefix, uint32_t from, uint32_t to, uint8_t *ctx, size_t *len)
{
    size_t pl = strlen(prefix);
    if (pl > 512) pl = 512;
    wr32(ctx, from);
    wr32(ctx + 4, to);
    memcpy(ctx + 8, prefix, pl);
    *len = 8 + pl;
}

/* ---- addresses ---------------------------------------------------------------------------- */

int cm_ip_is_loopback(const char *host)
{
    if (!host || !*host) return 0;
    if (!strcmp(host, "localhost")) return 1;
    struct in_addr a;
    if (inet_pton(AF_INET, host, &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    /* A name: loopback when every address it resolves to is. */
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) return 0;
    int all = 1;
    for (struct addrinfo *p = res; p; p = p->ai_next)
        all &= (ntohl(((struct sockaddr_in *)p->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    freeaddrinfo(res);
    return all;
}

void cm_warn_no_secret(const char *where)
{
    ct_log(CT_LOG_WARN, "comm",
           "{\"event\":\"no_job_secret\",\"where\":\"%s\",\"msg\":\"no job secret "
           "(CT_JOB_SECRET): any local process may join this job; allowed only because every "
           "address is loopback\"}",
           where);
}

double cm_handshake_s(void)
{
    double s = cm_env_double("CT_COMM_HANDSHAKE_TIMEOUT", CM_HANDSHAKE_S);
    return s > 0 && s < 1e6 ? s : CM_HANDSHAKE_S;
}
