/*
 * The emulated device's run-time compiler and module loader (tests only; see cuda_runtime.h,
 * "run-time compiled modules"). The compiler and the include directories are fixed at
 * configure time (CT_EMU_CXX, CT_EMU_SRC_DIR: src/, CT_EMU_INC_DIR: tests/cuda_emu); the
 * module links against this library by its path (dladdr), so its references to the emulator
 * (emu_launch, the barriers, threadIdx, ...) resolve to the running copy: the library exports
 * them (tests/cuda_emu/libctorch_cuda_emu.map).
 */
#include "cuda_runtime.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <mutex>
#include <set>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char **environ;

#ifndef CT_EMU_CXX
#define CT_EMU_CXX "c++"
#endif
#ifndef CT_EMU_SRC_DIR
#define CT_EMU_SRC_DIR "src"
#endif
#ifndef CT_EMU_INC_DIR
#define CT_EMU_INC_DIR "tests/cuda_emu"
#endif

struct emu_kernel_handle {
    unsigned magic;
    void (*launch)(const emu_cfg_t *, void **);
    const void *fn;
};
struct emu_library {
    unsigned magic;
    void *dl;
    int fd; /* the memfd it was loaded from, open while loaded: dlopen knows an object by its path
               (/proc/self/fd/N), so a reused N would hand back an earlier module */
    std::vector<emu_kernel_handle *> kernels;
};

namespace {

const unsigned LIB_MAGIC = 0x4c494231u, KERNEL_MAGIC = 0x4b524e31u;
std::mutex rtc_mu;
std::set<const void *> live_kernels, live_libs;
thread_local char load_error[512];

int fail(char *msg, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int fail(char *msg, size_t cap, const char *fmt, ...)
{
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

bool write_all(int fd, const void *p, size_t n)
{
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        c += w, n -= (size_t)w;
    }
    return true;
}

bool read_file(const char *path, void **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    std::vector<char> buf;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) buf.insert(buf.end(), chunk, chunk + n);
    fclose(f);
    if (buf.empty() || !(*out = malloc(buf.size()))) return false;
    memcpy(*out, buf.data(), buf.size());
    *len = buf.size();
    return true;
}

void remove_dir(const char *dir)
{
    const char *names[] = {"module.cpp", "module.so", "log.txt"};
    char p[4200];
    for (const char *n : names) {
        snprintf(p, sizeof p, "%s/%s", dir, n);
        unlink(p);
    }
    rmdir(dir);
}

/* The size of an ELF object from its header (its section headers come last), 0 if not one. */
size_t elf_size(const void *code)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)code;
    if (memcmp(h->e_ident, ELFMAG, SELFMAG) != 0 || h->e_ident[EI_CLASS] != ELFCLASS64) return 0;
    return (size_t)h->e_shoff + (size_t)h->e_shnum * h->e_shentsize;
}

} /* namespace */

const char *emu_rtc_last_error(void)
{
    return load_error;
}

const char *emu_rtc_compiler(void)
{
    return CT_EMU_CXX;
}

