// CUPTI activity API (CUDA 13: records CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
// CUpti_ActivityMemset4, CUpti_ActivityExternalCorrelation):
//   1. cuptiActivityRegisterCallbacks: CUPTI asks for empty buffers (BufferRequested) and hands
//      back full ones (BufferCompleted, possibly on its own thread);
//   2. Start(): cuptiActivityEnable for CONCURRENT_KERNEL (does not serialize kernels), MEMCPY,
//      MEMSET, and with marks RUNTIME, DRIVER (libraries such as cuBLAS launch through the driver
//      API) and EXTERNAL_CORRELATION: CUPTI then precedes each API record made while an external
//      id is pushed on the calling thread with a record linking the API call's correlation id
//      to that id (kineto's way of tagging launches);
//   3. SetMark(m): pops this thread's CUSTOM0 external id (an empty stack is fine) and pushes m;
//      ClearMark() pops it;
//   4. Flush(): cudaDeviceSynchronize (so every launched kernel has completed and been
//      recorded), cuptiActivityFlushAll (a forced flush returns any partly filled buffer),
//      cuptiActivityDisable, then the records BufferCompleted parsed, checked for drops and
//      missing timestamps, each given the mark its correlation id was linked to.
// The callbacks are process-wide C functions without a user pointer, so the one live source is
// found through `g_source` (which is why at most one may exist).
#include "cupti_activity_source.h"

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cupcake/internal/cuda_status.h"
#include "cupti_status.h"

namespace cupcake::kernels::cupti {
namespace {

constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER, CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};
constexpr size_t kKindsWithoutMarks = 3;
constexpr CUpti_ExternalCorrelationKind kMarkKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;
constexpr size_t kBufferBytes = size_t{4} << 20;
constexpr size_t kRecordAlignment = 8;  // CUPTI's ACTIVITY_RECORD_ALIGNMENT

const char* CopyKindName(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    default: return "memcpy";
  }
}

class CuptiActivitySource;
std::atomic<CuptiActivitySource*> g_source{nullptr};

class CuptiActivitySource final : public ActivitySource {
 public:
  explicit CuptiActivitySource(CuptiMarks marks)
      : marks_(marks), kinds_(kKinds, kKinds + (marks == CuptiMarks::kOn ? std::size(kKinds) : kKindsWithoutMarks)) {}
  ~CuptiActivitySource() override {
    if (running_) {
      for (CUpti_ActivityKind k : kinds_) (void)cuptiActivityDisable(k);
      (void)cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    }
    CuptiActivitySource* self = this;
    g_source.compare_exchange_strong(self, nullptr);
  }

  Status Start() override {
    if (running_) return FailedPreconditionError("activity source: Start() twice without Flush()");
    {
      std::lock_guard<std::mutex> lock(mu_);
      records_.clear();
      mark_of_.clear();
      dropped_ = 0;
      incomplete_ = 0;
      parse_error_.clear();
    }
    size_t enabled = 0;
    for (CUpti_ActivityKind k : kinds_) {
      Status s = Enable(k);
      if (!s.ok()) {
        for (size_t i = 0; i < enabled; ++i) (void)cuptiActivityDisable(kinds_[i]);
        return s;
      }
      ++enabled;
    }
    running_ = true;
    return Status::Ok();
  }

  StatusOr<std::vector<KernelActivity>> Flush() override {
    if (!running_) return FailedPreconditionError("activity source: Flush() without Start()");
    running_ = false;
    Status flushed = SynchronizeAndFlushAll();
    Status disabled = Status::Ok();
    for (CUpti_ActivityKind k : kinds_) {
      Status s = Disable(k);
      if (disabled.ok() && !s.ok()) disabled = s;
    }
    CUPCAKE_RETURN_IF_ERROR(flushed);
    CUPCAKE_RETURN_IF_ERROR(disabled);
    std::lock_guard<std::mutex> lock(mu_);
    if (!parse_error_.empty()) return InternalError(parse_error_);
    if (dropped_ > 0)
      return UnavailableError("cupti: dropped " + std::to_string(dropped_) +
                              " activity records; got a full buffer, expected every record delivered");
    if (incomplete_ > 0)
      return UnavailableError("cupti: " + std::to_string(incomplete_) +
                              " activity records without timestamps; got start or end 0, expected both set");
    for (KernelActivity& r : records_) {
      if (auto it = mark_of_.find(r.correlation_id); it != mark_of_.end()) r.mark = it->second;
    }
    return std::move(records_);
  }

