/* PyTorch checkpoints: hostile zips and pickles crafted here byte by byte, one per rule, each
 * refused with its own error; hand-built valid archives (strided views, shared storages,
 * big-endian) read back element by element against a naive reference; the .pt writer's
 * output read back bit for bit (zip64 records forced too). Files PyTorch itself writes are
 * tested in tests/python/test_pt.py. */
#include "io/io_internal.h"
#include "test_util.h"

#include <stdint.h>
#include <unistd.h>

/* ---- a byte builder ------------------------------------------------------------------- */

typedef struct bb {
    uint8_t *p;
    size_t n, cap;
} bb;

static void bput(bb *b, const void *p, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}
static void b8(bb *b, unsigned v)
{
    uint8_t c = (uint8_t)v;
    bput(b, &c, 1);
}
static void b16(bb *b, unsigned v)
{
    b8(b, v & 0xFF);
    b8(b, v >> 8);
}
static void b32(bb *b, uint32_t v)
{
    b16(b, v & 0xFFFF);
    b16(b, v >> 16);
}
static void b64(bb *b, uint64_t v)
{
    b32(b, (uint32_t)v);
    b32(b, (uint32_t)(v >> 32));
}
static void bstr(bb *b, const char *s)
{
    bput(b, s, strlen(s));
}

/* ---- pickles -------------------------------------------------------------------------- */

static void p_uni(bb *b, const char *s)
{
    b8(b, 'X');
    b32(b, (uint32_t)strlen(s));
    bstr(b, s);
}
static void p_int(bb *b, int64_t v)
{
    if (v >= 0 && v < 256) {
        b8(b, 'K');
        b8(b, (unsigned)v);
    } else {
        b8(b, 0x8a);
        b8(b, 8);
        b64(b, (uint64_t)v);
    }
}
static void p_global(bb *b, const char *mod, const char *name)
{
    b8(b, 'c');
    bstr(b, mod);
    b8(b, '\n');
    bstr(b, name);
    b8(b, '\n');
}
static void p_tuple(bb *b, int n, const int64_t *v)
{
    b8(b, '(');
    for (int i = 0; i < n; i++)
        p_int(b, v[i]);
    b8(b, 't');
}
/* _rebuild_tensor_v2(('storage', torch.<type>, key, 'cpu', numel), off, size, stride, False,
 * OrderedDict()) */
static void p_tensor(bb *b, const char *type, const char *key, int64_t numel, int64_t off, int nd,
                     const int64_t *size, const int64_t *stride)
{
    p_global(b, "torch._utils", "_rebuild_tensor_v2");
    b8(b, '(');
    b8(b, '(');
    p_uni(b, "storage");
    p_global(b, "torch", type);
    p_uni(b, key);
    p_uni(b, "cpu");
    p_int(b, numel);
    b8(b, 't');
    b8(b, 'Q');
    p_int(b, off);
    p_tuple(b, nd, size);
    p_tuple(b, nd, stride);
    b8(b, 0x89);
    p_global(b, "collections", "OrderedDict");
    b8(b, ')');
    b8(b, 'R');
    b8(b, 't');
    b8(b, 'R');
}

/* ---- zips ----------------------------------------------------------------------------- */

typedef struct zmember {
    const char *name;
    const void *data;
    size_t size;
    unsigned method; /* 0 stored */
    unsigned flags;  /* 0x08: data descriptor */
} zmember;

typedef struct zopts {
    int overlap;          /* member 1's central lho points at member 0's */
    int lho_past_end;     /* member 1's lho beyond the file */
    int bad_crc;          /* member 0's CRC off by one */
    int count_lie;        /* EOCD says one member more */
    int zip64;            /* zip64 end records */
    int zip64_lie;        /* zip64 record's member count disagrees */
    int locator_past_end; /* zip64 locator points past the file */
    int size_lie;         /* member 0: stored sizes differ */
    int desc_lie;         /* member 0's descriptor CRC differs */
    int local_name_lie;   /* member 0's local name differs */
} zopts;

