// binding.h -- one engine's IOBinding over host memory: every input and output is bound where its
// owner keeps it (the engine's packed buffers, the executor's caches and logits), by address; a
// slot remembers what it bound last, so a buffer whose address and shape did not change since the
// previous step is not bound again.
#ifndef OGA_NATIVE_EXECUTOR_BINDING_H_
#define OGA_NATIVE_EXECUTOR_BINDING_H_

#include <cstdint>
#include <string>

#include "model.h"

namespace native {

// What a binding slot holds: the address and shape bound last (rank 0 with a null address: none).
struct BoundSlot {
  static constexpr size_t kMaxRank = OGA_NATIVE_MAX_ROW_RANK + 1;
  const void* address = nullptr;
  int64_t shape[kMaxRank] = {};
  size_t rank = 0;
};

class HostBinding {
 public:
  explicit HostBinding(Model* model);
  ~HostBinding();
  HostBinding(const HostBinding&) = delete;
  HostBinding& operator=(const HostBinding&) = delete;

  // Binds `name` (an input, or an output when `output`) to the memory at `address`, `rank`
  // dimensions `shape` of element `type`; nothing happens when `slot` already holds that address
  // and shape. A null slot binds unconditionally (caches, bound once). Throws OrtError.
  void Bind(BoundSlot* slot, const std::string& name, int type, const void* address, const int64_t* shape,
            size_t rank, bool output);
  // Runs the session over the binding; returns ONNX Runtime's status (NULL on success; the caller
  // releases it) and adds the time to the model's run_ns.
  OrtStatus* Run();

 private:
  Model* model_;
  OrtIoBinding* binding_ = nullptr;
};

}  // namespace native

#endif  // OGA_NATIVE_EXECUTOR_BINDING_H_
