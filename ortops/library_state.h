/*
 * library_state.h -- process-wide state of the operator library that tests read and set through
 * its exported C functions (register_ops.cpp): whether the portable loops are forced, and how many
 * times an attention call had to copy a whole KV cache (its present output not bound to its past
 * input's memory).
 */
#ifndef OGA_ORTOPS_LIBRARY_STATE_H_
#define OGA_ORTOPS_LIBRARY_STATE_H_

#include <cstdint>

namespace ortops {

// Whether this CPU runs the vector loops (AVX2, FMA and F16C; x86-64 only).
bool CpuHasAvx2FmaF16c();

// True when the portable loops are forced (OGA_ORTOPS_PORTABLE=1 at load, or OgaOrtOpsSetPortable).
bool PortableForced();
void SetPortableForced(bool forced);

void CountCacheCopy();
uint64_t CacheCopies();

}  // namespace ortops

#endif  // OGA_ORTOPS_LIBRARY_STATE_H_