static bb make_zip(const zmember *m, size_t n, const zopts *o)
{
    bb z = {0}, cd = {0};
    uint64_t lho[16];
    for (size_t i = 0; i < n; i++) {
        lho[i] = z.n;
        uint32_t crc = ct_crc32(0, m[i].data, m[i].size) + (o->bad_crc && i == 0);
        b32(&z, 0x04034b50u);
        b16(&z, 20);
        b16(&z, m[i].flags);
        b16(&z, m[i].method);
        b16(&z, 0);
        b16(&z, 0x21);
        b32(&z, m[i].flags & 8 ? 0 : crc);
        b32(&z, m[i].flags & 8 ? 0 : (uint32_t)m[i].size);
        b32(&z, m[i].flags & 8 ? 0 : (uint32_t)m[i].size);
        b16(&z, (unsigned)strlen(m[i].name));
        b16(&z, 0);
        if (o->local_name_lie && i == 0) {
            bb t = {0};
            bstr(&t, m[i].name);
            t.p[0] ^= 1;
            bput(&z, t.p, t.n);
            free(t.p);
        } else
            bstr(&z, m[i].name);
        bput(&z, m[i].data, m[i].size);
        if (m[i].flags & 8) {
            b32(&z, 0x08074b50u);
            b32(&z, crc + (o->desc_lie && i == 0));
            b32(&z, (uint32_t)m[i].size);
            b32(&z, (uint32_t)m[i].size);
        }
        b32(&cd, 0x02014b50u);
        b16(&cd, 20);
        b16(&cd, 20);
        b16(&cd, m[i].flags);
        b16(&cd, m[i].method);
        b16(&cd, 0);
        b16(&cd, 0x21);
        b32(&cd, crc);
        b32(&cd, (uint32_t)m[i].size + (o->size_lie && i == 0));
        b32(&cd, (uint32_t)m[i].size);
        b16(&cd, (unsigned)strlen(m[i].name));
        b16(&cd, 0);
        b16(&cd, 0);
        b16(&cd, 0);
        b16(&cd, 0);
        b32(&cd, 0);
        uint64_t at = lho[i];
        if (o->overlap && i == 1) at = lho[0];
        if (o->lho_past_end && i == 1) at = 1u << 30;
        b32(&cd, (uint32_t)at);
        bstr(&cd, m[i].name);
    }
    uint64_t cd_off = z.n;
    bput(&z, cd.p, cd.n);
    int z64 = o->zip64 || o->zip64_lie || o->locator_past_end;
    if (z64) {
        uint64_t e64 = z.n;
        b32(&z, 0x06064b50u);
        b64(&z, 44);
        b16(&z, 45);
        b16(&z, 45);
        b32(&z, 0);
        b32(&z, 0);
        b64(&z, n + (o->zip64_lie ? 1 : 0));
        b64(&z, n + (o->zip64_lie ? 1 : 0));
        b64(&z, cd.n);
        b64(&z, cd_off);
        b32(&z, 0x07064b50u);
        b32(&z, 0);
        b64(&z, o->locator_past_end ? (1ull << 40) : e64);
        b32(&z, 1);
    }
    b32(&z, 0x06054b50u);
    b16(&z, 0);
    b16(&z, 0);
    /* zip64_lie: the 16-bit counts are not the sentinel and disagree with the zip64 record */
    unsigned cnt = z64 && !o->zip64_lie ? 0xFFFF : (unsigned)(n + (o->count_lie ? 1 : 0));
    b16(&z, cnt);
    b16(&z, cnt);
    b32(&z, z64 ? 0xFFFFFFFFu : (uint32_t)cd.n);
    b32(&z, z64 ? 0xFFFFFFFFu : (uint32_t)cd_off);
    b16(&z, 0);
    free(cd.p);
    return z;
}

/* A one-tensor checkpoint: data.pkl = {"w": pickle of ...} with storage "0". */
static bb ckpt(const bb *pkl, const void *storage, size_t nbytes, const zopts *o)
{
    zmember m[3] = {{"archive/data.pkl", pkl->p, pkl->n, 0, 8},
                    {"archive/data/0", storage, nbytes, 0, 8},
                    {"archive/version", "3\n", 2, 0, 8}};
    zopts none = {0};
    return make_zip(m, 3, o ? o : &none);
}

/* Expect a refusal with status `want` and every one of the words in the message. */
static void refused(const bb *file, ct_status want, const char *w1, const char *w2, int line)
{
    ct_tensor_file *f = NULL;
    ct_clear_error();
    ct_status s = ct_load_memory(file->p, file->n, NULL, &f);
    t_checks++;
    const char *msg = ct_last_error();
    if (s != want || f || !strstr(msg, w1) || (w2 && !strstr(msg, w2))) {
        t_failures++;
        fprintf(stderr, "line %d: got %s '%s' (want %s with '%s' '%s')\n", line, ct_status_name(s),
                msg, ct_status_name(want), w1, w2 ? w2 : "");
    }
    if (f) ct_tensor_file_close(f);
}
#define REFUSED(file, want, w1, w2) refused(file, want, w1, w2, __LINE__)

static bb pickle_of_w(void (*body)(bb *))
{
    bb p = {0};
    b8(&p, 0x80);
    b8(&p, 2);
    b8(&p, '}');
    p_uni(&p, "w");
    body(&p);
    b8(&p, 's');
    b8(&p, '.');
    return p;
}

static void body_vec4(bb *p)
{
    int64_t size[1] = {4}, stride[1] = {1};
    p_tensor(p, "FloatStorage", "0", 4, 0, 1, size, stride);
}

/* ---- valid hand-made archives --------------------------------------------------------- */

