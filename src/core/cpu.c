#include "core/internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static ct_isa isa_best = CT_ISA_SCALAR;
static ct_isa isa_active = CT_ISA_SCALAR;

static void isa_detect(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    unsigned a, b, c, d; /* F16C via CPUID: clang 14 lacks __builtin_cpu_supports("f16c") */
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) isa_best = CT_ISA_AVX2;
#endif
    isa_active = isa_best;
    const char *force = getenv("CT_FORCE_SCALAR");
    if (force && strcmp(force, "0") != 0 && force[0]) isa_active = CT_ISA_SCALAR;
}

ct_isa ct_active_isa(void)
{
    pthread_once(&isa_once, isa_detect);
    return isa_active;
}

bool ct_cpu_has_avx512f(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    static int have = -1;
    if (have < 0) {
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") ? 1 : 0;
    }
    return have == 1;
#else
    return false;
#endif
}

bool ct_use_avx2(void)
{
    return ct_active_isa() == CT_ISA_AVX2;
}

ct_status ct_set_isa(ct_isa isa)
{
    pthread_once(&isa_once, isa_detect);
    if (isa != CT_ISA_SCALAR && isa != CT_ISA_AVX2)
        return ct_error(CT_EINVAL, "ct_set_isa: isa must be CT_ISA_SCALAR or CT_ISA_AVX2, got %d", (int)isa);
    if (isa > isa_best)
        return ct_error(CT_EUNSUPPORTED, "ct_set_isa: this CPU lacks %s", ct_isa_name(isa));
    isa_active = isa;
    return CT_OK;
}

const char *ct_isa_name(ct_isa isa)
{
    return isa == CT_ISA_AVX2 ? "avx2" : "scalar";
}
