// Argument checks of the public calls: pure host code, no CUDA call, one clear message per error.
#pragma once
#include "fa3/fa3.h"

namespace fa3::detail {

// Bytes of one element of a dtype (e4m3 1, fp16 / bf16 2, fp32 4).
int64_t element_bytes(fa3_dtype d);

// Every check that needs no device: shapes, strides, alignment, dtypes, masks, feature combinations.
Status validate_fwd(const fa3_fwd_params* p);
Status validate_bwd(const fa3_bwd_params* p);
Status validate_combine(const fa3_combine_params* p);
Status validate_quantize(const fa3_quantize_params* p);

}  // namespace fa3::detail