static void test_views(void)
{
    /* storage of 12 floats 0..11; a = [3, 4]; b = a.t(); c = a[1:, ::2] (offset 4, strides
     * [4, 2]); d = a[0:1].expand(2, 4) (stride 0); e: int64 scalar */
    float st[12];
    for (int i = 0; i < 12; i++)
        st[i] = (float)i * 1.5f;
    bb p = {0};
    b8(&p, 0x80);
    b8(&p, 2);
    p_global(&p, "collections", "OrderedDict");
    b8(&p, ')');
    b8(&p, 'R');
    b8(&p, '(');
    int64_t s34[2] = {3, 4}, r34[2] = {4, 1}, s43[2] = {4, 3}, r43[2] = {1, 4}, s22[2] = {2, 2},
            r22[2] = {4, 2}, s24[2] = {2, 4}, r24[2] = {0, 1};
    p_uni(&p, "a");
    p_tensor(&p, "FloatStorage", "0", 12, 0, 2, s34, r34);
    p_uni(&p, "b");
    p_tensor(&p, "FloatStorage", "0", 12, 0, 2, s43, r43);
    p_uni(&p, "c");
    p_tensor(&p, "FloatStorage", "0", 12, 4, 2, s22, r22);
    p_uni(&p, "d");
    p_tensor(&p, "FloatStorage", "0", 12, 0, 2, s24, r24);
    b8(&p, 'u');
    b8(&p, '.');
    bb z = ckpt(&p, st, sizeof st, NULL);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load_memory(z.p, z.n, NULL, &f));
    if (f) {
        CHECK(ct_tensor_file_count(f) == 4 && ct_tensor_file_storage_count(f) == 1);
        const char *names[4] = {"a", "b", "c", "d"};
        const int64_t *shapes[4] = {s34, s43, s22, s24}, *strides[4] = {r34, r43, r22, r24};
        int64_t offs[4] = {0, 0, 4, 0};
        for (int k = 0; k < 4; k++) {
            size_t i;
            ct_tensor_info t;
            CHECK_OK(ct_tensor_file_find(f, names[k], &i));
            CHECK_OK(ct_tensor_file_info(f, i, &t));
            CHECK(t.storage == 0 && t.storage_offset == (uint64_t)offs[k]);
            CHECK((k == 0) == (t.strides == NULL));
            ct_tensor v, c;
            CHECK_OK(ct_tensor_file_view(f, i, &v));
            CHECK_OK(ct_tensor_file_read(f, i, CT_DTYPE_F64, &c));
            /* naive reference: element (i, j) = st[off + i*s0 + j*s1] */
            int bad = 0;
            for (int64_t a = 0; a < shapes[k][0]; a++)
                for (int64_t b = 0; b < shapes[k][1]; b++) {
                    double want = st[offs[k] + a * strides[k][0] + b * strides[k][1]];
                    float got_v = ((const float *)v.data)[a * v.strides[0] + b * v.strides[1]];
                    double got_c = ((const double *)c.data)[a * shapes[k][1] + b];
                    bad += got_v != (float)want || got_c != want;
                }
            CHECK(bad == 0);
            CHECK(v.data == (void *)((const float *)t.data));
            ct_tensor_free(&c);
        }
        ct_tensor_info tc;
        size_t ic;
        ct_tensor_file_find(f, "c", &ic);
        ct_tensor_file_info(f, ic, &tc);
        CHECK(tc.data_begin == 16 && tc.data_end == (4 + 4 + 2 + 1) * 4 && tc.nbytes == 16);
        ct_tensor_file_close(f);
    }
    free(z.p);
    free(p.p);
}

static void body_be(bb *p)
{
    int64_t size[1] = {3}, stride[1] = {1};
    p_tensor(p, "IntStorage", "0", 3, 0, 1, size, stride);
}

static void test_big_endian(void)
{
    bb p = pickle_of_w(body_be);
    uint8_t st[12] = {0, 0, 0, 1, 0, 0, 1, 0, 0x80, 0, 0, 0}; /* 1, 256, INT32_MIN big-endian */
    zmember m[3] = {{"archive/data.pkl", p.p, p.n, 0, 8},
                    {"archive/data/0", st, 12, 0, 8},
                    {"archive/byteorder", "big", 3, 0, 8}};
    zopts o = {0};
    bb z = make_zip(m, 3, &o);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load_memory(z.p, z.n, NULL, &f));
    if (f) {
        ct_tensor v;
        CHECK_OK(ct_tensor_file_get(f, "w", &v));
        const int32_t *d = v.data;
        CHECK(d[0] == 1 && d[1] == 256 && d[2] == INT32_MIN);
        ct_tensor_file_close(f);
    }
    free(z.p);
    m[2].data = "sideways";
    m[2].size = 8;
    z = make_zip(m, 3, &o);
    REFUSED(&z, CT_EFORMAT, "[byteorder]", NULL);
    free(z.p);
    free(p.p);
}

