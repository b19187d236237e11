// engine.h -- the executor table's per-engine callbacks (oga_ext.h OgaExtModelExecutor): an engine
// of a paged decoder (paged_engine.cpp) or of a static-batching decoder (static_engine.cpp), each
// with its caches allocated once and its IOBinding.
#ifndef OGA_NATIVE_EXECUTOR_ENGINE_H_
#define OGA_NATIVE_EXECUTOR_ENGINE_H_

#include <string>

#include "binding.h"
#include "model.h"
#include "oga/oga_ext.h"

namespace native {

struct Engine {
  Model* model;
  bool is_static;
  HostBinding binding;

  Engine(Model* m, bool static_batching) : model(m), is_static(static_batching), binding(m) {}
  virtual ~Engine() = default;
};

// A paged engine for `model` (model->is_static false), or nullptr with the reason in `message`
// and the status to return.
Engine* OpenPagedEngine(Model* model, const OgaExtEngineGeometry& geometry, OgaExtExecutionStatus* status,
                        std::string* message);
Engine* OpenStaticEngine(Model* model, const OgaExtEngineGeometry& geometry, OgaExtExecutionStatus* status,
                         std::string* message);

OgaExtExecutionStatus ExecutePaged(Engine* engine, const OgaExtStepInputs* in, OgaExtStepOutputs* out,
                                   std::string* message);
OgaExtExecutionStatus ExecuteStatic(Engine* engine, const OgaExtStaticStepInputs* in, OgaExtStepOutputs* out,
                                    std::string* message);

// "<path>: <tensor> dimension <axis> is <dim> in the graph, but <source>.": the Python executor's
// text for a cache dimension the graph fixes to another value than the engine allocates.
std::string DimensionMismatch(const Model& model, const std::string& tensor, int axis, int64_t dim,
                              const std::string& source);

// The status and text of a failed run: the text the onnxruntime Python binding raises from
// run_with_iobinding ("RuntimeError: Error in execution: <reason>"), classified as the Python
// executor classifies it. Releases `status`.
OgaExtExecutionStatus RunFailure(const OrtApi* api, OrtStatus* status, std::string* message);

// A zeroed host allocation of `bytes` (at least 1), without touching its pages (like numpy.zeros
// on the Python path); nullptr when out of memory.
void* AllocateZeroed(size_t bytes);

}  // namespace native

#endif  // OGA_NATIVE_EXECUTOR_ENGINE_H_
