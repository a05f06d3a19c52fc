#include "cupcake/proto/status.h"

namespace cupcake {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status Status::WithPrefix(const std::string& prefix) const {
  if (ok()) return *this;
  return Status(code_, prefix + ": " + message_).ReportedBy(reporter_);
}

Status Status::ReportedBy(int rank) const {
  Status copy = *this;
  if (!ok()) copy.reporter_ = rank;
  return copy;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

namespace internal {
void CheckFailed(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what.c_str());
  std::abort();
}
}  // namespace internal

}  // namespace cupcake