/* ---- hostile zips --------------------------------------------------------------------- */

static void test_hostile_zips(void)
{
    bb p = pickle_of_w(body_vec4);
    float st[4] = {1, 2, 3, 4};
    zopts o;
    bb z;
#define ZCASE(field, want, w1, w2)                                                                 \
    memset(&o, 0, sizeof o);                                                                       \
    o.field = 1;                                                                                   \
    z = ckpt(&p, st, sizeof st, &o);                                                               \
    REFUSED(&z, want, w1, w2);                                                                     \
    free(z.p)
    ZCASE(overlap, CT_EFORMAT, "[zip-", "archive/");
    ZCASE(lho_past_end, CT_EFORMAT, "[zip-out-of-file]", "archive/data/0");
    ZCASE(bad_crc, CT_EFORMAT, "[zip-", "archive/data.pkl");
    ZCASE(count_lie, CT_EFORMAT, "[zip-cd]", NULL);
    ZCASE(zip64_lie, CT_EFORMAT, "[zip-zip64]", NULL);
    ZCASE(locator_past_end, CT_EFORMAT, "[zip-zip64]", NULL);
    ZCASE(size_lie, CT_EFORMAT, "[zip-size]", "archive/data.pkl");
    ZCASE(desc_lie, CT_EFORMAT, "[zip-descriptor]", "archive/data.pkl");
    ZCASE(local_name_lie, CT_EFORMAT, "[zip-local]", "archive/data.pkl");
#undef ZCASE
    /* zip64 end records that tell the truth load */
    memset(&o, 0, sizeof o);
    o.zip64 = 1;
    z = ckpt(&p, st, sizeof st, &o);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load_memory(z.p, z.n, NULL, &f));
    ct_tensor_file_close(f);
    free(z.p);
    /* compressed (method 8) and encrypted members, named */
    memset(&o, 0, sizeof o);
    zmember m[2] = {{"archive/data.pkl", p.p, p.n, 0, 8}, {"archive/data/0", st, 16, 8, 8}};
    z = make_zip(m, 2, &o);
    REFUSED(&z, CT_EUNSUPPORTED, "[zip-compressed]", "archive/data/0");
    free(z.p);
    m[1].method = 0;
    m[1].flags = 1;
    z = make_zip(m, 2, &o);
    REFUSED(&z, CT_EUNSUPPORTED, "[zip-encrypted]", "archive/data/0");
    free(z.p);
    /* a true overlap: member 1's local header lies inside member 0's data */
    {
        bb inner = {0}; /* a local header + data for "archive/data/0" */
        b32(&inner, 0x04034b50u);
        b16(&inner, 20);
        b16(&inner, 0);
        b16(&inner, 0);
        b16(&inner, 0);
        b16(&inner, 0x21);
        b32(&inner, ct_crc32(0, st, 16));
        b32(&inner, 16);
        b32(&inner, 16);
        b16(&inner, 14);
        b16(&inner, 0);
        bstr(&inner, "archive/data/0");
        bput(&inner, st, 16);
        bb big = {0}; /* member 0 = data.pkl followed by the inner header (zip sees one blob) */
        bput(&big, p.p, p.n);
        bput(&big, inner.p, inner.n);
        zmember mm[1] = {{"archive/data.pkl", big.p, big.n, 0, 0}};
        bb zz = make_zip(mm, 1, &o);
        /* add a central entry for the inner member: rebuild the central directory by hand */
        size_t cd = 0;
        for (size_t i = zz.n - 22; i-- > 0;)
            if (!memcmp(zz.p + i, "PK\x01\x02", 4)) {
                cd = i;
                break;
            }
        bb out = {0};
        bput(&out, zz.p, cd);
        bput(&out, zz.p + cd, zz.n - 22 - cd); /* the existing central entry */
        b32(&out, 0x02014b50u);
        b16(&out, 20);
        b16(&out, 20);
        b16(&out, 0);
        b16(&out, 0);
        b16(&out, 0);
        b16(&out, 0x21);
        b32(&out, ct_crc32(0, st, 16));
        b32(&out, 16);
        b32(&out, 16);
        b16(&out, 14);
        b16(&out, 0);
        b16(&out, 0);
        b16(&out, 0);
        b16(&out, 0);
        b32(&out, 0);
        b32(&out, (uint32_t)(30 + 16 + p.n)); /* inside member 0's data */
        bstr(&out, "archive/data/0");
        size_t cd_size = out.n - cd;
        b32(&out, 0x06054b50u);
        b16(&out, 0);
        b16(&out, 0);
        b16(&out, 2);
        b16(&out, 2);
        b32(&out, (uint32_t)cd_size);
        b32(&out, (uint32_t)cd);
        b16(&out, 0);
        REFUSED(&out, CT_EFORMAT, "[zip-overlap]", "archive/data/0");
        free(out.p);
        free(zz.p);
        free(big.p);
        free(inner.p);
    }
    /* two members of one name */
    zmember d[3] = {{"archive/data.pkl", p.p, p.n, 0, 8},
                    {"archive/data/0", st, 16, 0, 8},
                    {"archive/data/0", st, 16, 0, 8}};
    z = make_zip(d, 3, &o);
    REFUSED(&z, CT_EFORMAT, "[zip-duplicate]", "archive/data/0");
    free(z.p);
    /* no end record: truncated; bytes after the archive */
    z = ckpt(&p, st, sizeof st, NULL);
    bb cut = {z.p, z.n - 5, 0};
    REFUSED(&cut, CT_EFORMAT, "[zip-eocd]", NULL);
    z.p = realloc(z.p, z.n + 3);
    memcpy(z.p + z.n, "abc", 3);
    bb longer = {z.p, z.n + 3, 0};
    REFUSED(&longer, CT_EFORMAT, "[zip-eocd]", NULL);
    free(z.p);
    /* the storage record too short for its element count; missing */
    z = ckpt(&p, st, 12, NULL);
    REFUSED(&z, CT_EFORMAT, "[storage]", "archive/data/0");
    free(z.p);
    zmember one[1] = {{"archive/data.pkl", p.p, p.n, 0, 8}};
    z = make_zip(one, 1, &o);
    REFUSED(&z, CT_EFORMAT, "[layout]", "archive/data/0");
    free(z.p);
    zmember none[1] = {{"archive/other", st, 16, 0, 0}};
    z = make_zip(none, 1, &o);
    REFUSED(&z, CT_EFORMAT, "[layout]", "data.pkl");
    free(z.p);
    free(p.p);
}

