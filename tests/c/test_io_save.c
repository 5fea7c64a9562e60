/* Safetensors writer: bitwise round trips, the documented layout, non-contiguous inputs,
 * bad arguments, and failed or killed saves leaving the old file intact and no temp file. */
#include "test_util.h"

#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static uint8_t *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

/* Files in tmpdir whose name holds "ctorch-tmp". */
static int count_temps(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, "ctorch-tmp")) n++;
    if (d) closedir(d);
    return n;
}

static void fill_bytes(void *p, size_t n)
{
    uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (uint8_t)(t_next() >> 24);
}

/* ---- round trip of every ctorch dtype, layout, metadata ------------------------------ */

static void test_round_trip(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/rt.safetensors", tmpdir);
    /* Given order mixes sizes; the layout sorts by element size, ties in given order. */
    const ct_dtype dts[] = {CT_DTYPE_U8,  CT_DTYPE_F32, CT_DTYPE_BF16,    CT_DTYPE_F64,
                            CT_DTYPE_I8,  CT_DTYPE_F16, CT_DTYPE_I64,     CT_DTYPE_BOOL,
                            CT_DTYPE_I16, CT_DTYPE_I32, CT_DTYPE_F8_E4M3, CT_DTYPE_F8_E5M2,
                            CT_DTYPE_F32, CT_DTYPE_U8};
    enum { NT = sizeof dts / sizeof dts[0] };
    ct_tensor t[NT];
    const char *names[NT];
    char nbuf[NT][32];
    for (int i = 0; i < NT; i++) {
        int64_t shape[3] = {3, 1 + i % 4, 5};
        int nd = i == 12 ? 0 : (i == 13 ? 2 : 3); /* a 0-rank and an empty tensor too */
        if (i == 13) shape[1] = 0;
        CHECK_OK(ct_tensor_empty(&t[i], dts[i], nd, shape));
        fill_bytes(t[i].data, (size_t)ct_tensor_numel(&t[i]) * ct_dtype_size(dts[i]));
        if (dts[i] == CT_DTYPE_BOOL)
            for (int64_t k = 0; k < ct_tensor_numel(&t[i]); k++)
                ((uint8_t *)t[i].data)[k] &= 1;
        snprintf(nbuf[i], sizeof nbuf[i], "layer.%d.%s", i, ct_dtype_name(dts[i]));
        names[i] = nbuf[i];
    }
    const char *mk[3] = {"format", "step", "\xe2\x9c\x93 unicode"},
               *mv[3] = {"pt", "1000", "\"q\"\n\\"};
    CHECK_OK(ct_save_safetensors(path, t, names, NT, mk, mv, 3, NULL));
    CHECK(count_temps() == 0);
    size_t n;
    uint8_t *img = read_all(path, &n);
    CHECK(img != NULL);
    if (!img) return;
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = hl << 8 | img[i];
    CHECK(hl % 8 == 0 && img[8] == '{');
    /* Padding is spaces after the closing brace. */
    size_t e = 8 + (size_t)hl;
    while (e > 8 && img[e - 1] == ' ')
        e--;
    CHECK(img[e - 1] == '}' && 8 + hl - e < 8);
    /* __metadata__ comes first. */
    CHECK(memcmp(img + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30) == 0);
    CHECK_OK(ct_safetensors_validate(img, n, NULL));

    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load(path, NULL, &f));
    if (!f) return;
    CHECK(ct_tensor_file_count(f) == NT);
    CHECK(!strcmp(ct_tensor_file_metadata_get(f, "\xe2\x9c\x93 unicode"), "\"q\"\n\\"));
    const char *k0;
    CHECK_OK(ct_tensor_file_metadata(f, 1, &k0, NULL));
    CHECK(!strcmp(k0, "step"));
    size_t prev_size = 8;
    int prev_given = -1;
    for (size_t i = 0; i < NT; i++) {
        ct_tensor_info inf;
        CHECK_OK(ct_tensor_file_info(f, i, &inf));
        int g = -1;
        for (int j = 0; j < NT; j++)
            if (!strcmp(inf.name, names[j])) g = j;
        CHECK(g >= 0);
        if (g < 0) continue;
        size_t es = ct_dtype_size(dts[g]);
        /* Descending element size; ties in the given order. */
        CHECK(es <= prev_size);
        if (es == prev_size) CHECK(g > prev_given);
        prev_size = es;
        prev_given = g;
        CHECK(inf.has_dtype && inf.dtype == dts[g] && inf.ndim == t[g].ndim);
        ct_tensor v;
        CHECK_OK(ct_tensor_file_view(f, i, &v));
        CHECK((uintptr_t)v.data % es == 0); /* aligned views */
        for (int d = 0; d < v.ndim; d++)
            CHECK(v.shape[d] == t[g].shape[d]);
        CHECK(memcmp(v.data, t[g].data, (size_t)inf.nbytes) == 0);
        CHECK(inf.nbytes == (size_t)ct_tensor_numel(&t[g]) * es);
    }
    /* Rewrite through raw entries (what any valid file allows): the same bytes again. */
    ct_save_entry ent[NT];
    const char *mkeys[3], *mvals[3];
    for (size_t i = 0; i < NT; i++) {
        ct_tensor_info inf;
        ct_tensor_file_info(f, i, &inf);
        ent[i] = (ct_save_entry){inf.name, NULL, inf.st_dtype, inf.ndim, inf.shape, inf.data};
    }
    for (size_t i = 0; i < 3; i++)
        ct_tensor_file_metadata(f, i, &mkeys[i], &mvals[i]);
    char path2[300];
    snprintf(path2, sizeof path2, "%s/rt2.safetensors", tmpdir);
    CHECK_OK(ct_save_safetensors_entries(path2, ent, NT, mkeys, mvals, 3, NULL));
    size_t n2;
    uint8_t *img2 = read_all(path2, &n2);
    CHECK(img2 && n2 == n && memcmp(img, img2, n) == 0);
    free(img2);
    ct_tensor_file_close(f);
    free(img);
    for (int i = 0; i < NT; i++)
        ct_tensor_free(&t[i]);

    /* Nothing at all: "{}" padded to 8. */
    CHECK_OK(ct_save_safetensors(path, NULL, NULL, 0, NULL, NULL, 0, NULL));
    img = read_all(path, &n);
    CHECK(n == 16 && img[0] == 8 && memcmp(img + 8, "{}      ", 8) == 0);
    free(img);
}

