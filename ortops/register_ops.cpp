// The library's entry point: ONNX Runtime's RegisterCustomOps, called by
// SessionOptions.register_custom_ops_library (Python) / RegisterCustomOpsLibrary (C), adds the
// "oga" operator domain to the session options.
#include <string>

#include "ort_api.h"
#include "op_kernel.h"
#include "attention_math.h"
#include "library_state.h"
#include "logits_head.h"
#include "packed_causal_conv.h"
#include "paged_attention.h"
#include "quantized_linear.h"
#include "skip_rms_norm.h"
#include "swiglu.h"
#include "thread_pool.h"

using namespace ortapi;

namespace {

constexpr const char* kDomain = "oga";

OrtStatus* Register(const OrtApi* api, OrtSessionOptions* options) {
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* status = Entry<OrtStatus* (*)(const char*, OrtCustomOpDomain**)>(api, kCreateCustomOpDomain)(
          kDomain, &domain))
    return status;
  const OrtCustomOp* ops[] = {ortops::OpDescriptor<ortops::PagedGroupQueryAttentionFloatCache>::Get(),
                             ortops::OpDescriptor<ortops::PagedGroupQueryAttentionHalfCache>::Get(),
                             ortops::OpDescriptor<ortops::SkipRMSNorm>::Get(),
                             ortops::OpDescriptor<ortops::SwiGlu>::Get(),
                             ortops::OpDescriptor<ortops::LogitsHead>::Get(),
                             ortops::OpDescriptor<ortops::PackedCausalConv>::Get(),
                             ortops::OpDescriptor<ortops::QuantizedLinear>::Get()};
  for (const OrtCustomOp* op : ops) {
    if (OrtStatus* status =
            Entry<OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*)>(api, kCustomOpDomainAdd)(domain, op)) {
      Entry<void (*)(OrtCustomOpDomain*)>(api, kReleaseCustomOpDomain)(domain);
      return status;
    }
  }
  // The session options keep the domain for every session made from them, so it is never
  // released here (ONNX Runtime's own custom-op libraries do the same).
  return Entry<OrtStatus* (*)(OrtSessionOptions*, OrtCustomOpDomain*)>(api, kAddCustomOpDomain)(options, domain);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                              const OrtApiBase* base) {
  const OrtApi* api = base->GetApi(kMinimumApiVersion);
  if (api == nullptr) {
    // The runtime is older than the API the operators need; every version has CreateStatus in
    // slot 0, so the first table still says so.
    const OrtApi* first = base->GetApi(1);
    std::string message = std::string("oga's ONNX Runtime operators need ONNX Runtime 1.") +
                          std::to_string(kMinimumApiVersion) + " or newer; this is " + base->GetVersionString();
    return first ? Entry<OrtStatus* (*)(int, const char*)>(first, kCreateStatus)(kFail, message.c_str()) : nullptr;
  }
  return Register(api, options);
}

// Introspection for oga.ortops and the tests (ctypes on the same loaded library).
#define OGA_ORTOPS_EXPORT extern "C" __attribute__((visibility("default")))

// The operator domain and the ONNX Runtime API version the library asks for.
OGA_ORTOPS_EXPORT const char* OgaOrtOpsDomain() { return kDomain; }
OGA_ORTOPS_EXPORT uint32_t OgaOrtOpsApiVersion() { return kMinimumApiVersion; }
// The loops in use now: "avx2" or "portable" (for head sizes that are multiples of 8).
OGA_ORTOPS_EXPORT const char* OgaOrtOpsMath() { return ortops::SelectMath(8).name; }
// Forces the portable loops (nonzero) or lets the CPU decide (0); for comparing the two.
OGA_ORTOPS_EXPORT void OgaOrtOpsSetPortable(int forced) { ortops::SetPortableForced(forced != 0); }
// Attention calls so far that copied a whole KV cache because present was not bound to past.
OGA_ORTOPS_EXPORT uint64_t OgaOrtOpsCacheCopies() { return ortops::CacheCopies(); }
// The LM head's loops in use now: "avx2" or "portable".
OGA_ORTOPS_EXPORT const char* OgaOrtOpsLogitsHeadMath() { return ortops::SelectLogitsHeadMath().name; }
// The quantized linear's loops in use now: "avx512-vnni", "avx-vnni", "avx2" or "portable".
OGA_ORTOPS_EXPORT const char* OgaOrtOpsQuantizedLinearMath() { return ortops::SelectQuantizedLinearMath().name; }
// Forces the quantized linear's loops by name ("portable", "avx2", "avx-vnni", "avx512-vnni"; NULL or "": the CPU
// decides); returns 0 (and changes nothing) for loops this build or CPU cannot run. For comparing them.
OGA_ORTOPS_EXPORT int OgaOrtOpsSetQuantizedLinearMath(const char* name) {
  return ortops::SetQuantizedLinearMath(name) ? 1 : 0;
}
// The threads of oga's own pool for the operators' parallel loops, the caller included (by default
// the CPUs the process may run on, at most 16; OGA_ORTOPS_THREADS sets it); 0 when they run on ONNX
// Runtime's intra-op pool.
OGA_ORTOPS_EXPORT int OgaOrtOpsThreads() { return ortops::ThreadPoolThreads(); }
// Sets that count (0: ONNX Runtime's pool again); only while no session runs an operator. Returns
// the count now in use.
OGA_ORTOPS_EXPORT int OgaOrtOpsSetThreads(int threads) { return ortops::SetThreadPoolThreads(threads); }
