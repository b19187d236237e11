/*
 * op_kernel.h -- what every oga operator shares: typed access to a kernel call's tensors, errors
 * that become OrtStatus, attribute reading, ORT's intra-op thread pool, per-thread scratch, and
 * the OrtCustomOp descriptor an operator class is registered with.
 *
 * An operator is a class with
 *   static constexpr const char* kName;
 *   static const InputSpec kInputs[];  static constexpr size_t kNumInputs;   (types, optional)
 *   static const OutputSpec kOutputs[]; static constexpr size_t kNumOutputs;
 *   Op(const KernelInfo& info);        reads and checks attributes (throws OpError)
 *   void Compute(KernelCall& call);    one run (throws OpError)
 * and OpDescriptor<Op>::Get() is its OrtCustomOp. Errors thrown by either become an OrtStatus whose
 * message names the operator and the node, so ONNX Runtime reports them from session creation or
 * from run() like any other kernel failure.
 */
#ifndef OGA_ORTOPS_OP_KERNEL_H_
#define OGA_ORTOPS_OP_KERNEL_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "ort_api.h"

namespace ortops {

using ortapi::ElementType;
using ortapi::OrtApi;

// A failure of one operator call; `code` is an ORT error code (invalid argument or failure).
class OpError : public std::runtime_error {
 public:
  explicit OpError(const std::string& message, int code = ortapi::kInvalidArgument)
      : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// One input or output of an operator: element type and whether the node may leave it out.
struct InputSpec {
  ElementType type;
  bool optional;
};
using OutputSpec = InputSpec;

// Throws OpError with ORT's own message when `status` is an error (and releases it).
void CheckStatus(const OrtApi* api, ortapi::OrtStatus* status, const char* what);

const char* ElementTypeName(ElementType type);

// A tensor shape of at most kMaxRank dimensions, held inline (describing a tensor allocates nothing).
class Shape {
 public:
  static constexpr size_t kMaxRank = 8;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) {
    for (int64_t d : dims) push_back(d);
  }
  size_t size() const { return rank_; }
  int64_t operator[](size_t i) const { return dims_[i]; }
  int64_t& operator[](size_t i) { return dims_[i]; }
  const int64_t* data() const { return dims_; }
  int64_t* data() { return dims_; }
  const int64_t* begin() const { return dims_; }
  const int64_t* end() const { return dims_ + rank_; }
  void push_back(int64_t d) {
    if (rank_ == kMaxRank) throw std::length_error("a tensor of more than 8 dimensions");
    dims_[rank_++] = d;
  }
  void resize(size_t rank) {
    if (rank > kMaxRank) throw std::length_error("a tensor of more than 8 dimensions");
    rank_ = rank;
  }
  bool operator==(const Shape& other) const {
    if (rank_ != other.rank_) return false;
    for (size_t i = 0; i < rank_; ++i)
      if (dims_[i] != other.dims_[i]) return false;
    return true;
  }

 private:
  int64_t dims_[kMaxRank] = {};
  size_t rank_ = 0;
};

// A tensor of one call: element type, shape and data (NULL for an absent optional input).
struct Tensor {
  ElementType type = ortapi::kUndefined;
  Shape shape;
  void* data = nullptr;

  bool present() const { return type != ortapi::kUndefined; }
  size_t rank() const { return shape.size(); }
  int64_t dim(size_t i) const { return shape[i]; }
  int64_t elements() const;
  std::string ShapeText() const;  // "[2, 3]"
  template <typename T>
  T* as() const { return static_cast<T*>(data); }
};

class KernelInfo {
 public:
  KernelInfo(const OrtApi* api, const ortapi::OrtKernelInfo* info) : api_(api), info_(info) {}
  int64_t Int(const char* name) const;                  // required
  int64_t Int(const char* name, int64_t fallback) const;
  float Float(const char* name, float fallback) const;
  std::string NodeName() const;
  // Input `index` when the graph holds it as a constant initializer (its data lives as long as the
  // session); !present() otherwise.
  Tensor ConstantInput(size_t index) const;

 private:
  bool TryInt(const char* name, int64_t* out) const;
  const OrtApi* api_;
  const ortapi::OrtKernelInfo* info_;
};

class KernelCall {
 public:
  KernelCall(const OrtApi* api, ortapi::OrtKernelContext* context);
  size_t InputCount() const { return input_count_; }
  // Input `index`; an absent optional input (or one past the node's inputs) is !present().
  Tensor Input(size_t index) const;
  // Output `index` with `shape` (a bound output must have exactly this shape).
  Tensor Output(size_t index, const Shape& shape);
  // The same for an optional output: !present() when the node leaves it out.
  Tensor OptionalOutput(size_t index, const Shape& shape);
  // The number of outputs the node names (the last optional ones it leaves out are not counted).
  size_t OutputCount() const;
  // fn(i) for every i in [0, count), on ONNX Runtime's intra-op threads, or oga's own when enabled
  // (thread_pool.h), the caller's thread taking part; returns when all are done. The first exception
  // any of them throws is rethrown here.
  template <typename Fn>
  void ParallelFor(size_t count, Fn&& fn);