int emu_rtc_compile(const char *text, void **image, size_t *len, char *msg, size_t cap)
{
    *image = NULL;
    *len = 0;
    Dl_info self;
    if (!dladdr((const void *)&emu_rtc_compile, &self) || !self.dli_fname)
        return fail(msg, cap, "emulator: cannot find its own library's path (dladdr)");
    const char *tmp = getenv("TMPDIR");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/ctorch-emu-rtc-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) return fail(msg, cap, "emulator: mkdtemp %s: %s", dir, strerror(errno));
    char src[4200], so[4200], logp[4200];
    snprintf(src, sizeof src, "%s/module.cpp", dir);
    snprintf(so, sizeof so, "%s/module.so", dir);
    snprintf(logp, sizeof logp, "%s/log.txt", dir);
    int fd = open(src, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || !write_all(fd, text, strlen(text))) {
        if (fd >= 0) close(fd);
        remove_dir(dir);
        return fail(msg, cap, "emulator: writing %s: %s", src, strerror(errno));
    }
    close(fd);
    const char *argv[] = {CT_EMU_CXX, "-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-w",
                          "-I" CT_EMU_INC_DIR, "-I" CT_EMU_SRC_DIR, "-o", so, src, self.dli_fname, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, logp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        remove_dir(dir);
        return fail(msg, cap, "emulator: cannot run the compiler %s: %s", argv[0], strerror(rc));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    int ret = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char log[2048] = "";
        FILE *f = fopen(logp, "r");
        if (f) {
            size_t n = fread(log, 1, sizeof log - 1, f);
            log[n] = 0;
            fclose(f);
        }
        ret = fail(msg, cap, "emulator: %s failed (status %d): %s", argv[0], status, log);
    } else if (!read_file(so, image, len)) {
        ret = fail(msg, cap, "emulator: reading the compiled module %s", so);
    }
    if (!getenv("CT_EMU_RTC_KEEP")) remove_dir(dir); /* kept for debugging */
    return ret;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code, enum cudaJitOption *, void **, unsigned,
                                enum cudaLibraryOption *, void **, unsigned)
{
    load_error[0] = 0;
    if (!lib || !code) return cudaErrorInvalidValue;
    size_t n = elf_size(code);
    if (n == 0) {
        snprintf(load_error, sizeof load_error, "not an ELF64 shared object");
        return cudaErrorInvalidValue;
    }
    int fd = memfd_create("ctorch-emu-module", MFD_CLOEXEC);
    if (fd < 0) return cudaErrorMemoryAllocation;
    if (!write_all(fd, code, n)) {
        close(fd);
        return cudaErrorMemoryAllocation;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        snprintf(load_error, sizeof load_error, "dlopen: %s", e ? e : "failed");
        close(fd);
        return cudaErrorInvalidValue;
    }
    emu_library *l = new emu_library{LIB_MAGIC, dl, fd, {}};
    std::lock_guard<std::mutex> g(rtc_mu);
    live_libs.insert(l);
    *lib = l;
    return cudaSuccess;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name)
{
    std::lock_guard<std::mutex> g(rtc_mu);
    if (!k || !name || !live_libs.count(lib)) return cudaErrorInvalidValue;
    char ln[256];
    snprintf(ln, sizeof ln, "%s__launch", name);
    void *fn = dlsym(lib->dl, name), *launch = dlsym(lib->dl, ln);
    if (!fn || !launch) return cudaErrorInvalidValue;
    emu_kernel_handle *h = new emu_kernel_handle{KERNEL_MAGIC, (void (*)(const emu_cfg_t *, void **))launch, fn};
    lib->kernels.push_back(h);
    live_kernels.insert(h);
    *k = h;
    return cudaSuccess;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t lib)
{
    std::lock_guard<std::mutex> g(rtc_mu);
    if (!live_libs.count(lib)) return cudaErrorInvalidValue;
    live_libs.erase(lib);
    for (emu_kernel_handle *h : lib->kernels) {
        live_kernels.erase(h);
        h->magic = 0;
        delete h;
    }
    dlclose(lib->dl);
    close(lib->fd);
    lib->magic = 0;
    delete lib;
    return cudaSuccess;
}

const void *emu_rtc_kernel_key(const void *kernel)
{
    std::lock_guard<std::mutex> g(rtc_mu);
    if (live_kernels.count(kernel)) return ((const emu_kernel_handle *)kernel)->fn;
    return kernel;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t smem, cudaStream_t stream)
{
    emu_kernel_handle *h;
    {
        std::lock_guard<std::mutex> g(rtc_mu);
        if (!live_kernels.count(func)) return cudaErrorInvalidValue;
        h = (emu_kernel_handle *)func;
    }
    emu_cfg_t c = emu_cfg(grid, block, smem, stream);
    h->launch(&c, args);
    return cudaSuccess;
}
