/* The SVE vector length (compiled with SVE enabled, called by cpu.c only when getauxval
 * reports HWCAP_SVE). */
#include "core/internal.h"

#include <arm_sve.h>

size_t ct_sve_cntb(void)
{
    return (size_t)svcntb();
}