/* ---- hostile pickles ------------------------------------------------------------------ */

static void pk_case(const void *pkl, size_t n, ct_status want, const char *w1, const char *w2,
                    int line)
{
    float st[4] = {1, 2, 3, 4};
    bb p = {(uint8_t *)pkl, n, 0};
    bb z = ckpt(&p, st, sizeof st, NULL);
    refused(&z, want, w1, w2, line);
    free(z.p);
}
#define PK(lit, want, w1, w2) pk_case(lit, sizeof lit - 1, want, w1, w2, __LINE__)

static void body_huge_storage(bb *p)
{
    int64_t size[1] = {4}, stride[1] = {1};
    p_tensor(p, "FloatStorage", "0", (int64_t)1 << 60, 0, 1, size, stride);
}
static void body_past_storage(bb *p)
{
    int64_t size[2] = {2, 2}, stride[2] = {3, 1}; /* reaches element 4 of 4 */
    p_tensor(p, "FloatStorage", "0", 4, 0, 2, size, stride);
}
static void body_overflow(bb *p)
{
    int64_t size[2] = {(int64_t)1 << 40, (int64_t)1 << 40}, stride[2] = {(int64_t)1 << 40, 1};
    p_tensor(p, "FloatStorage", "0", 4, 0, 2, size, stride);
}
static void body_quantized(bb *p)
{
    int64_t size[1] = {4}, stride[1] = {1};
    p_tensor(p, "QInt8Storage", "0", 16, 0, 1, size, stride);
}
static void body_sparse(bb *p)
{
    p_global(p, "torch._utils", "_rebuild_sparse_tensor");
    b8(p, ')');
    b8(p, 'R');
}
static void body_type_clash(bb *p)
{
    int64_t size[1] = {4}, stride[1] = {1};
    b8(p, ']');
    b8(p, '(');
    p_tensor(p, "FloatStorage", "0", 4, 0, 1, size, stride);
    p_tensor(p, "IntStorage", "0", 4, 0, 1, size, stride);
    b8(p, 'e');
}

