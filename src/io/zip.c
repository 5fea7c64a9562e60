/* A strict reader of stored (uncompressed) zip archives, as torch.save writes them: the end
 * of central directory (zip64 too), the central directory, every local header, data
 * descriptors. It reads an image in memory and never allocates by a size the file states
 * before checking that the file holds that much. */
#include "core/internal.h"
#include "io/io_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOCATOR 0x07064b50u
#define SIG_DESCRIPTOR 0x08074b50u

static uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static ct_status
zfail(ct_status code, const char *label, const char *rule, const char *fmt, ...)
{
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct_error(code, "pt [zip-%s]: %s: %s", rule, label, msg);
}

/* ---- CRC-32 --------------------------------------------------------------------------- */

static uint32_t crc_table[8][256];
static int crc_ready;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
    __atomic_store_n(&crc_ready, 1, __ATOMIC_RELEASE);
}

uint32_t ct_crc32(uint32_t crc, const void *data, size_t n)
{
    if (!__atomic_load_n(&crc_ready, __ATOMIC_ACQUIRE)) crc_init(); /* idempotent */
    const uint8_t *p = data;
    crc = ~crc;
    while (n >= 8) { /* slicing by 8 */
        uint32_t a = crc ^ rd32(p), b = rd32(p + 4);
        crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^
              crc_table[5][(a >> 16) & 0xFF] ^ crc_table[4][a >> 24] ^ crc_table[3][b & 0xFF] ^
              crc_table[2][(b >> 8) & 0xFF] ^ crc_table[1][(b >> 16) & 0xFF] ^
              crc_table[0][b >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* ---- the archive ---------------------------------------------------------------------- */

typedef struct extent {
    uint64_t begin, end; /* local header .. end of data (and descriptor) */
    size_t member;
} extent;

static int cmp_extent(const void *a, const void *b)
{
    const extent *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

static _Thread_local const ct_zip_member *sort_members;
static int cmp_member_name(const void *a, const void *b)
{
    return strcmp(sort_members[*(const size_t *)a].name, sort_members[*(const size_t *)b].name);
}

/* Parse the zip64 extended-information extra field of one header: the fields whose 32-bit
 * value is the 0xFFFFFFFF sentinel, in the order usize, csize, offset. */
static ct_status zip64_extra(const char *label, const char *name, const uint8_t *x, size_t xl,
                             uint64_t *usize, uint64_t *csize, uint64_t *lho, bool local)
{
    size_t i = 0;
    bool need = *usize == 0xFFFFFFFFu || *csize == 0xFFFFFFFFu || (lho && *lho == 0xFFFFFFFFu);
    bool found = false;
    while (i < xl) {
        if (xl - i < 4)
            return zfail(CT_EFORMAT, label, "extra",
                         "member '%s': its extra field ends in the middle of a block header", name);
        uint16_t id = rd16(x + i), len = rd16(x + i + 2);
        if (len > xl - i - 4)
            return zfail(CT_EFORMAT, label, "extra",
                         "member '%s': extra block 0x%04x of %u bytes runs past the extra field",
                         name, id, len);
        if (id == 0x0001 && !found) {
            found = true;
            const uint8_t *q = x + i + 4;
            size_t left = len;
            uint64_t *f[3] = {usize, csize, lho};
            for (int k = 0; k < 3; k++) {
                if (!f[k]) continue;
                /* A local header's zip64 block holds both sizes whenever it is there. */
                if (*f[k] != 0xFFFFFFFFu && !(local && k < 2)) continue;
                if (left < 8)
                    return zfail(CT_EFORMAT, label, "zip64",
                                 "member '%s': a size or offset is 0xFFFFFFFF but the zip64 "
                                 "extra field does not hold it",
                                 name);
                *f[k] = rd64(q);
                q += 8;
                left -= 8;
            }
        }
        i += 4 + (size_t)len;
    }
    if (need && !found)
        return zfail(CT_EFORMAT, label, "zip64",
                     "member '%s': a size or offset is 0xFFFFFFFF but there is no zip64 extra "
                     "field",
                     name);
    return CT_OK;
}

void ct_zip_close(ct_zip *z)
{
    if (!z) return;
    ct_free(z->members);
    ct_free(z->names);
    memset(z, 0, sizeof *z);
}

const ct_zip_member *ct_zip_find(const ct_zip *z, const char *name)
{
    for (size_t i = 0; i < z->count; i++)
        if (strcmp(z->members[i].name, name) == 0) return &z->members[i];
    return NULL;
}

ct_status ct_zip_open(const char *label, const uint8_t *b, size_t size, ct_zip *z)
{
    memset(z, 0, sizeof *z);
    if (size < 22)
        return zfail(CT_EFORMAT, label, "eocd",
                     "%zu bytes cannot hold a zip end of central directory (22 bytes)", size);
    /* The end of central directory: the last signature whose comment ends the file. */
    size_t eocd = (size_t)-1;
    size_t lo = size > 22 + 65535 ? size - 22 - 65535 : 0;
    for (size_t p = size - 22 + 1; p-- > lo;) {
        if (rd32(b + p) == SIG_EOCD && p + 22 + rd16(b + p + 20) == size) {
            eocd = p;
            break;
        }
    }
    if (eocd == (size_t)-1)
        return zfail(CT_EFORMAT, label, "eocd",
                     "no end of central directory record ends the file (truncated, or bytes "
                     "appended after the archive?)");
    const uint8_t *e = b + eocd;
    uint64_t n_disk = rd16(e + 8), n = rd16(e + 10), cd_size = rd32(e + 12), cd_off = rd32(e + 16);
    if (rd16(e + 4) != 0 || rd16(e + 6) != 0 || n_disk != n)
        return zfail(CT_EFORMAT, label, "eocd", "multi-disk archives are not supported");
    uint64_t cd_limit = eocd; /* the central directory ends before this */
    if (eocd >= 20 && rd32(b + eocd - 20) == SIG_LOCATOR) {
        const uint8_t *l = b + eocd - 20;
        uint64_t off64 = rd64(l + 8);
        if (rd32(l + 4) != 0 || rd32(l + 16) > 1)
            return zfail(CT_EFORMAT, label, "zip64", "multi-disk zip64 archives are not supported");
        if (off64 > eocd - 20 || eocd - 20 - off64 < 56)
            return zfail(CT_EFORMAT, label, "zip64",
                         "the zip64 end of central directory at offset %llu is not inside the "
                         "file before its locator (at %zu)",
                         (unsigned long long)off64, eocd - 20);
        const uint8_t *r = b + off64;
        if (rd32(r) != SIG_EOCD64)
            return zfail(CT_EFORMAT, label, "zip64",
                         "no zip64 end of central directory signature at offset %llu",
                         (unsigned long long)off64);
        uint64_t rec = rd64(r + 4);
        if (rec < 44 || rec > eocd - 20 - off64 - 12)
            return zfail(CT_EFORMAT, label, "zip64",
                         "the zip64 end of central directory claims %llu bytes, which do not "
                         "fit before its locator",
                         (unsigned long long)rec);
        uint64_t n64d = rd64(r + 24), n64 = rd64(r + 32), s64 = rd64(r + 40), o64 = rd64(r + 48);
        if (rd32(r + 16) != 0 || rd32(r + 20) != 0 || n64d != n64)
            return zfail(CT_EFORMAT, label, "zip64", "multi-disk zip64 archives are not supported");
        /* The 32-bit fields must be the sentinel or agree with the zip64 ones. */
        if ((n != 0xFFFF && n != n64) || (cd_size != 0xFFFFFFFFu && cd_size != s64) ||
            (cd_off != 0xFFFFFFFFu && cd_off != o64))
            return zfail(CT_EFORMAT, label, "zip64",
                         "the end of central directory (%llu members, %llu bytes at %llu) and "
                         "its zip64 record (%llu members, %llu bytes at %llu) disagree",
                         (unsigned long long)n, (unsigned long long)cd_size,
                         (unsigned long long)cd_off, (unsigned long long)n64,
                         (unsigned long long)s64, (unsigned long long)o64);
        n = n64;
        cd_size = s64;
        cd_off = o64;
        cd_limit = off64;
    } else if (n == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        /* Sentinels without a zip64 record: take them at face value (they are checked). */
    }
    if (cd_off > cd_limit || cd_size > cd_limit - cd_off)
        return zfail(CT_EFORMAT, label, "cd",
                     "the central directory (%llu bytes at offset %llu) does not lie before the "
                     "end record (at %llu)",
                     (unsigned long long)cd_size, (unsigned long long)cd_off,
                     (unsigned long long)cd_limit);
    if (n > cd_size / 46)
        return zfail(CT_EFORMAT, label, "cd",
                     "%llu members cannot fit a central directory of %llu bytes",
                     (unsigned long long)n, (unsigned long long)cd_size);
    ct_status s;
    extent *ext = NULL;
    size_t *order = NULL;
    size_t count = (size_t)n;
    if ((s = ct_calloc((void **)&z->members, (count ? count : 1) * sizeof *z->members)) ||
        (s = ct_calloc((void **)&ext, (count ? count : 1) * sizeof *ext)) ||
        (s = ct_alloc((void **)&order, (count ? count : 1) * sizeof *order)) ||
        (s = ct_alloc((void **)&z->names, (size_t)cd_size + 1)))
        goto fail;
    z->count = count;
    uint64_t p = cd_off, names_used = 0;
    for (size_t i = 0; i < count; i++) {
        if (cd_off + cd_size - p < 46 || rd32(b + p) != SIG_CENTRAL) {
            s = zfail(CT_EFORMAT, label, "cd",
                      "central directory entry %zu at offset %llu is missing or truncated", i,
                      (unsigned long long)p);
            goto fail;
        }
        const uint8_t *c = b + p;
        uint16_t flags = rd16(c + 8), method = rd16(c + 10), nl = rd16(c + 28), xl = rd16(c + 30),
                 cl = rd16(c + 32);
        uint32_t crc = rd32(c + 16);
        uint64_t csize = rd32(c + 20), usize = rd32(c + 24), lho = rd32(c + 42);
        if (46 + (uint64_t)nl + xl + cl > cd_off + cd_size - p) {
            s = zfail(CT_EFORMAT, label, "cd",
                      "central directory entry %zu runs past the central directory", i);
            goto fail;
        }
        char *name = z->names + names_used;
        memcpy(name, c + 46, nl);
        name[nl] = '\0';
        names_used += (uint64_t)nl + 1;
        char q[96];
        const char *qn = ct_io_quote(q, sizeof q, name);
        if (memchr(c + 46, 0, nl)) {
            s = zfail(CT_EFORMAT, label, "name", "member %zu's name holds a NUL byte", i);
            goto fail;
        }
        if ((s = zip64_extra(label, qn, c + 46 + nl, xl, &usize, &csize, &lho, false))) goto fail;
        if (rd16(c + 34) != 0 && rd16(c + 34) != 0xFFFF) {
            s = zfail(CT_EFORMAT, label, "eocd", "member '%s' lies on another disk", qn);
            goto fail;
        }
        if (flags & 0x41) {
            s = zfail(CT_EUNSUPPORTED, label, "encrypted", "member '%s' is encrypted", qn);
            goto fail;
        }
        if (method != 0) {
            s = zfail(CT_EUNSUPPORTED, label, "compressed",
                      "member '%s' is compressed (method %u): torch.save stores members "
                      "uncompressed, and ctorch maps them without decompressing",
                      qn, method);
            goto fail;
        }
        if (csize != usize) {
            s = zfail(CT_EFORMAT, label, "size",
                      "member '%s' is stored but its sizes differ (%llu stored, %llu "
                      "uncompressed)",
                      qn, (unsigned long long)csize, (unsigned long long)usize);
            goto fail;
        }
        /* Its local header. */
        if (lho > cd_off || cd_off - lho < 30 || rd32(b + lho) != SIG_LOCAL) {
            s = zfail(CT_EFORMAT, label, "out-of-file",
                      "member '%s': no local header at offset %llu before the central "
                      "directory (at %llu)",
                      qn, (unsigned long long)lho, (unsigned long long)cd_off);
            goto fail;
        }
        const uint8_t *h = b + lho;
        uint16_t lnl = rd16(h + 26), lxl = rd16(h + 28), lflags = rd16(h + 6);
        uint64_t data = lho + 30 + lnl + lxl;
        if (data > cd_off) {
            s = zfail(CT_EFORMAT, label, "out-of-file",
                      "member '%s': its local header runs into the central directory", qn);
            goto fail;
        }
        if (lnl != nl || memcmp(h + 30, c + 46, nl) != 0 || rd16(h + 8) != method ||
            (lflags & 0x41) != (flags & 0x41)) {
            s = zfail(CT_EFORMAT, label, "local",
                      "member '%s': its local header (name, method or flags) differs from the "
                      "central directory",
                      qn);
            goto fail;
        }
        if (!(lflags & 0x08)) { /* sizes in the local header: they must agree */
            uint64_t lc = rd32(h + 18), lu = rd32(h + 22);
            if ((s = zip64_extra(label, qn, h + 30 + lnl, lxl, &lu, &lc, NULL, true))) goto fail;
            if (rd32(h + 14) != crc || lc != csize || lu != usize) {
                s = zfail(CT_EFORMAT, label, "local",
                          "member '%s': its local header's CRC or sizes differ from the "
                          "central directory",
                          qn);
                goto fail;
            }
        }
        if (csize > cd_off - data) {
            s = zfail(CT_EFORMAT, label, "out-of-file",
                      "member '%s' (%llu bytes at offset %llu) runs past the start of the "
                      "central directory (at %llu)",
                      qn, (unsigned long long)csize, (unsigned long long)data,
                      (unsigned long long)cd_off);
            goto fail;
        }
        uint64_t end = data + csize;
        if (lflags & 0x08) { /* a data descriptor follows: crc, sizes (4 or 8 bytes each) */
            uint64_t q0 = end;
            if (cd_off - q0 >= 4 && rd32(b + q0) == SIG_DESCRIPTOR) q0 += 4;
            /* 4-byte sizes, or 8-byte ones (zip64 writers): whichever agrees. */
            bool ok = false;
            uint64_t dl = 12, dc = 0, du = 0;
            for (int wide = 0; wide < 2 && !ok; wide++) {
                dl = wide ? 20 : 12;
                if (cd_off - q0 < dl) break;
                dc = wide ? rd64(b + q0 + 4) : rd32(b + q0 + 4);
                du = wide ? rd64(b + q0 + 12) : rd32(b + q0 + 8);
                ok = rd32(b + q0) == crc && dc == csize && du == usize;
            }
            if (!ok) {
                s = zfail(CT_EFORMAT, label, "descriptor",
                          "member '%s': its data descriptor is missing, truncated or differs from "
                          "the central directory (CRC %08x, %llu bytes)",
                          qn, crc, (unsigned long long)csize);
                goto fail;
            }
            end = q0 + dl;
        }
        ct_zip_member *m = &z->members[i];
        m->name = name;
        m->data_offset = data;
        m->size = csize;
        m->header_offset = lho;
        m->crc32 = crc;
        ext[i] = (extent){lho, end, i};
        p += 46 + (uint64_t)nl + xl + cl;
    }
    if (p != cd_off + cd_size) {
        s = zfail(CT_EFORMAT, label, "cd",
                  "the central directory holds %llu bytes after its %zu entries",
                  (unsigned long long)(cd_off + cd_size - p), count);
        goto fail;
    }
    qsort(ext, count, sizeof *ext, cmp_extent);
    for (size_t i = 1; i < count; i++)
        if (ext[i].begin < ext[i - 1].end) {
            char q1[96], q2[96];
            s = zfail(CT_EFORMAT, label, "overlap",
                      "members '%s' (bytes %llu..%llu) and '%s' (from %llu) overlap",
                      ct_io_quote(q1, sizeof q1, z->members[ext[i - 1].member].name),
                      (unsigned long long)ext[i - 1].begin, (unsigned long long)ext[i - 1].end,
                      ct_io_quote(q2, sizeof q2, z->members[ext[i].member].name),
                      (unsigned long long)ext[i].begin);
            goto fail;
        }
    for (size_t i = 0; i < count; i++)
        order[i] = i;
    sort_members = z->members;
    qsort(order, count, sizeof *order, cmp_member_name);
    sort_members = NULL;
    for (size_t i = 1; i < count; i++)
        if (!strcmp(z->members[order[i]].name, z->members[order[i - 1]].name)) {
            char q[96];
            s = zfail(CT_EFORMAT, label, "duplicate", "two members are named '%s'",
                      ct_io_quote(q, sizeof q, z->members[order[i]].name));
            goto fail;
        }
    ct_free(ext);
    ct_free(order);
    return CT_OK;
fail:
    ct_free(ext);
    ct_free(order);
    ct_zip_close(z);
    return s;
}