  Status SetMark(uint64_t mark) override {
    if (marks_ != CuptiMarks::kOn)
      return FailedPreconditionError(
          "activity source: SetMark: opened without marks; got CuptiMarks::kOff, expected kOn");
    if (mark == 0) return InvalidArgumentError("activity source: SetMark: mark out of range; got 0, expected >= 1");
    CUPCAKE_RETURN_IF_ERROR(ClearMark());
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityPushExternalCorrelationId(kMarkKind, mark));
    return Status::Ok();
  }

  Status ClearMark() override {
    if (marks_ != CuptiMarks::kOn)
      return FailedPreconditionError(
          "activity source: ClearMark: opened without marks; got CuptiMarks::kOff, expected kOn");
    const CUptiResult r = cuptiActivityPopExternalCorrelationId(kMarkKind, nullptr);
    if (r == CUPTI_ERROR_QUEUE_EMPTY) return Status::Ok();  // no mark was set on this thread
    CUPCAKE_CUPTI_RETURN_IF_ERROR(r);
    return Status::Ok();
  }

  // Parses one completed buffer (called by CUPTI, possibly on its thread).
  void Consume(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t valid_bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    CUpti_Activity* record = nullptr;
    for (;;) {
      CUptiResult r = cuptiActivityGetNextRecord(buffer, valid_bytes, &record);
      if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
      if (r != CUPTI_SUCCESS) {
        const char* msg = nullptr;
        if (cuptiGetResultString(r, &msg) != CUPTI_SUCCESS || msg == nullptr) msg = "unknown CUPTI result";
        if (parse_error_.empty()) parse_error_ = std::string("cupti: cuptiActivityGetNextRecord: ") + msg;
        break;
      }
      if (record->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(record);
        if (e->externalKind == kMarkKind) mark_of_[e->correlationId] = e->externalId;
        continue;
      }
      KernelActivity a;
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          a.name = k->name != nullptr ? k->name : "kernel";
          a.start_ns = k->start;
          a.end_ns = k->end;
          a.correlation_id = k->correlationId;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          a.name = CopyKindName(m->copyKind);
          a.start_ns = m->start;
          a.end_ns = m->end;
          a.correlation_id = m->correlationId;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          a.name = "memset";
          a.start_ns = m->start;
          a.end_ns = m->end;
          a.correlation_id = m->correlationId;
          break;
        }
        default: continue;  // API records (enabled for the marks) and kinds not enabled
      }
      if (a.start_ns == 0 || a.end_ns == 0) {
        ++incomplete_;
        continue;
      }
      records_.push_back(std::move(a));
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream_id, &dropped) == CUPTI_SUCCESS) dropped_ += dropped;
  }

 private:
  static Status Enable(CUpti_ActivityKind kind) {
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityEnable(kind));
    return Status::Ok();
  }
  static Status Disable(CUpti_ActivityKind kind) {
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityDisable(kind));
    return Status::Ok();
  }
  static Status SynchronizeAndFlushAll() {
    CUPCAKE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityFlushAll(0));
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    return Status::Ok();
  }

  const CuptiMarks marks_;
  const std::vector<CUpti_ActivityKind> kinds_;  // enabled by Start()
  bool running_ = false;
  std::mutex mu_;  // guards what Consume writes
  std::vector<KernelActivity> records_;
  std::unordered_map<uint32_t, uint64_t> mark_of_;  // correlation id -> mark
  size_t dropped_ = 0;
  size_t incomplete_ = 0;
  std::string parse_error_;
};

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kRecordAlignment, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext context, uint32_t stream_id, uint8_t* buffer, size_t /*size*/,
                              size_t valid_bytes) {
  if (CuptiActivitySource* source = g_source.load(); source != nullptr && valid_bytes > 0)
    source->Consume(context, stream_id, buffer, valid_bytes);
  std::free(buffer);
}

Status RegisterCallbacks() {
  CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted));
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<ActivitySource>> MakeCuptiActivitySource(CuptiMarks marks) {
  auto source = std::make_unique<CuptiActivitySource>(marks);
  CuptiActivitySource* expected = nullptr;
  if (!g_source.compare_exchange_strong(expected, source.get()))
    return FailedPreconditionError("cupti: an activity source exists already; got a second, expected one per process");
  Status s = RegisterCallbacks();
  if (!s.ok()) return s;  // the source's destructor clears g_source
  return std::unique_ptr<ActivitySource>(std::move(source));
}

}  // namespace cupcake::kernels::cupti