static void test_hostile_pickles(void)
{
    PK("\x80\x02}X\x01\x00\x00\x00wcos\nsystem\nX\x04\x00\x00\x00true\x85Rs.", CT_EFORMAT,
       "[pickle-global]", "os.system");
    PK("\x80\x04\x8c\x05posix\x8c\x06system\x93.", CT_EFORMAT, "[pickle-global]", "posix.system");
    PK("\x80\x02\x8c\x01"
       "a)R.",
       CT_EFORMAT, "[pickle-reduce]", "a str");
    PK("\x80\x02"
       "ctorch\nSize\nK\x01R.",
       CT_EFORMAT, "[pickle-reduce]", "a tuple");
    PK("\x80\x02"
       "ctorch\nFloatStorage\n)R.",
       CT_EUNSUPPORTED, "[pickle-unsupported]", "torch.FloatStorage");
    PK("\x80\x02]}b.", CT_EFORMAT, "[pickle-build]", "a list");
    PK("\x80\x02}}b.", CT_EFORMAT, "[pickle-build]", "a dict");
    PK("(ios\nsystem\n.", CT_EFORMAT, "[pickle-opcode]", "os.system");
    PK("\x80\x02(cos\nsystem\no.", CT_EFORMAT, "[pickle-global]", "os.system");
    PK("\x80\x02"
       "ccollections\nOrderedDict\n)\x81.",
       CT_EFORMAT, "[pickle-newobj]", "OrderedDict");
    PK("\x80\x02\x82\x01.", CT_EFORMAT, "[pickle-opcode]", "EXT1");
    PK("\x80\x02I1\n.", CT_EFORMAT, "[pickle-opcode]", "INT");
    PK("\x80\x02\xff.", CT_EFORMAT, "[pickle-opcode]", "0xff");
    PK("\x80\x07N.", CT_EFORMAT, "[pickle-opcode]", "protocol 7");
    /* memo abuse: an unset entry, a 2^32-1 index (stored sparsely), a cycle */
    PK("\x80\x02h\x07.", CT_EFORMAT, "[pickle-memo]", "7");
    PK("\x80\x02]r\xff\xff\xff\xff"
       "0j\xfe\xff\xff\xff.",
       CT_EFORMAT, "[pickle-memo]", "4294967294");
    PK("\x80\x02]q\x00h\x00"
       "a.",
       CT_EFORMAT, "[cycle]", NULL);
    /* truncated frames and arguments */
    PK("\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00N.", CT_EFORMAT, "[pickle-frame]", "FRAME");
    PK("\x80\x04\x95\x01\x00\x00\x00\x00\x00\x00\x00K\x05.", CT_EFORMAT, "[pickle-frame]", NULL);
    PK("\x80\x02X\x00\x00\x00\x80"
       "ab.",
       CT_EFORMAT, "[pickle-truncated]", "BINUNICODE");
    PK("\x80\x02\x8e\xff\xff\xff\xff\xff\xff\xff\xff.", CT_EFORMAT, "[pickle-truncated]",
       "BINBYTES8");
    PK("\x80\x02N", CT_EFORMAT, "[pickle-truncated]", "STOP");
    PK("\x80\x02\x8a\x09\x01\x01\x01\x01\x01\x01\x01\x01\x01.", CT_EFORMAT, "[pickle-limit]",
       "64 bits");
    /* stack discipline */
    PK("\x80\x02"
       "a.",
       CT_EFORMAT, "[pickle-stack]", "APPEND");
    PK("\x80\x02NN.", CT_EFORMAT, "[pickle-stack]", "STOP");
    PK("\x80\x02Nt.", CT_EFORMAT, "[pickle-stack]", "MARK");
    PK("\x80\x02N("
       "a.",
       CT_EFORMAT, "[pickle-stack]", "MARK");
    PK("\x80\x02K\x01K\x02"
       "a.",
       CT_EFORMAT, "[pickle-type]", "an int");
    PK("\x80\x02X\x02\x00\x00\x00\xc3\x28.", CT_EFORMAT, "[pickle-utf8]", NULL);
    PK("\x80\x02N.N", CT_EFORMAT, "[pickle-trailing]", NULL);
    /* persistent ids other than storages */
    PK("\x80\x02X\x06\x00\x00\x00module\x85Q.", CT_EFORMAT, "[pickle-persid]", "module");
    PK("\x80\x02NQ.", CT_EFORMAT, "[pickle-persid]", "None");
    {
        /* recursion depth: 5000 MARKs; lists nested 100 deep */
        bb d = {0};
        b8(&d, 0x80);
        b8(&d, 2);
        for (int i = 0; i < 5000; i++)
            b8(&d, '(');
        b8(&d, 'N');
        b8(&d, '.');
        pk_case(d.p, d.n, CT_EFORMAT, "[pickle-depth]", "4096", __LINE__);
        d.n = 2;
        for (int i = 0; i < 100; i++)
            b8(&d, ']');
        for (int i = 0; i < 99; i++)
            b8(&d, 'a');
        b8(&d, '.');
        pk_case(d.p, d.n, CT_EFORMAT, "[nesting]", "64", __LINE__);
        /* shared subtrees that expand exponentially when flattened */
        d.n = 2;
        b8(&d, 'N');
        for (int i = 0; i < 60; i++) {
            b8(&d, '2'); /* DUP */
            b8(&d, 0x86);
        }
        b8(&d, '.');
        pk_case(d.p, d.n, CT_EFORMAT, "[limit]", NULL, __LINE__);
        free(d.p);
    }
    /* tensors: huge sizes, views past their storage, overflowing strides, types */
    float st[4] = {1, 2, 3, 4};
    bb p, z;
#define TCASE(body, want, w1, w2)                                                                  \
    p = pickle_of_w(body);                                                                         \
    z = ckpt(&p, st, sizeof st, NULL);                                                             \
    REFUSED(&z, want, w1, w2);                                                                     \
    free(z.p);                                                                                     \
    free(p.p)
    TCASE(body_huge_storage, CT_EFORMAT, "[storage]", "more than the file holds");
    TCASE(body_past_storage, CT_EFORMAT, "[tensor]", "'w'");
    TCASE(body_overflow, CT_EOVERFLOW, "[tensor]", "'w'");
    TCASE(body_quantized, CT_EUNSUPPORTED, "[unsupported]", "QInt8Storage");
    TCASE(body_sparse, CT_EUNSUPPORTED, "[pickle-unsupported]", "sparse");
    TCASE(body_type_clash, CT_EFORMAT, "[storage]", "IntStorage");
#undef TCASE
    /* two tensors flattening to one name */
    bb q = {0};
    b8(&q, 0x80);
    b8(&q, 2);
    b8(&q, '}');
    b8(&q, '(');
    p_uni(&q, "a.b");
    body_vec4(&q);
    p_uni(&q, "a");
    b8(&q, '}');
    p_uni(&q, "b");
    body_vec4(&q);
    b8(&q, 's');
    b8(&q, 'u');
    b8(&q, '.');
    z = ckpt(&q, st, sizeof st, NULL);
    REFUSED(&z, CT_EFORMAT, "[key]", "a.b");
    free(z.p);
    free(q.p);
}

