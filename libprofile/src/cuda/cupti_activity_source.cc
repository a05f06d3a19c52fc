// CUPTI activity API (CUDA 13: records CUpti_ActivityKernel10, CUpti_ActivityMemcpy6,
// CUpti_ActivityMemset4):
//   1. cuptiActivityRegisterCallbacks: CUPTI asks for empty buffers (BufferRequested) and hands
//      back full ones (BufferCompleted, possibly on its own thread);
//   2. Start(): cuptiActivityEnable for CONCURRENT_KERNEL (does not serialize kernels), MEMCPY,
//      MEMSET;
//   3. Flush(): cuptiActivityFlushAll (the caller synchronized the stream first, so the records
//      are complete; a forced flush then returns any partly filled buffer), cuptiActivityDisable,
//      and the records BufferCompleted parsed, checked for drops and missing timestamps.
// The callbacks are process-wide C functions without a user pointer, so the one live source is
// found through `g_source` (which is why at most one may exist).
#include "cupti_activity_source.h"

#include <cupti.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "cupti_status.h"

namespace cupcake::profile::internal {
namespace {

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};
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
  CuptiActivitySource() = default;
  ~CuptiActivitySource() override {
    if (running_) {
      for (CUpti_ActivityKind k : kKinds) (void)cuptiActivityDisable(k);
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
      dropped_ = 0;
      incomplete_ = 0;
      parse_error_.clear();
    }
    size_t enabled = 0;
    for (CUpti_ActivityKind k : kKinds) {
      Status s = Enable(k);
      if (!s.ok()) {
        for (size_t i = 0; i < enabled; ++i) (void)cuptiActivityDisable(kKinds[i]);
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
    Status flushed = FlushAll();
    Status disabled = Status::Ok();
    for (CUpti_ActivityKind k : kKinds) {
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
    return std::move(records_);
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
        default: continue;  // kinds this source does not enable
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
  static Status FlushAll() {
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityFlushAll(0));
    CUPCAKE_CUPTI_RETURN_IF_ERROR(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    return Status::Ok();
  }

  bool running_ = false;
  std::mutex mu_;  // guards what Consume writes
  std::vector<KernelActivity> records_;
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

StatusOr<std::unique_ptr<ActivitySource>> MakeCuptiActivitySource() {
  auto source = std::make_unique<CuptiActivitySource>();
  CuptiActivitySource* expected = nullptr;
  if (!g_source.compare_exchange_strong(expected, source.get()))
    return FailedPreconditionError("cupti: an activity source exists already; got a second, expected one per process");
  Status s = RegisterCallbacks();
  if (!s.ok()) return s;  // the source's destructor clears g_source
  return std::unique_ptr<ActivitySource>(std::move(source));
}

}  // namespace cupcake::profile::internal