 private:
  void RunParallel(size_t count, void (*body)(void*, size_t), void* state);
  const OrtApi* api_;
  ortapi::OrtKernelContext* context_;
  size_t input_count_ = 0;
};

// Requirement helpers: throw OpError with `message` unless `condition`.
inline void Require(bool condition, const std::string& message) {
  if (!condition) throw OpError(message);
}
void RequireTensor(const Tensor& t, const char* name, ElementType type, size_t rank);

// Per-thread scratch that grows and is never returned: no allocation on a warm path. One arena
// per purpose per thread (the `Tag` type keeps purposes apart).
template <typename Tag, typename T = float>
T* ThreadScratch(size_t count) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

// ---- implementation details --------------------------------------------------------------------

template <typename Fn>
void KernelCall::ParallelFor(size_t count, Fn&& fn) {
  using Body = typename std::remove_reference<Fn>::type;
  struct State {
    Body* fn;
    std::exception_ptr error;
    std::atomic_flag failed = ATOMIC_FLAG_INIT;
  } state;
  state.fn = &fn;
  auto body = [](void* raw, size_t i) {
    State* s = static_cast<State*>(raw);
    try {
      (*s->fn)(i);
    } catch (...) {
      if (!s->failed.test_and_set()) s->error = std::current_exception();
    }
  };
  RunParallel(count, body, &state);
  if (state.error) std::rethrow_exception(state.error);
}

// The OrtCustomOp of operator class Op (one static instance per class).
template <typename Op>
class OpDescriptor {
 public:
  static const ortapi::OrtCustomOp* Get() {
    static const ortapi::OrtCustomOp descriptor = Make();
    return &descriptor;
  }

 private:
  static ortapi::OrtCustomOp Make() {
    ortapi::OrtCustomOp op;
    std::memset(&op, 0, sizeof(op));
    op.version = ortapi::kMinimumApiVersion;
    op.GetName = [](const ortapi::OrtCustomOp*) { return Op::kName; };
    op.GetExecutionProviderType = [](const ortapi::OrtCustomOp*) -> const char* { return nullptr; };
    op.GetInputTypeCount = [](const ortapi::OrtCustomOp*) { return Op::kNumInputs; };
    op.GetInputType = [](const ortapi::OrtCustomOp*, size_t i) { return Op::kInputs[i].type; };
    op.GetInputCharacteristic = [](const ortapi::OrtCustomOp*, size_t i) {
      return Op::kInputs[i].optional ? ortapi::kOptional : ortapi::kRequired;
    };
    op.GetOutputTypeCount = [](const ortapi::OrtCustomOp*) { return Op::kNumOutputs; };
    op.GetOutputType = [](const ortapi::OrtCustomOp*, size_t i) { return Op::kOutputs[i].type; };
    op.GetOutputCharacteristic = [](const ortapi::OrtCustomOp*, size_t i) {
      return Op::kOutputs[i].optional ? ortapi::kOptional : ortapi::kRequired;
    };
    op.GetInputMemoryType = [](const ortapi::OrtCustomOp*, size_t) { return ortapi::kMemTypeDefault; };
    op.CreateKernelV2 = [](const ortapi::OrtCustomOp*, const OrtApi* api, const ortapi::OrtKernelInfo* info,
                           void** kernel) -> ortapi::OrtStatus* {
      KernelInfo ki(api, info);
      std::string node;
      return Guarded(api, node, [&] {
        node = ki.NodeName();
        *kernel = new Instance{api, node, Op(ki)};
      });
    };
    op.KernelComputeV2 = [](void* kernel, ortapi::OrtKernelContext* context) -> ortapi::OrtStatus* {
      Instance* self = static_cast<Instance*>(kernel);
      return Guarded(self->api, self->node, [&] {
        KernelCall call(self->api, context);
        self->op.Compute(call);
      });
    };
    op.KernelDestroy = [](void* kernel) { delete static_cast<Instance*>(kernel); };
    op.GetStartVersion = [](const ortapi::OrtCustomOp*) { return 1; };
    op.GetEndVersion = [](const ortapi::OrtCustomOp*) { return 2147483647; };
    return op;
  }

  struct Instance {
    const OrtApi* api;
    std::string node;
    Op op;
  };

  // Runs fn; what it throws becomes the OrtStatus ONNX Runtime reports (NULL: success). `node` is
  // read after fn fails, so fn may fill it in.
  template <typename Fn>
  static ortapi::OrtStatus* Guarded(const OrtApi* api, const std::string& node, Fn&& fn) {
    try {
      fn();
      return nullptr;
    } catch (const OpError& e) {
      return Fail(api, node, e.what(), e.code());
    } catch (const std::bad_alloc&) {
      return Fail(api, node, "out of memory", ortapi::kFail);
    } catch (const std::exception& e) {
      return Fail(api, node, e.what(), ortapi::kFail);
    }
  }

  static ortapi::OrtStatus* Fail(const OrtApi* api, const std::string& node, const char* what, int code) {
    std::string message = std::string("oga.") + Op::kName;
    if (!node.empty()) message += " node '" + node + "'";
    message += ": ";
    message += what;
    return ortapi::Entry<ortapi::OrtStatus* (*)(int, const char*)>(api, ortapi::kCreateStatus)(code,
                                                                                              message.c_str());
  }
};

}  // namespace ortops

#endif  // OGA_ORTOPS_OP_KERNEL_H_