/* ---- the legacy format ---------------------------------------------------------------- */

static void test_legacy(void)
{
    static const uint8_t head[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9,
                                   0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, 0x80, 0x02, 0x4d,
                                   0xe9, 0x03, 0x2e, 0x80, 0x02, 0x7d, 0x2e};
    int64_t size[1] = {3}, stride[1] = {1};
    for (int variant = 0; variant < 5; variant++) {
        bb f = {0};
        bput(&f, head, sizeof head);
        if (variant == 1) f.p[5] ^= 1; /* magic */
        /* {"w": tensor} with a legacy persistent id (6 fields, view None) */
        b8(&f, 0x80);
        b8(&f, 2);
        b8(&f, '}');
        p_uni(&f, "w");
        p_global(&f, "torch._utils", "_rebuild_tensor_v2");
        b8(&f, '(');
        b8(&f, '(');
        p_uni(&f, "storage");
        p_global(&f, "torch", "LongStorage");
        p_uni(&f, "94000");
        p_uni(&f, "cpu");
        p_int(&f, 3);
        b8(&f, 'N');
        b8(&f, 't');
        b8(&f, 'Q');
        p_int(&f, 0);
        p_tuple(&f, 1, size);
        p_tuple(&f, 1, stride);
        b8(&f, 0x89);
        p_global(&f, "collections", "OrderedDict");
        b8(&f, ')');
        b8(&f, 'R');
        b8(&f, 't');
        b8(&f, 'R');
        b8(&f, 's');
        b8(&f, '.');
        /* the storage keys, then the storage */
        b8(&f, 0x80);
        b8(&f, 2);
        b8(&f, ']');
        b8(&f, '(');
        p_uni(&f, "94000");
        if (variant == 3) p_uni(&f, "94000");
        b8(&f, 'e');
        b8(&f, '.');
        b64(&f, variant == 2 ? 4 : 3);
        for (int64_t i = 0; i < 3; i++)
            b64(&f, (uint64_t)(i * 1000 - 7));
        if (variant == 4) b8(&f, 0);
        ct_tensor_file *tf = NULL;
        ct_status s = ct_load_memory(f.p, f.n, NULL, &tf);
        if (variant == 0) {
            CHECK(s == CT_OK);
            ct_tensor v;
            if (s == CT_OK && ct_tensor_file_get(tf, "w", &v) == CT_OK) {
                const int64_t *d = v.data;
                CHECK(v.dtype == CT_DTYPE_I64 && d[0] == -7 && d[1] == 993 && d[2] == 1993);
            } else
                CHECK(0);
            ct_tensor_file_summary sm;
            ct_tensor_file_summarize(tf, &sm);
            CHECK(sm.format == CT_FORMAT_PICKLE && sm.storages == 1 && sm.data_bytes == 24);
        } else {
            static const char *const want[] = {"", "[legacy]", "[storage]", "[legacy]",
                                               "[trailing]"};
            CHECK(s == CT_EFORMAT && strstr(ct_last_error(), want[variant]));
            if (!(s == CT_EFORMAT && strstr(ct_last_error(), want[variant])))
                fprintf(stderr, "legacy variant %d: %s\n", variant, ct_last_error());
        }
        ct_tensor_file_close(tf);
        free(f.p);
    }
}

/* ---- the writer ----------------------------------------------------------------------- */

