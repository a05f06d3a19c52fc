// Status and StatusOr<T>: how every library reports what a user, a file, a peer or a device
// caused. Bugs abort through CUPCAKE_CHECK* instead. No exception crosses a public header.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>
#include <variant>

namespace cupcake {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad input: a file, a flag, a buffer
  kNotFound,  // a curve, a model, a file that is not there
  kAlreadyExists,  // import of something the DB holds, without replace
  kFailedPrecondition,
  kDataLoss,  // corrupt or truncated data
  kUnavailable,  // busy DB, dead peer
  kDeadlineExceeded,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // Returns a copy whose message is "<prefix>: <message>" (the same reporter).
  Status WithPrefix(const std::string& prefix) const;
  std::string ToString() const;

  // Which rank of a job prints this failure. kAnyRank (the default): the rank that returns it.
  // A rank r >= 0: the failure is the same on every rank of the job that returns it (each rank
  // checked the same input alike, or the ranks agreed on it), so rank r prints it and the others
  // exit non-zero without repeating it (their message is the same, or a shorter one naming r).
  static constexpr int kAnyRank = -1;
  int reporter() const { return reporter_; }
  // A copy whose reporter is `rank`.
  Status ReportedBy(int rank) const;
  // Whether the rank `rank` of a job prints this failure: not OK, and its reporter is `rank` or any rank.
  bool PrintedBy(int rank) const { return !ok() && (reporter_ == kAnyRank || reporter_ == rank); }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  int reporter_ = kAnyRank;
};

// A failure every rank of a job finds alike (the same flags checked the same way): rank 0
// reports it, the others keep its code and message and stay quiet (Status::reporter).
inline Status Quiet(const Status& s) { return s.ReportedBy(0); }

inline Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExistsError(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status DataLossError(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DeadlineExceededError(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
inline Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status) : value_(status) { CheckNotOk(); }  // NOLINT: implicit by design
  StatusOr(Status&& status) : value_(std::move(status)) { CheckNotOk(); }  // NOLINT
  StatusOr(const T& value) : value_(value) {}  // NOLINT
  StatusOr(T&& value) : value_(std::move(value)) {}  // NOLINT

  bool ok() const { return std::holds_alternative<T>(value_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(value_); }
  const T& value() const& {
    CheckOk();
    return std::get<T>(value_);
  }
  T& value() & {
    CheckOk();
    return std::get<T>(value_);
  }
  T&& value() && {
    CheckOk();
    return std::get<T>(std::move(value_));
  }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

 private:
  void CheckNotOk() const {
    if (std::get<Status>(value_).ok()) {
      std::fprintf(stderr, "StatusOr constructed from an OK status\n");
      std::abort();
    }
  }
  void CheckOk() const {
    if (!ok()) {
      std::fprintf(stderr, "StatusOr::value() on error: %s\n", std::get<Status>(value_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<Status, T> value_;
};

namespace internal {
[[noreturn]] void CheckFailed(const char* file, int line, const std::string& what);
template <typename A, typename B>
std::string CheckOpMessage(const char* expr, const A& a, const B& b) {
  std::ostringstream os;
  os << expr << " (" << a << " vs " << b << ")";
  return os.str();
}
}  // namespace internal

}  // namespace cupcake

#define CUPCAKE_STATUS_CONCAT_INNER(a, b) a##b
#define CUPCAKE_STATUS_CONCAT(a, b) CUPCAKE_STATUS_CONCAT_INNER(a, b)

#define CUPCAKE_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::cupcake::Status cupcake_status_ = (expr);        \
    if (!cupcake_status_.ok()) return cupcake_status_; \
  } while (0)

#define CUPCAKE_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

#define CUPCAKE_ASSIGN_OR_RETURN(lhs, expr) \
  CUPCAKE_ASSIGN_OR_RETURN_IMPL(CUPCAKE_STATUS_CONCAT(cupcake_statusor_, __LINE__), lhs, expr)

// Bugs: abort with the condition (and both values for the comparison forms).
#define CUPCAKE_CHECK(cond)                                                   \
  do {                                                                        \
    if (!(cond)) ::cupcake::internal::CheckFailed(__FILE__, __LINE__, #cond); \
  } while (0)
#define CUPCAKE_CHECK_OP(a, b, op)                                                                             \
  do {                                                                                                         \
    const auto& cupcake_a_ = (a);                                                                              \
    const auto& cupcake_b_ = (b);                                                                              \
    if (!(cupcake_a_ op cupcake_b_))                                                                           \
      ::cupcake::internal::CheckFailed(                                                                        \
          __FILE__, __LINE__, ::cupcake::internal::CheckOpMessage(#a " " #op " " #b, cupcake_a_, cupcake_b_)); \
  } while (0)
#define CUPCAKE_CHECK_EQ(a, b) CUPCAKE_CHECK_OP(a, b, ==)
#define CUPCAKE_CHECK_NE(a, b) CUPCAKE_CHECK_OP(a, b, !=)
#define CUPCAKE_CHECK_LT(a, b) CUPCAKE_CHECK_OP(a, b, <)
#define CUPCAKE_CHECK_LE(a, b) CUPCAKE_CHECK_OP(a, b, <=)
#define CUPCAKE_CHECK_GE(a, b) CUPCAKE_CHECK_OP(a, b, >=)
