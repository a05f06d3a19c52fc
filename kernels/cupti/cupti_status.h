// CUPTI errors -> Status: one macro for this vendor API, naming the call and carrying
// CUPTI's message. Private to the CUPTI activity source. (CUDA runtime errors:
// cupcake/internal/cuda_status.h.)
#pragma once

#include <cupti.h>

#include <string>

#include "cupcake/proto/status.h"

#define CUPCAKE_CUPTI_RETURN_IF_ERROR(call)                                                               \
  do {                                                                                                    \
    CUptiResult cupcake_cupti_res_ = (call);                                                              \
    if (cupcake_cupti_res_ != CUPTI_SUCCESS) {                                                            \
      const char* cupcake_cupti_msg_ = nullptr;                                                           \
      if (cuptiGetResultString(cupcake_cupti_res_, &cupcake_cupti_msg_) != CUPTI_SUCCESS ||               \
          cupcake_cupti_msg_ == nullptr)                                                                  \
        cupcake_cupti_msg_ = "unknown CUPTI result";                                                      \
      return ::cupcake::InternalError(std::string("cupti: ") + #call + ": " + cupcake_cupti_msg_ + " (" + \
                                      std::to_string(static_cast<int>(cupcake_cupti_res_)) + ")");        \
    }                                                                                                     \
  } while (0)