static void test_writer(void)
{
    char dir[] = "/tmp/ct_pt_test_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[128];
    snprintf(path, sizeof path, "%s/w.pt", dir);
    ct_tensor t[6];
    int64_t s23[2] = {2, 3}, s0[1] = {0};
    CHECK_OK(ct_tensor_empty(&t[0], CT_DTYPE_F32, 2, s23));
    CHECK_OK(ct_tensor_empty(&t[1], CT_DTYPE_BF16, 2, s23));
    CHECK_OK(ct_tensor_empty(&t[2], CT_DTYPE_I64, 0, NULL));
    CHECK_OK(ct_tensor_empty(&t[3], CT_DTYPE_BOOL, 1, s0));
    for (int i = 0; i < 6; i++) {
        ((float *)t[0].data)[i] = (float)i - 2.5f;
        ((uint16_t *)t[1].data)[i] = (uint16_t)(0x3f80 + i);
    }
    *(int64_t *)t[2].data = -123456789012345;
    CHECK_OK(ct_tensor_transpose(&t[0], 0, 1, &t[4])); /* strided: written contiguous */
    CHECK_OK(ct_tensor_empty(&t[5], CT_DTYPE_I8, 1, (int64_t[]){5}));
    for (int i = 0; i < 5; i++)
        ((int8_t *)t[5].data)[i] = (int8_t)(i * 50 - 100);
    const char *names[6] = {"f", "b", "scalar", "empty", "f.t", "i8"};
    for (int force = 0; force < 2; force++) {
        ct_save_entry e[6];
        memset(e, 0, sizeof e);
        for (int i = 0; i < 6; i++) {
            e[i].name = names[i];
            e[i].tensor = &t[i];
        }
        CHECK_OK(ct_io_save_pt_impl(path, e, 6, NULL, force));
        ct_tensor_file *f = NULL;
        CHECK_OK(ct_load(path, NULL, &f));
        if (!f) continue;
        CHECK(ct_tensor_file_count(f) == 6 && ct_tensor_file_storage_count(f) == 6);
        for (int i = 0; i < 6; i++) {
            ct_tensor a, b;
            CHECK_OK(ct_tensor_file_get_as(f, names[i], t[i].dtype, &a));
            CHECK_OK(ct_tensor_contiguous(&t[i], &b));
            CHECK(a.ndim == b.ndim);
            for (int d = 0; d < a.ndim; d++)
                CHECK(a.shape[d] == b.shape[d]);
            size_t nb = (size_t)ct_tensor_numel(&a) * ct_dtype_size(a.dtype);
            CHECK(nb == 0 || memcmp(a.data, b.data, nb) == 0);
            ct_tensor_info inf;
            size_t idx;
            ct_tensor_file_find(f, names[i], &idx);
            ct_tensor_file_info(f, idx, &inf);
            CHECK(inf.strides == NULL && inf.file_offset % 64 == 0); /* aligned storages */
            ct_tensor_free(&a);
            ct_tensor_free(&b);
        }
        ct_tensor_file_close(f);
    }
    /* same tensors, same bytes (fixed timestamps, no randomness) */
    {
        ct_save_entry e[1] = {{"f", &t[0], 0, 0, NULL, NULL}};
        char p2[160];
        snprintf(p2, sizeof p2, "%s/w2.pt", dir);
        CHECK_OK(ct_save_pt_entries(path, e, 1, NULL));
        CHECK_OK(ct_save_pt_entries(p2, e, 1, NULL));
        FILE *a = fopen(path, "rb"), *b = fopen(p2, "rb");
        int same = a && b;
        while (same) {
            int x = fgetc(a), y = fgetc(b);
            same = x == y;
            if (x == EOF) break;
        }
        CHECK(same);
        if (a) fclose(a);
        if (b) fclose(b);
        unlink(p2);
    }
    /* refusals: f6 (no torch dtype), duplicate names, the target untouched */
    uint8_t f6[3] = {0};
    ct_save_entry bad[2] = {{"x", NULL, CT_ST_F6_E2M3, 1, (int64_t[]){4}, f6},
                            {"x", &t[0], 0, 0, NULL, NULL}};
    CHECK_STATUS(ct_save_pt_entries(path, bad, 1, NULL), CT_EUNSUPPORTED);
    CHECK(strstr(ct_last_error(), "'x'") != NULL);
    bad[0].tensor = &t[1];
    CHECK_STATUS(ct_save_pt_entries(path, bad, 2, NULL), CT_EINVAL);
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load(path, NULL, &f)); /* still the previous file */
    CHECK(ct_tensor_file_count(f) == 1);
    ct_tensor_file_close(f);
    for (int i = 0; i < 6; i++)
        ct_tensor_free(&t[i]);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    test_views();
    test_big_endian();
    test_hostile_zips();
    test_hostile_pickles();
    test_legacy();
    test_writer();
    printf("test_io_pt: %d checks, %d failed\n", t_checks, t_failures);
    return t_failures != 0;
}
