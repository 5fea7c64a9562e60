/* Internal to src/telemetry: the GPU part of a sample (nvml.c). */
#ifndef CT_TELEMETRY_INTERNAL_H
#define CT_TELEMETRY_INTERNAL_H

#include "ctorch/telemetry.h"

/* Fill s->ngpu, s->gpu[] and s->gpu_status through NVML (loaded and initialised once per
 * process by the first call). Never fails: what cannot be read is unavailable, and when no
 * GPU can be listed gpu_status says why. */
void ct_telemetry_read_gpus(ct_telemetry_sample *s);

#endif