/* ---- raw entries of dtypes without a ctorch dtype ---------------------------------------- */

static void test_raw(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/raw.safetensors", tmpdir);
    ct_save_entry e[CT_ST_DTYPE_COUNT];
    char names[CT_ST_DTYPE_COUNT][32];
    uint8_t data[CT_ST_DTYPE_COUNT][64];
    int64_t shape[2] = {4, 2};
    for (int d = 0; d < CT_ST_DTYPE_COUNT; d++) {
        snprintf(names[d], sizeof names[d], "raw.%s", ct_st_dtype_name((ct_st_dtype)d));
        fill_bytes(data[d], sizeof data[d]);
        e[d] = (ct_save_entry){names[d], NULL, (ct_st_dtype)d, 2, shape, data[d]};
    }
    CHECK_OK(ct_save_safetensors_entries(path, e, CT_ST_DTYPE_COUNT, NULL, NULL, 0, NULL));
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load(path, NULL, &f));
    if (!f) return;
    int prev_bits = 64;
    for (size_t i = 0; i < ct_tensor_file_count(f); i++) {
        ct_tensor_info inf;
        ct_tensor_file_info(f, i, &inf);
        int bits = ct_st_dtype_bits(inf.st_dtype);
        CHECK(bits <= prev_bits);
        prev_bits = bits;
        CHECK(inf.nbytes == (uint64_t)(8 * bits / 8));
        CHECK(!strcmp(inf.name, names[inf.st_dtype]));
        CHECK(memcmp(inf.data, data[inf.st_dtype], (size_t)inf.nbytes) == 0);
    }
    ct_tensor_file_close(f);
    /* Sub-byte entries must fill whole bytes. */
    int64_t odd[1] = {3};
    ct_save_entry bad = {"f4", NULL, CT_ST_F4, 1, odd, data[0]};
    CHECK_STATUS(ct_save_safetensors_entries(path, &bad, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    bad.st_dtype = CT_ST_DTYPE_COUNT;
    CHECK_STATUS(ct_save_safetensors_entries(path, &bad, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    bad.st_dtype = CT_ST_U8;
    bad.data = NULL;
    CHECK_STATUS(ct_save_safetensors_entries(path, &bad, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    bad.shape = NULL;
    CHECK_STATUS(ct_save_safetensors_entries(path, &bad, 1, NULL, NULL, 0, NULL), CT_EINVAL);
}

/* ---- non-contiguous inputs ------------------------------------------------------------- */

static void check_saved_equals(const char *path, const char *name, const ct_tensor *src)
{
    ct_tensor ref;
    CHECK_OK(ct_tensor_contiguous(src, &ref));
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load(path, NULL, &f));
    ct_tensor v;
    CHECK_OK(ct_tensor_file_get(f, name, &v));
    CHECK(v.ndim == src->ndim);
    for (int d = 0; d < v.ndim; d++)
        CHECK(v.shape[d] == src->shape[d]);
    CHECK(memcmp(v.data, ref.data, (size_t)ct_tensor_numel(&ref) * ct_dtype_size(ref.dtype)) == 0);
    ct_tensor_file_close(f);
    ct_tensor_free(&ref);
}

static void test_strided(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/strided.safetensors", tmpdir);
    /* 1500 x 1000 f32 (6 MB, more than the 4 MiB stage): transposed -> groups of rows. */
    int64_t shape[2] = {1500, 1000};
    ct_tensor a, at;
    CHECK_OK(ct_tensor_empty(&a, CT_DTYPE_F32, 2, shape));
    t_fill(a.data, 1500 * 1000, -1, 1);
    CHECK_OK(ct_tensor_transpose(&a, 0, 1, &at));
    CHECK(!ct_tensor_is_contiguous(&at));
    const char *nm[1] = {"at"};
    CHECK_OK(ct_save_safetensors(path, &at, nm, 1, NULL, NULL, 0, NULL));
    check_saved_equals(path, "at", &at);
    ct_tensor_free(&a);
    /* One row larger than the stage: [2, 1.1M] transposed from [1.1M, 2]. */
    int64_t s2[2] = {1100000, 2};
    CHECK_OK(ct_tensor_empty(&a, CT_DTYPE_F32, 2, s2));
    t_fill(a.data, 2200000, -1, 1);
    CHECK_OK(ct_tensor_transpose(&a, 0, 1, &at));
    CHECK_OK(ct_save_safetensors(path, &at, nm, 1, NULL, NULL, 0, NULL));
    check_saved_equals(path, "at", &at);
    ct_tensor_free(&a);
    /* A stepped slice, an expanded (stride 0) tensor and a small permuted one together. */
    int64_t s3[3] = {4, 6, 8};
    ct_tensor b, sl, ex, pm, one;
    CHECK_OK(ct_tensor_empty(&b, CT_DTYPE_BF16, 3, s3));
    fill_bytes(b.data, 4 * 6 * 8 * 2);
    CHECK_OK(ct_tensor_slice(&b, 1, 1, 6, 2, &sl));
    int perm[3] = {2, 0, 1};
    CHECK_OK(ct_tensor_permute(&b, perm, &pm));
    int64_t s1[1] = {1}, s4[2] = {5, 7};
    double v = 3.0;
    CHECK_OK(ct_tensor_wrap(&one, &v, CT_DTYPE_F64, 1, s1, NULL));
    CHECK_OK(ct_tensor_expand(&one, 2, s4, &ex));
    ct_tensor all[3] = {sl, ex, pm};
    const char *names[3] = {"slice", "expanded", "permuted"};
    CHECK_OK(ct_save_safetensors(path, all, names, 3, NULL, NULL, 0, NULL));
    for (int i = 0; i < 3; i++)
        check_saved_equals(path, names[i], &all[i]);
    ct_tensor_free(&b);
}

/* ---- bad arguments ----------------------------------------------------------------------- */

static void test_bad_args(void)
{
    char path[300];
    snprintf(path, sizeof path, "%s/bad.safetensors", tmpdir);
    float x[2] = {1, 2};
    int64_t sh[1] = {2};
    ct_tensor t[2];
    ct_tensor_wrap(&t[0], x, CT_DTYPE_F32, 1, sh, NULL);
    t[1] = t[0];
    const char *dup[2] = {"a", "a"}, *meta[1] = {"__metadata__"}, *utf[1] = {"a\xff"};
    const char *ok[2] = {"a", "b"}, *nul[2] = {"a", NULL};
    CHECK_STATUS(ct_save_safetensors(NULL, t, ok, 2, NULL, NULL, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, t, dup, 2, NULL, NULL, 0, NULL), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "'a'") != NULL);
    CHECK_STATUS(ct_save_safetensors(path, t, meta, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, t, utf, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, t, nul, 2, NULL, NULL, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, NULL, ok, 2, NULL, NULL, 0, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, t, ok, 2, dup, dup, 2, NULL), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "metadata") != NULL);
    CHECK_STATUS(ct_save_safetensors(path, t, ok, 2, utf, ok, 1, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, t, ok, 2, ok, utf, 1, NULL), CT_EINVAL);
    CHECK_STATUS(ct_save_safetensors(path, t, ok, 2, NULL, ok, 1, NULL), CT_EINVAL);
    ct_tensor badt = t[0];
    badt.dtype = (ct_dtype)77;
    CHECK_STATUS(ct_save_safetensors(path, &badt, ok, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    badt = t[0];
    badt.data = NULL;
    CHECK_STATUS(ct_save_safetensors(path, &badt, ok, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    badt = t[0];
    badt.shape[0] = -1;
    CHECK_STATUS(ct_save_safetensors(path, &badt, ok, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    badt = t[0];
    badt.ndim = 9;
    CHECK_STATUS(ct_save_safetensors(path, &badt, ok, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    char dirpath[300];
    snprintf(dirpath, sizeof dirpath, "%s/", tmpdir);
    CHECK_STATUS(ct_save_safetensors(dirpath, t, ok, 1, NULL, NULL, 0, NULL), CT_EINVAL);
    struct stat st;
    CHECK(stat(path, &st) != 0); /* nothing was written */
    CHECK(count_temps() == 0);
}

/* ---- failures: missing folder, target is a folder, disk full, killed ---------------- */

static void write_old(const char *path, uint8_t **old, size_t *oldn)
{
    float x[4] = {1, 2, 3, 4};
    int64_t sh[1] = {4};
    ct_tensor t;
    ct_tensor_wrap(&t, x, CT_DTYPE_F32, 1, sh, NULL);
    const char *nm[1] = {"old"};
    CHECK_OK(ct_save_safetensors(path, &t, nm, 1, NULL, NULL, 0, NULL));
    *old = read_all(path, oldn);
}

static void check_old(const char *path, const uint8_t *old, size_t oldn)
{
    size_t n;
    uint8_t *now = read_all(path, &n);
    CHECK(now && n == oldn && memcmp(now, old, n) == 0);
    free(now);
}

static void test_failures(void)
{
    char path[300], missing[300], dirtarget[300];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", tmpdir);
    snprintf(missing, sizeof missing, "%s/no/such/folder/x.safetensors", tmpdir);
    snprintf(dirtarget, sizeof dirtarget, "%s/adir", tmpdir);
    uint8_t *old;
    size_t oldn;
    write_old(path, &old, &oldn);
    chmod(path, 0640);

    int64_t big[1] = {1 << 18}; /* 1 MiB of f32 */
    ct_tensor t;
    CHECK_OK(ct_tensor_zeros(&t, CT_DTYPE_F32, 1, big));
    const char *nm[1] = {"new"};
    CHECK_STATUS(ct_save_safetensors(missing, &t, nm, 1, NULL, NULL, 0, NULL), CT_EIO);
    CHECK(strstr(ct_last_error(), "no/such/folder") != NULL);
    mkdir(dirtarget, 0755);
    for (int anon = 0; anon < 2; anon++) {
        ct_save_options o = ct_save_options_default();
        o.anonymous_temp = anon;
        CHECK_STATUS(ct_save_safetensors(dirtarget, &t, nm, 1, NULL, NULL, 0, &o), CT_EIO);
        CHECK(count_temps() == 0);
    }

    /* Disk full, simulated with the file-size limit: write() fails with EFBIG mid-file. */
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl, lim;
    getrlimit(RLIMIT_FSIZE, &rl);
    lim = rl;
    lim.rlim_cur = 64 << 10;
    for (int anon = 0; anon < 2; anon++) {
        ct_save_options o = ct_save_options_default();
        o.anonymous_temp = anon;
        CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
        CHECK_STATUS(ct_save_safetensors(path, &t, nm, 1, NULL, NULL, 0, &o), CT_EIO);
        setrlimit(RLIMIT_FSIZE, &rl);
        CHECK(strstr(ct_last_error(), "writing") != NULL);
        check_old(path, old, oldn);
        CHECK(count_temps() == 0);
    }
    signal(SIGXFSZ, SIG_DFL);

    /* Killed mid-write (SIGXFSZ's default action): the old file stays; a named temp file is
     * left behind, and the next successful save removes it. An anonymous one leaves none. */
    for (int anon = 0; anon < 2; anon++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            ct_save_options o = ct_save_options_default();
            o.anonymous_temp = anon;
            setrlimit(RLIMIT_FSIZE, &lim);
            ct_save_safetensors(path, &t, nm, 1, NULL, NULL, 0, &o);
            _exit(0); /* not reached: the process dies in write() */
        }
        int st = 0;
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGXFSZ);
        check_old(path, old, oldn);
        CHECK(count_temps() == 1); /* the named one of the first round; anonymous adds none */
    }
    ct_save_options o = ct_save_options_default();
    o.sync = false;
    CHECK_OK(ct_save_safetensors(path, &t, nm, 1, NULL, NULL, 0, &o));
    CHECK(count_temps() == 0);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0640); /* permissions kept */
    ct_tensor_file *f = NULL;
    CHECK_OK(ct_load(path, NULL, &f));
    ct_tensor_info inf;
    CHECK_OK(ct_tensor_file_info(f, 0, &inf));
    CHECK(!strcmp(inf.name, "new") && inf.nbytes == 4u << 18);
    ct_tensor_file_close(f);

    /* A file open (mapped) while it is replaced keeps its old contents. */
    free(old);
    write_old(path, &old, &oldn);
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_OK(ct_save_safetensors(path, &t, nm, 1, NULL, NULL, 0, NULL));
    ct_tensor v;
    CHECK_OK(ct_tensor_file_get(f, "old", &v));
    CHECK(((const float *)v.data)[3] == 4.0f);
    ct_tensor_file_close(f);
    free(old);

    /* A 250-byte file name: the temp name must still fit NAME_MAX. */
    char longp[600];
    int lo_n = snprintf(longp, sizeof longp, "%s/", tmpdir);
    memset(longp + lo_n, 'n', 250);
    longp[lo_n + 250] = 0;
    for (int anon = 0; anon < 2; anon++) {
        ct_save_options lo = ct_save_options_default();
        lo.anonymous_temp = anon;
        CHECK_OK(ct_save_safetensors(longp, &t, nm, 1, NULL, NULL, 0, &lo));
    }
    CHECK_OK(ct_load(longp, NULL, &f));
    ct_tensor_file_close(f);
    unlink(longp);

    /* A relative path (the current folder). */
    char cwd[512];
    ct_tensor_free(&t);
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(tmpdir) == 0);
    float x = 5;
    ct_tensor s;
    ct_tensor_wrap(&s, &x, CT_DTYPE_F32, 0, NULL, NULL);
    const char *sn[1] = {"s"};
    CHECK_OK(ct_save_safetensors("rel.safetensors", &s, sn, 1, NULL, NULL, 0, NULL));
    CHECK_OK(ct_load("rel.safetensors", NULL, &f));
    ct_tensor_file_close(f);
    CHECK(chdir(cwd) == 0);
    CHECK(count_temps() == 0);
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/ct_io_save_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip();
    test_raw();
    test_strided();
    test_bad_args();
    test_failures();
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_report("test_io_save");
}
