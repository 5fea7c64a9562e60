/* CPU feature detection and the instruction set the kernel tables use (see core.h).
 * Detection runs once per process (pthread_once); ct_set_isa() re-selects. */
#include "core/internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static bool isa_have[CT_ISA_COUNT];     /* what this CPU can run */
static ct_isa isa_best = CT_ISA_SCALAR; /* the best of those */
static ct_isa isa_active = CT_ISA_SCALAR;
static ct_status isa_env_status = CT_OK; /* CT_FORCE_ISA's verdict */
static char isa_env_msg[256];
static char cpu_name[64] = "this CPU";

static const char *const isa_names[CT_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon", "sve"};

static void detect_x86(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    unsigned a, b, c, d; /* F16C via CPUID: clang 14 lacks __builtin_cpu_supports("f16c") */
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    isa_have[CT_ISA_AVX2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    isa_have[CT_ISA_AVX512] = isa_have[CT_ISA_AVX2] && __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                              __builtin_cpu_supports("avx512vl");
    unsigned r[12];
    if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char s[49];
        memcpy(s, r, 48);
        s[48] = 0;
        const char *p = s;
        while (*p == ' ') p++;
        size_t n = strlen(p);
        while (n && p[n - 1] == ' ') n--;
        if (n) {
            if (n >= sizeof cpu_name) n = sizeof cpu_name - 1;
            memcpy(cpu_name, p, n);
            cpu_name[n] = 0;
        }
    }
#endif
}

/* AArch64: the kernel's HWCAP bits (getauxval(AT_HWCAP)): ASIMD is NEON, SVE is SVE (any
 * vector length: the SVE bodies are vector-length agnostic). The name is the MIDR_EL1
 * implementer and part, read through the kernel's emulation of the register (HWCAP_CPUID). */
static size_t sve_bytes;
static void isa_detect(void);

static void detect_aarch64(void)
{
#if defined(__aarch64__) && defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP);
    isa_have[CT_ISA_NEON] = (hw & HWCAP_ASIMD) != 0;
    isa_have[CT_ISA_SVE] = isa_have[CT_ISA_NEON] && (hw & HWCAP_SVE) != 0;
    if (isa_have[CT_ISA_SVE]) sve_bytes = ct_sve_cntb();
    if (hw & HWCAP_CPUID) {
        unsigned long midr;
        __asm__ volatile("mrs %0, MIDR_EL1" : "=r"(midr));
        snprintf(cpu_name, sizeof cpu_name, "AArch64 CPU (implementer 0x%02lx, part 0x%03lx)",
                 (midr >> 24) & 0xff, (midr >> 4) & 0xfff);
    } else {
        snprintf(cpu_name, sizeof cpu_name, "this AArch64 CPU");
    }
#endif
}

size_t ct_cpu_sve_bytes(void)
{
    pthread_once(&isa_once, isa_detect);
    return sve_bytes;
}

static void isa_detect(void)
{
    isa_have[CT_ISA_SCALAR] = true;
    detect_x86();
    detect_aarch64();
    for (int i = 0; i < CT_ISA_COUNT; i++)
        if (isa_have[i] && (i == CT_ISA_SCALAR || i > (int)isa_best)) isa_best = (ct_isa)i;
    isa_active = isa_best;
    const char *force = getenv("CT_FORCE_ISA");
    const char *scalar = getenv("CT_FORCE_SCALAR");
    if (force && force[0]) {
        int found = -1;
        for (int i = 0; i < CT_ISA_COUNT; i++)
            if (!strcmp(force, isa_names[i])) found = i;
        if (found < 0) {
            isa_env_status = CT_EINVAL;
            snprintf(isa_env_msg, sizeof isa_env_msg,
                     "CT_FORCE_ISA=%.40s: expected scalar, avx2, avx512, neon or sve", force);
        } else if (!isa_have[found]) {
            isa_env_status = CT_EUNSUPPORTED;
            snprintf(isa_env_msg, sizeof isa_env_msg, "CT_FORCE_ISA=%s: %s lacks %s (best here: %s)",
                     isa_names[found], cpu_name, isa_names[found], isa_names[isa_best]);
        } else {
            isa_active = (ct_isa)found;
        }
    } else if (scalar && scalar[0] && strcmp(scalar, "0") != 0) {
        isa_active = CT_ISA_SCALAR;
    }
}

ct_isa ct_active_isa(void)
{
    pthread_once(&isa_once, isa_detect);
    return isa_active;
}

ct_status ct_isa_env_status(void)
{
    pthread_once(&isa_once, isa_detect);
    if (isa_env_status != CT_OK) return ct_error(isa_env_status, "%s", isa_env_msg);
    return CT_OK;
}

bool ct_cpu_has_isa(ct_isa isa)
{
    pthread_once(&isa_once, isa_detect);
    return (int)isa >= 0 && (int)isa < CT_ISA_COUNT && isa_have[isa];
}

const char *ct_cpu_name(void)
{
    pthread_once(&isa_once, isa_detect);
    return cpu_name;
}

ct_status ct_set_isa(ct_isa isa)
{
    pthread_once(&isa_once, isa_detect);
    if ((int)isa < 0 || (int)isa >= CT_ISA_COUNT)
        return ct_error(CT_EINVAL, "ct_set_isa: isa must be one of CT_ISA_SCALAR..CT_ISA_SVE, got %d",
                        (int)isa);
    if (!isa_have[isa]) return ct_error(CT_EUNSUPPORTED, "ct_set_isa: %s lacks %s", cpu_name, isa_names[isa]);
    isa_active = isa;
    return CT_OK;
}

const char *ct_isa_name(ct_isa isa)
{
    return (int)isa >= 0 && (int)isa < CT_ISA_COUNT ? isa_names[isa] : "unknown";
}

/* x86: AVX512_BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) with AVX-512 usable; AArch64: the
 * kernel's HWCAP2_BF16 (BFDOT / BFMMLA). */
bool ct_cpu_has_bf16(void)
{
    pthread_once(&isa_once, isa_detect);
#if defined(__x86_64__) && defined(__GNUC__)
    unsigned a, b, c, d;
    return isa_have[CT_ISA_AVX512] && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
#elif defined(__aarch64__) && defined(__linux__)
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1UL << 14)
#endif
    return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
    return false;
#endif
}
