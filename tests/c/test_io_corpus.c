/* Every file of the fuzzing seed corpus (tests/fuzz/corpus/safetensors: valid files, hostile
 * files, and regress-* inputs that once broke an invariant) through the checks of both fuzz
 * targets, in the ordinary test run and under ASan+UBSan. A broken invariant aborts. */
#define CT_FUZZ_NO_ENTRY
#include "../fuzz/fuzz_safetensors_header.c"

#include "test_util.h"

#include <dirent.h>

int main(void)
{
    char dir[1024];
    const char *src = getenv("CTORCH_SOURCE_DIR");
    if (src && *src) {
        snprintf(dir, sizeof dir, "%s/tests/fuzz/corpus/safetensors", src);
    } else { /* this file's own folder: <root>/tests/c/ */
        snprintf(dir, sizeof dir, "%s", __FILE__);
        char *cut = strstr(dir, "tests/c/test_io_corpus.c");
        if (cut) strcpy(cut, "tests/fuzz/corpus/safetensors");
    }
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    if (!d) {
        fprintf(stderr, "cannot open the corpus folder %s\n", dir);
        return t_report("test_io_corpus");
    }
    struct dirent *e;
    int files = 0, valid = 0, regress = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (!f) continue;
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc((size_t)n + 1);
        CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
        fclose(f);
        fuzz_safetensors_one(buf, (size_t)n);
        fuzz_header_one(buf, (size_t)n);
        /* The file names say what to expect: v-* valid, h-* and f-* refused. */
        ct_status s = ct_safetensors_validate(buf, (size_t)n, NULL);
        if (!strncmp(e->d_name, "v-", 2)) {
            CHECK(s == CT_OK);
            valid++;
        } else if (!strncmp(e->d_name, "h-", 2) || !strncmp(e->d_name, "f-", 2)) {
            CHECK(s != CT_OK);
        } else if (!strncmp(e->d_name, "regress-", 8)) {
            regress++;
        }
        if (!strncmp(e->d_name, "v-", 2) || !strncmp(e->d_name, "h-", 2)) {
            ct_tensor_file *tf = NULL;
            s = ct_load(path, NULL, &tf);
            ct_tensor_file_close(tf);
            if ((s == CT_OK) != (e->d_name[0] == 'v')) {
                t_failures++;
                fprintf(stderr, "%s: ct_load returned %s\n", e->d_name, ct_status_name(s));
            }
            t_checks++;
        }
        free(buf);
        files++;
    }
    closedir(d);
    CHECK(files >= 60 && valid >= 10);
    printf("corpus: %d files (%d valid, %d regressions)\n", files, valid, regress);
    return t_report("test_io_corpus");
}
