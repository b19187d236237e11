#include "binding.h"

#include <algorithm>
#include <chrono>

namespace native {

HostBinding::HostBinding(Model* model) : model_(model) {
  const OrtApi* api = model->api;
  Check(api, Entry<OrtStatus* (*)(OrtSession*, OrtIoBinding**)>(api, kCreateIoBinding)(model->session, &binding_));
}

HostBinding::~HostBinding() {
  if (binding_) Entry<void (*)(OrtIoBinding*)>(model_->api, kReleaseIoBinding)(binding_);
}

void HostBinding::Bind(BoundSlot* slot, const std::string& name, int type, const void* address, const int64_t* shape,
                       size_t rank, bool output) {
  if (slot != nullptr && slot->address == address && slot->rank == rank &&
      std::equal(shape, shape + rank, slot->shape))
    return;
  const OrtApi* api = model_->api;
  size_t bytes = ElementSize(type);
  for (size_t i = 0; i < rank; ++i) bytes *= static_cast<size_t>(shape[i]);
  OrtValue* value = nullptr;
  Check(api, Entry<OrtStatus* (*)(const OrtMemoryInfo*, void*, size_t, const int64_t*, size_t, int, OrtValue**)>(
                 api, kCreateTensorWithDataAsOrtValue)(model_->cpu, const_cast<void*>(address), bytes, shape, rank,
                                                       type, &value));
  // The binding keeps its own reference to the tensor (over the same memory).
  OrtStatus* status = Entry<OrtStatus* (*)(OrtIoBinding*, const char*, const OrtValue*)>(
      api, output ? kBindOutput : kBindInput)(binding_, name.c_str(), value);
  Entry<void (*)(OrtValue*)>(api, kReleaseValue)(value);
  Check(api, status);
  model_->binds.fetch_add(1, std::memory_order_relaxed);
  if (slot != nullptr) {
    slot->address = address;
    slot->rank = rank;
    std::copy(shape, shape + rank, slot->shape);
  }
}

OrtStatus* HostBinding::Run() {
  const OrtApi* api = model_->api;
  auto start = std::chrono::steady_clock::now();
  OrtStatus* status = Entry<OrtStatus* (*)(OrtSession*, const OrtRunOptions*, const OrtIoBinding*)>(
      api, kRunWithBinding)(model_->session, nullptr, binding_);
  auto elapsed = std::chrono::steady_clock::now() - start;
  model_->run_ns.fetch_add(
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()),
      std::memory_order_relaxed);
  return status;
}

}  // namespace native
