/* libFuzzer target: the compile cache's entry loader (src/jit/compile.c, jit_cache_read and
 * jit_cache_verify): the checksum file's text and the shared object's bytes as they lie in the
 * cache dir, which is opened once (jit_open_cache_dir) as in the library. Input: a flags byte,
 * a 2-byte little-endian length L, L bytes of the .sum file, the rest the .so. Flags: 1 no
 * .sum, 2 no .so, 4 the .sum's first three lines made right for these bytes (what the library
 * writes; the fuzzer's text follows), 8 the .so a link to the .sum, 16 the files writable by
 * others, 32 the .so a FIFO. The loader must never read through a link, block on a FIFO or
 * accept a loose file; what it accepts is byte for byte what lies there under a checksum that
 * names it, and a right entry is always accepted. Nothing is dlopen()ed here. */
#include "jit/jit_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int g_dfd = -1;
static char g_path[] = "/tmp/ctorch-fuzz-jit-cache-XXXXXX";
static const char *KEY = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static void put(const char *name, const void *data, size_t n, int mode)
{
    int fd = openat(g_dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) abort();
    if (n && write(fd, data, n) != (ssize_t)n) abort();
    if (fchmod(fd, (mode_t)mode) != 0) abort(); /* whatever the umask */
    close(fd);
}

static void remove_dir(void)
{
    rmdir(g_path); /* every input removes its files */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_dfd < 0) {
        if (!mkdtemp(g_path) || jit_open_cache_dir("fuzz", g_path, &g_dfd) != CT_OK) abort();
        atexit(remove_dir);
    }
    if (size < 3) return 0;
    int flags = data[0];
    size_t sl = (size_t)data[1] | (size_t)data[2] << 8;
    if (sl > size - 3) sl = size - 3;
    const uint8_t *sum = data + 3, *so = sum + sl;
    size_t ol = size - 3 - sl;
    char sname[80], oname[80];
    snprintf(sname, sizeof sname, "%s.sum", KEY);
    snprintf(oname, sizeof oname, "%s.so", KEY);
    int mode = flags & 16 ? 0666 : 0600;
    /* the sum as the library writes it, for these bytes, then the fuzzer's text */
    uint8_t *right = NULL;
    size_t rl = 0;
    if (flags & 4) {
        uint8_t d[32];
        jit_sha256(so, ol, d);
        char head[256];
        int n = snprintf(head, sizeof head, "sha256 ");
        for (int i = 0; i < 32; i++)
            n += snprintf(head + n, sizeof head - (size_t)n, "%02x", d[i]);
        n += snprintf(head + n, sizeof head - (size_t)n, "\nsize %zu\nkey %s\n", ol, KEY);
        right = malloc((size_t)n + sl + 1);
        if (!right) return 0;
        memcpy(right, head, (size_t)n);
        memcpy(right + n, sum, sl);
        rl = (size_t)n + sl;
        sum = right;
        sl = rl;
    }
    if (!(flags & 1)) put(sname, sum, sl, mode);
    bool plain_so = false;
    if (!(flags & 2)) {
        if (flags & 8) {
            if (symlinkat(sname, g_dfd, oname) != 0) abort();
        } else if (flags & 32) {
            if (mkfifoat(g_dfd, oname, 0600) != 0) abort();
        } else {
            put(oname, so, ol, mode);
            plain_so = true;
        }
    }
    uint8_t *got = NULL;
    size_t gl = 0;
    ct_status s = jit_cache_read(g_dfd, KEY, &got, &gl);
    bool sane = !(flags & (1 | 2 | 8 | 16 | 32));
    if (s == CT_OK) {
        /* accepted: only plain files of ours, exactly the bytes there, under a checksum of them */
        if (!sane || !plain_so || gl != ol || (ol && memcmp(got, so, ol) != 0)) abort();
        if (jit_cache_verify(KEY, sum, sl, got, gl) != CT_OK) abort();
    } else {
        if (s != CT_EIO && s != CT_EFORMAT) abort();
        if (s == CT_EIO && !((flags & 1) && (flags & 2))) abort(); /* "absent" only when it is */
        if (sane && (flags & 4) && sl <= 4096) abort(); /* a right entry (of a sane size) is taken */
    }
    ct_free(got);
    free(right);
    unlinkat(g_dfd, sname, 0);
    unlinkat(g_dfd, oname, 0);
    return 0;
}
