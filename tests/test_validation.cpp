// Argument validation of the public API.  Validation never touches the device or dereferences a
// pointer, so these tests use fake (but 16-byte-aligned) device addresses and run without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "fa3/fa3.h"
#include "fa3/fa3_c.h"
#include "src/api/problem.h"
#include "src/api/validate.h"
#include "src/attention/append_kv.h"
#include "src/attention/split_workspace.h"
#include "tests/valid_args.h"

namespace {

using fa3::test::fake;
using fa3::test::kBatch, fa3::test::kSeqQ, fa3::test::kSeqK, fa3::test::kHeadsQ, fa3::test::kHeadsKv,
    fa3::test::kDim;
using fa3::test::valid_fwd;

template <typename T>
T* offset_bytes(T* ptr, uintptr_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(ptr) + bytes);
}

// The status has the expected code and its message names the field (so a user can find it).
::testing::AssertionResult Fails(const fa3::Status& st, fa3_status code, const std::string& field) {
  if (st.code() != code)
    return ::testing::AssertionFailure() << "code " << st.code() << " instead of " << code << ": '" << st.message()
                                         << "'";
  if (st.message().find(field) == std::string::npos)
    return ::testing::AssertionFailure() << "message '" << st.message() << "' does not name '" << field << "'";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Invalid(const fa3::Status& st, const std::string& field) {
  return Fails(st, FA3_ERROR_INVALID_ARGUMENT, field);
}

::testing::AssertionResult Passes(const fa3::Status& st) {
  if (st.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "code " << st.code() << ": '" << st.message() << "'";
}

class FwdValidation : public ::testing::Test {
 protected:
  fa3::FwdArgs a = valid_fwd();
};

// ------------------------------------------------------------ valid variants ----

TEST_F(FwdValidation, ValidArgsPass) { EXPECT_TRUE(Passes(fa3::validate(a))); }

TEST_F(FwdValidation, ValidWithLse) {
  a.lse = fake<float>(0x500000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, CausalPasses) {
  a.causal = 1;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.window_right = 0;  // explicit, and what causal means anyway
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, SlidingWindowPasses) {
  a.window_left = 64;
  a.window_right = 16;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.causal = 1;
  a.window_right = -1;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, SoftcapAndScalePass) {
  a.softcap = 30.f;
  a.softmax_scale = 0.125f;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// A negative softmax scale runs on the Hopper kernels as |scale| on -Q's copy, first in the
// workspace (append_kv.h): the copy's share (Q's elements, 1 byte each in e4m3), a q that points
// there in Q's layout, the scale's sign dropped; packed queries copy total_q rows.
TEST_F(FwdValidation, NegativeScaleCopiesQ) {
  size_t positive = 0, negative = 0;
  ASSERT_TRUE(Passes(fa3::workspace_size(a, &positive)));
  a.softmax_scale = -0.25f;
  ASSERT_TRUE(Passes(fa3::validate(a)));
  const char* name = nullptr;
  ASSERT_TRUE(Passes(fa3::kernel_name(a, &name)));
  EXPECT_STREQ(name, "hopper");
  EXPECT_TRUE(fa3::attn::has_append(a));
  const fa3::attn::AppendWorkspace w = fa3::attn::append_workspace(a);
  EXPECT_TRUE(w.negate_q && !w.rotate_q && !w.counts);
  const size_t q_bytes = size_t(kBatch) * kSeqQ * kHeadsQ * kDim * 2;
  EXPECT_GE(w.bytes, w.q + q_bytes);
  ASSERT_TRUE(Passes(fa3::workspace_size(a, &negative)));
  EXPECT_EQ(negative, positive + w.bytes);
  fa3::FwdArgs b = a;
  b.workspace = fake(0x700000);
  b.workspace_bytes = w.bytes;
  const fa3_fwd_params r = fa3::attn::attention_params(b, w);
  EXPECT_EQ(r.softmax_scale, 0.25f);
  EXPECT_EQ(r.q.data, fake(0x700000 + w.q));
  EXPECT_EQ(r.q.row_stride, int64_t(kHeadsQ) * kDim);
  EXPECT_EQ(r.q.head_stride, kDim);
  EXPECT_EQ(r.q.batch_stride, int64_t(kSeqQ) * kHeadsQ * kDim);
  EXPECT_EQ(r.k.data, a.k.data);
  EXPECT_EQ(r.seqused_k, nullptr);
  EXPECT_EQ(r.workspace, nullptr);  // (exactly the copy's share: none left for the attention)
  EXPECT_GT(fa3::detail::make_problem(r).scale, 0.f);
  // e4m3: a byte an element; packed queries: total_q rows.
  fa3::FwdArgs e = a;
  e.dtype = FA3_DTYPE_E4M3;
  e.cu_seqlens_q = fake<const int32_t>(0x660000);
  e.cu_seqlens_k = fake<const int32_t>(0x670000);
  e.total_q = 300;
  e.total_k = 700;
  ASSERT_TRUE(Passes(fa3::validate(e)));
  const fa3::attn::AppendWorkspace we = fa3::attn::append_workspace(e);
  EXPECT_GE(we.bytes - we.q, size_t(300) * kHeadsQ * kDim);
  EXPECT_LT(we.bytes - we.q, size_t(300) * kHeadsQ * kDim + 256);
  // -0.0 is the default scale, as 0 is: no copy.
  a.softmax_scale = -0.f;
  EXPECT_FALSE(fa3::attn::has_append(a));
}

TEST_F(FwdValidation, VarlenPassesAndIgnoresBatchStride) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_q = kBatch * kSeqQ;
  a.total_k = kBatch * kSeqK;
  a.q.batch_stride = a.k.batch_stride = a.v.batch_stride = a.out.batch_stride = 3;  // ignored when packed
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// Packed rows with every optional per-sequence count.
TEST_F(FwdValidation, VarlenWithSequsedAndLsePasses) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.seqused_q = fake<const int32_t>(0x620000);
  a.seqused_k = fake<const int32_t>(0x630000);
  a.total_q = kSeqQ;  // may hold just the longest sequence
  a.total_k = kSeqK;
  a.lse = fake<float>(0x500000);
  a.causal = 1;
  a.window_left = 100;
  a.softcap = 30.f;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// cu_seqlens_q with dense K/V: seqused_k gives each sequence's keys (total_k is then ignored).
TEST_F(FwdValidation, CuSeqlensQWithSequsedKPasses) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.seqused_k = fake<const int32_t>(0x610000);
  a.total_q = 1000;
  a.total_k = 0;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, CuSeqlensKOnlyPasses) {
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_k = kBatch * kSeqK;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, SequsedWithoutCuSeqlensPasses) {
  a.seqused_q = fake<const int32_t>(0x620000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.seqused_k = fake<const int32_t>(0x630000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.seqused_q = nullptr;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// total_q / total_k describe packed tensors only: ignored (any value) without cu_seqlens.
TEST_F(FwdValidation, TotalsIgnoredWithoutCuSeqlens) {
  a.total_q = -5;
  a.total_k = 0;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.seqused_q = fake<const int32_t>(0x620000);
  a.seqused_k = fake<const int32_t>(0x630000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, PagedKvPasses) {
  a.page_table = fake<const int32_t>(0x700000);
  a.page_size = 64;
  a.num_pages = 16;
  a.page_table_batch_stride = kSeqK / 64;
  a.seqused_k = fake<const int32_t>(0x710000);
  a.k = fa3::bshd(fake(0x200000), 64, kHeadsKv, kDim);  // [num_pages, page_size, heads_kv, d]
  a.v = fa3::bshd(fake(0x300000), 64, kHeadsKv, kDim);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, PageFieldsIgnoredWithoutPageTable) {
  a.page_size = 0;
  a.num_pages = -1;
  a.page_table_batch_stride = -5;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, E4m3WithDescalesPasses) {
  a.dtype = FA3_DTYPE_E4M3;
  a.out_dtype = FA3_DTYPE_BF16;
  a.q_descale = fake<const float>(0x800000);
  a.k_descale = fake<const float>(0x800100);
  a.v_descale = fake<const float>(0x800200);
  a.descale_batch_stride = kHeadsKv;
  a.descale_head_stride = 1;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  // Softcap on the FP8 Hopper kernels, with per-head descales and with block descales.
  a.softcap = 30.f;
  const char* name = nullptr;
  ASSERT_TRUE(Passes(fa3::kernel_name(a, &name)));
  EXPECT_STREQ(name, "hopper");
  static const float kFactors[1] = {1.f};
  a.k_block_descale = {kFactors, 0, 0, 128, (kSeqK + 127) / 128};
  ASSERT_TRUE(Passes(fa3::kernel_name(a, &name)));
  EXPECT_STREQ(name, "hopper");
}

// e4m3 K/V in pages that are not a multiple of 16 rows run on the Hopper kernel too (gathered row
// by row, kv_gather.cuh), as do pages of 16.
TEST_F(FwdValidation, E4m3GatheredPagesOnHopper) {
  a.dtype = FA3_DTYPE_E4M3;
  a.out_dtype = FA3_DTYPE_BF16;
  a.page_table = fake<const int32_t>(0x700000);
  a.num_pages = 64;
  a.page_table_batch_stride = 256;
  const char* name = nullptr;
  for (int page : {1, 7, 24, 16}) {
    a.page_size = page;
    ASSERT_TRUE(Passes(fa3::kernel_name(a, &name))) << page;
    EXPECT_STREQ(name, "hopper") << page;
  }
}

TEST_F(FwdValidation, MqaPasses) {
  a.heads_kv = 1;
  a.k = fa3::bshd(fake(0x200000), kSeqK, 1, kDim);
  a.v = fa3::bshd(fake(0x300000), kSeqK, 1, kDim);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, MhaPasses) {
  a.heads_kv = kHeadsQ;
  a.k = fa3::bshd(fake(0x200000), kSeqK, kHeadsQ, kDim);
  a.v = fa3::bshd(fake(0x300000), kSeqK, kHeadsQ, kDim);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, BhsdStridedLayoutPasses) {
  // [batch, heads, seqlen, d] memory order expressed through the BSHD strides.
  auto bhsd = [](void* data, int64_t s, int64_t h, int64_t d) { return fa3_tensor{data, h * s * d, d, s * d}; };
  a.q = bhsd(fake(0x100000), kSeqQ, kHeadsQ, kDim);
  a.k = bhsd(fake(0x200000), kSeqK, kHeadsKv, kDim);
  a.v = bhsd(fake(0x300000), kSeqK, kHeadsKv, kDim);
  a.out = bhsd(fake(0x400000), kSeqQ, kHeadsQ, kDim);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, DifferentHeadDimsPass) {
  a.head_dim_qk = 192;
  a.head_dim_v = 128;
  a.q = fa3::bshd(fake(0x100000), kSeqQ, kHeadsQ, 192);
  a.k = fa3::bshd(fake(0x200000), kSeqK, kHeadsKv, 192);
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, BroadcastInputsPass) {
  // Inputs may alias themselves: one K/V head broadcast to every kv head, one key row to every row.
  a.k.head_stride = 0;
  a.v.row_stride = 0;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, WorkspaceWithBytesPasses) {
  a.workspace = fake(0x900000);
  a.workspace_bytes = 4096;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, NumSplitsZeroAndOnePass) {
  a.num_splits = 0;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.num_splits = 1;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// ------------------------------------------------------- one bad argument each ----

TEST(FwdValidationCAbi, NullParams) {
  EXPECT_EQ(fa3_fwd_validate(nullptr), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa3_last_error()).find("params"), std::string::npos) << fa3_last_error();
}

TEST_F(FwdValidation, WrongStructSize) {
  a.struct_size = sizeof(fa3_fwd_params) - 8;
  EXPECT_TRUE(Invalid(fa3::validate(a), "struct_size"));
  EXPECT_TRUE(Invalid(fa3::validate(a), "fa3_fwd_params_init"));
}

TEST_F(FwdValidation, BadDtype) {
  a.dtype = a.out_dtype = FA3_DTYPE_FP32;
  EXPECT_TRUE(Invalid(fa3::validate(a), "dtype"));
}

TEST_F(FwdValidation, BadOutDtype) {
  a.out_dtype = FA3_DTYPE_FP16;
  EXPECT_TRUE(Invalid(fa3::validate(a), "out_dtype"));
}

TEST_F(FwdValidation, E4m3OutDtypeMustBeBf16) {
  a.dtype = a.out_dtype = FA3_DTYPE_E4M3;
  EXPECT_TRUE(Invalid(fa3::validate(a), "out_dtype"));
}

TEST_F(FwdValidation, BatchZero) {
  a.batch = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "batch"));
}

TEST_F(FwdValidation, NegativeSeqlenQ) {
  a.seqlen_q = -1;
  EXPECT_TRUE(Invalid(fa3::validate(a), "seqlen_q"));
}

TEST_F(FwdValidation, SeqlenKZero) {
  a.seqlen_k = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "seqlen_k"));
}

TEST_F(FwdValidation, HeadsQNotMultipleOfHeadsKv) {
  a.heads_kv = 3;
  EXPECT_TRUE(Invalid(fa3::validate(a), "heads_q"));
  EXPECT_TRUE(Invalid(fa3::validate(a), "heads_kv"));
}

TEST_F(FwdValidation, HeadsKvZero) {
  a.heads_kv = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "heads_kv"));
}

TEST_F(FwdValidation, HeadDimTooLarge) {
  a.head_dim_qk = 300;
  EXPECT_TRUE(Invalid(fa3::validate(a), "head_dim_qk"));
}

TEST_F(FwdValidation, HeadDimNotMultipleOf8) {
  a.head_dim_qk = 100;
  EXPECT_TRUE(Invalid(fa3::validate(a), "head_dim_qk"));
}

TEST_F(FwdValidation, HeadDimVBad) {
  a.head_dim_v = 20;
  EXPECT_TRUE(Invalid(fa3::validate(a), "head_dim_v"));
}

TEST_F(FwdValidation, E4m3HeadDimNotMultipleOf16) {
  a.dtype = FA3_DTYPE_E4M3;
  a.head_dim_qk = 72;
  EXPECT_TRUE(Invalid(fa3::validate(a), "head_dim_qk"));
}

TEST_F(FwdValidation, NullQData) {
  a.q.data = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(a), "q.data"));
}

TEST_F(FwdValidation, NullKData) {
  a.k.data = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(a), "k.data"));
}

TEST_F(FwdValidation, NullVData) {
  a.v.data = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(a), "v.data"));
}

TEST_F(FwdValidation, NullOutData) {
  a.out.data = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(a), "out.data"));
}

TEST_F(FwdValidation, MisalignedQ) {
  a.q.data = offset_bytes(a.q.data, 2);
  EXPECT_TRUE(Invalid(fa3::validate(a), "q.data"));
}

TEST_F(FwdValidation, MisalignedK) {
  a.k.data = offset_bytes(a.k.data, 2);
  EXPECT_TRUE(Invalid(fa3::validate(a), "k.data"));
}

TEST_F(FwdValidation, MisalignedV) {
  a.v.data = offset_bytes(a.v.data, 2);
  EXPECT_TRUE(Invalid(fa3::validate(a), "v.data"));
}

TEST_F(FwdValidation, MisalignedOut) {
  a.out.data = offset_bytes(a.out.data, 2);
  EXPECT_TRUE(Invalid(fa3::validate(a), "out.data"));
}

TEST_F(FwdValidation, RowStrideNotMultipleOf8) {
  a.q.row_stride += 4;
  EXPECT_TRUE(Invalid(fa3::validate(a), "q.row_stride"));
}

TEST_F(FwdValidation, E4m3RowStrideNotMultipleOf16) {
  a.dtype = FA3_DTYPE_E4M3;
  a.k.row_stride += 8;  // 16 bytes of bf16 but only 8 bytes of e4m3
  EXPECT_TRUE(Invalid(fa3::validate(a), "k.row_stride"));
}

TEST_F(FwdValidation, NegativeHeadStride) {
  a.k.head_stride = -kDim;
  EXPECT_TRUE(Invalid(fa3::validate(a), "k.head_stride"));
}

TEST_F(FwdValidation, BatchStrideMisaligned) {
  a.v.batch_stride += 4;
  EXPECT_TRUE(Invalid(fa3::validate(a), "v.batch_stride"));
}

TEST_F(FwdValidation, OverlappingOutStrides) {
  a.out.row_stride = 64;  // < head_dim_v = 128: rows overlap
  const fa3::Status st = fa3::validate(a);
  EXPECT_TRUE(Invalid(st, "out.row_stride"));
  EXPECT_TRUE(Invalid(st, "overlap"));
}

TEST_F(FwdValidation, OutHeadStrideZeroOverlaps) {
  a.out.head_stride = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "out.head_stride"));
}

TEST_F(FwdValidation, OutBatchOverlapsRows) {
  a.out.batch_stride = kHeadsQ * kDim;  // batch 1 starts at row 1 of batch 0
  EXPECT_TRUE(Invalid(fa3::validate(a), "out.batch_stride"));
}

TEST_F(FwdValidation, MisalignedLse) {
  a.lse = offset_bytes(fake<float>(0x500000), 2);
  EXPECT_TRUE(Invalid(fa3::validate(a), "lse"));
}

TEST_F(FwdValidation, NanSoftmaxScale) {
  a.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(Invalid(fa3::validate(a), "softmax_scale"));
}

TEST_F(FwdValidation, InfSoftcap) {
  a.softcap = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(Invalid(fa3::validate(a), "softcap"));
}

TEST_F(FwdValidation, NegativeSoftcap) {
  a.softcap = -1.f;
  EXPECT_TRUE(Invalid(fa3::validate(a), "softcap"));
}

TEST_F(FwdValidation, WindowLeftMinus2) {
  a.window_left = -2;
  EXPECT_TRUE(Invalid(fa3::validate(a), "window_left"));
}

TEST_F(FwdValidation, WindowRightMinus2) {
  a.window_right = -2;
  EXPECT_TRUE(Invalid(fa3::validate(a), "window_right"));
}

TEST_F(FwdValidation, CausalWithWindowRight5) {
  a.causal = 1;
  a.window_right = 5;
  const fa3::Status st = fa3::validate(a);
  EXPECT_TRUE(Invalid(st, "window_right"));
  EXPECT_TRUE(Invalid(st, "causal"));
}

TEST_F(FwdValidation, Causal2) {
  a.causal = 2;
  EXPECT_TRUE(Invalid(fa3::validate(a), "causal"));
}

// Without cu_seqlens_k or seqused_k nothing says where a packed sequence's keys end.
TEST_F(FwdValidation, CuSeqlensQWithoutKeyCounts) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.total_q = kBatch * kSeqQ;
  EXPECT_TRUE(Invalid(fa3::validate(a), "cu_seqlens_q"));
  a.seqused_q = fake<const int32_t>(0x620000);  // query counts do not help
  EXPECT_TRUE(Invalid(fa3::validate(a), "cu_seqlens_q"));
  a.seqused_k = fake<const int32_t>(0x630000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.seqused_k = nullptr;
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_k = kBatch * kSeqK;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, TotalQRequiredWithCuSeqlensQ) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_k = kBatch * kSeqK;
  for (int32_t bad : {0, -1, std::numeric_limits<int32_t>::min()}) {
    a.total_q = bad;
    const fa3::Status st = fa3::validate(a);
    EXPECT_TRUE(Invalid(st, "total_q")) << bad;
    EXPECT_TRUE(Invalid(st, ">= 1")) << bad;
  }
  a.total_q = kSeqQ;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, TotalKRequiredWithCuSeqlensK) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_q = kBatch * kSeqQ;
  for (int32_t bad : {0, -7}) {
    a.total_k = bad;
    const fa3::Status st = fa3::validate(a);
    EXPECT_TRUE(Invalid(st, "total_k")) << bad;
    EXPECT_TRUE(Invalid(st, ">= 1")) << bad;
  }
  a.cu_seqlens_q = nullptr;  // dense queries, packed keys: still required
  a.total_k = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "total_k"));
  a.total_k = kSeqK;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// The overlap check of a packed O spans its total_q rows, not seqlen_q (the longest sequence).
TEST_F(FwdValidation, PackedOutOverlapUsesTotalQ) {
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_q = 3 * kSeqQ;
  a.total_k = kBatch * kSeqK;
  // Head-major packed O ([heads][total_q][d]) whose heads are only seqlen_q rows apart.
  a.out = fa3_tensor{fake(0x400000), 0, kDim, int64_t(kSeqQ) * kDim};
  const fa3::Status st = fa3::validate(a);
  EXPECT_TRUE(Invalid(st, "out.head_stride"));
  EXPECT_TRUE(Invalid(st, "overlap"));
  a.out.head_stride = int64_t(a.total_q) * kDim;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  // Row-major packed O whose rows hold only one head's worth: rows overlap across total_q.
  a.out = fa3_tensor{fake(0x400000), 0, kDim, kDim};
  EXPECT_TRUE(Invalid(fa3::validate(a), "overlap"));
}

TEST_F(FwdValidation, PageTableWithCuSeqlensK) {
  a.page_table = fake<const int32_t>(0x700000);
  a.page_size = 64;
  a.num_pages = 16;
  a.page_table_batch_stride = 4;
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_k = kBatch * kSeqK;  // otherwise valid packed keys: only the combination is wrong
  const fa3::Status st = fa3::validate(a);
  EXPECT_TRUE(Invalid(st, "page_table"));
  EXPECT_TRUE(Invalid(st, "cu_seqlens_k"));
}

TEST_F(FwdValidation, PageSizeZero) {
  a.page_table = fake<const int32_t>(0x700000);
  a.page_size = 0;
  a.num_pages = 16;
  a.page_table_batch_stride = 4;
  EXPECT_TRUE(Invalid(fa3::validate(a), "page_size"));
}

TEST_F(FwdValidation, NumPagesZero) {
  a.page_table = fake<const int32_t>(0x700000);
  a.page_size = 64;
  a.num_pages = 0;
  a.page_table_batch_stride = 4;
  EXPECT_TRUE(Invalid(fa3::validate(a), "num_pages"));
}

TEST_F(FwdValidation, PageTableBatchStrideTooSmall) {
  a.page_table = fake<const int32_t>(0x700000);
  a.page_size = 100;  // ceil(256 / 100) = 3 pages per sequence
  a.num_pages = 16;
  a.page_table_batch_stride = 2;
  EXPECT_TRUE(Invalid(fa3::validate(a), "page_table_batch_stride"));
  a.page_table_batch_stride = 3;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, DescaleWithBf16) {
  a.k_descale = fake<const float>(0x800100);
  EXPECT_TRUE(Invalid(fa3::validate(a), "k_descale"));
}

TEST_F(FwdValidation, NegativeDescaleStride) {
  a.dtype = FA3_DTYPE_E4M3;
  a.q_descale = fake<const float>(0x800000);
  a.descale_head_stride = -1;
  EXPECT_TRUE(Invalid(fa3::validate(a), "descale_head_stride"));
}

// ---- FP8 block descales (fa3_block_scales) ----
void set_block_descales(fa3::FwdArgs& a) {
  a.dtype = FA3_DTYPE_E4M3;
  a.out_dtype = FA3_DTYPE_BF16;
  a.q_block_descale = {fake<const float>(0x810000), kHeadsQ * 2, 2, 64, 2};  // ceil(128 / 64)
  a.k_block_descale = {fake<const float>(0x820000), kHeadsKv * 2, 2, 128, 2};  // ceil(256 / 128)
  a.v_block_descale = {fake<const float>(0x830000), kHeadsKv, 1, 256, 1};
}

TEST_F(FwdValidation, E4m3WithBlockDescalesPasses) {
  set_block_descales(a);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.q_block_descale.block_size = 1;  // per token
  a.q_block_descale.num_blocks = kSeqQ;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, BlockDescalesWithBf16) {
  a.v_block_descale = {fake<const float>(0x830000), kHeadsKv, 1, 256, 1};
  EXPECT_TRUE(Invalid(fa3::validate(a), "v_block_descale.data is only used with dtype e4m3"));
}

TEST_F(FwdValidation, BlockDescaleSizes) {
  set_block_descales(a);
  a.k_block_descale.block_size = 64;  // not whole 128-key blocks
  EXPECT_TRUE(Invalid(fa3::validate(a), "k_block_descale.block_size"));
  set_block_descales(a);
  a.q_block_descale.block_size = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "q_block_descale.block_size"));
  set_block_descales(a);
  a.v_block_descale.block_size = 128;  // now 2 blocks are needed, 1 given
  EXPECT_TRUE(Invalid(fa3::validate(a), "v_block_descale.num_blocks"));
  set_block_descales(a);
  a.k_block_descale.head_stride = -1;
  EXPECT_TRUE(Invalid(fa3::validate(a), "k_block_descale.head_stride"));
  set_block_descales(a);
  a.q_block_descale.data = offset_bytes(a.q_block_descale.data, 2);
  EXPECT_TRUE(Invalid(fa3::validate(a), "q_block_descale.data must be 4-byte aligned"));
}

// A caller built before the block descales passes the older struct_size; whatever lies past its
// struct is not read.
TEST_F(FwdValidation, StructSizeBeforeBlockDescalesIsAccepted) {
  fa3_fwd_params p = a;
  p.struct_size = FA3_FWD_PARAMS_SIZE_V1;
  p.q_block_descale = {fake<const float>(0x810001), -5, -5, 0, 0};  // garbage an older caller has there
  EXPECT_EQ(fa3_fwd_validate(&p), FA3_OK) << fa3_last_error();
  p.struct_size = FA3_FWD_PARAMS_SIZE_V1 + 4;
  EXPECT_EQ(fa3_fwd_validate(&p), FA3_ERROR_INVALID_ARGUMENT);
}


TEST_F(FwdValidation, SinksAligned) {
  a.sinks = fake<const float>(0x810000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.sinks = fake<const float>(0x810002);
  EXPECT_TRUE(Invalid(fa3::validate(a), "sinks"));
}

// ---- the KV-cache append with rotary ----
class AppendValidation : public FwdValidation {
 protected:
  void SetUp() override { a = fa3::test::with_append(a, 4); }
};

TEST_F(AppendValidation, ValidArgsPass) {
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.rotary_cos = a.rotary_sin = nullptr;  // append without rotary
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.k_new = a.v_new = fa3_tensor{};  // cache_seqlens alone: the keys each sequence has
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// e4m3 caches take cache_seqlens and new keys and values (e4m3 bytes under the cache's descales,
// copied as given); a rotation would round them a second time: refused by name.
TEST_F(AppendValidation, E4m3CachesTakeNewKeysNotRotary) {
  a.dtype = FA3_DTYPE_E4M3;
  a.out_dtype = FA3_DTYPE_BF16;
  EXPECT_TRUE(Fails(fa3::validate(a), FA3_ERROR_NOT_SUPPORTED, "rotary_cos / rotary_sin with dtype e4m3"));
  a.rotary_cos = a.rotary_sin = nullptr;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.k_new = a.v_new = fa3_tensor{};
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// What the attention reads after the append (attention_params): the keys per sequence are the
// append's counts with new keys, cache_seqlens without them, and the caller's seqused_k with a
// rotation alone (no cache_seqlens).
TEST_F(AppendValidation, AttentionSeesTheKeysEachSequenceHas) {
  const fa3::attn::AppendWorkspace w = fa3::attn::append_workspace(a);
  fa3::FwdArgs b = a;
  b.workspace = fake(0x700000);
  b.workspace_bytes = w.bytes;
  EXPECT_EQ(fa3::attn::attention_params(b, w).seqused_k, fake<const int32_t>(0x700000 + w.seqused));
  b.k_new = b.v_new = fa3_tensor{};
  EXPECT_EQ(fa3::attn::attention_params(b, fa3::attn::append_workspace(b)).seqused_k, a.cache_seqlens);
  b.cache_seqlens = nullptr;
  b.seqused_k = fake<const int32_t>(0x650000);
  ASSERT_TRUE(Passes(fa3::validate(b)));
  EXPECT_EQ(fa3::attn::attention_params(b, fa3::attn::append_workspace(b)).seqused_k, b.seqused_k);
}

TEST_F(AppendValidation, BadFieldsAreNamed) {
  auto invalid_with = [&](auto edit, const char* field) {
    fa3::FwdArgs b = a;
    edit(b);
    return Invalid(fa3::validate(b), field);
  };
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.seqused_k = fake<const int32_t>(0x650000); }, "seqused_k"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.cache_seqlens = nullptr; }, "cache_seqlens"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.v_new.data = nullptr; }, "v_new.data"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.seqlen_new = 0; }, "seqlen_new"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.k_new.row_stride = 3; }, "k_new.row_stride"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.rotary_sin = nullptr; }, "rotary_sin"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.rotary_dim = 63; }, "rotary_dim"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.rotary_dim = 2 * kDim; }, "rotary_dim"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.rotary_rows = kSeqK - 1; }, "rotary_rows"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.rotary_row_stride = 31; }, "rotary_row_stride"));
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.rotary_interleaved = 2; }, "rotary_interleaved"));
  // The cache is written: a K broadcast over its heads would have them overwrite each other.
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.k.head_stride = 0; }, "k strides"));
  // Packed new keys: their count and table are named; without new keys the table is refused.
  EXPECT_TRUE(invalid_with([](fa3::FwdArgs& b) { b.cu_seqlens_new = fake<const int32_t>(0x680000); }, "total_new"));
  EXPECT_TRUE(invalid_with(
      [](fa3::FwdArgs& b) {
        b.cu_seqlens_new = fake<const int32_t>(0x680002);
        b.total_new = 5;
      },
      "cu_seqlens_new"));
  EXPECT_TRUE(invalid_with(
      [](fa3::FwdArgs& b) {
        b.k_new = b.v_new = fa3_tensor{};
        b.cu_seqlens_new = fake<const int32_t>(0x680000);
      },
      "cu_seqlens_new"));
  fa3::FwdArgs b = a;
  b.cu_seqlens_q = fake<const int32_t>(0x660000);
  b.cu_seqlens_k = fake<const int32_t>(0x670000);
  b.total_q = b.total_k = kBatch * kSeqQ;
  EXPECT_TRUE(Fails(fa3::validate(b), FA3_ERROR_NOT_SUPPORTED, "cu_seqlens_k"));
}

// Left-padded caches (leftpad_k) become packed keys before the attention: each sequence's keys
// start at b * (K's batch stride in rows) + leftpad_k[b], counted by the append kernel into the
// workspace; rotary_seqlens are rotary positions and need the tables.
TEST_F(AppendValidation, LeftPaddingAndRotaryPositions) {
  a.leftpad_k = fake<const int32_t>(0x690000);
  a.rotary_seqlens = fake<const int32_t>(0x6a0000);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  const fa3::attn::AppendWorkspace w = fa3::attn::append_workspace(a);
  EXPECT_TRUE(w.counts);
  EXPECT_GE(w.q, w.cu_k + (kBatch + 1) * 4);
  fa3::FwdArgs b = a;
  b.workspace = fake(0x700000);
  b.workspace_bytes = w.bytes;
  const fa3_fwd_params r = fa3::attn::attention_params(b, w);
  EXPECT_EQ(r.cu_seqlens_k, fake<const int32_t>(0x700000 + w.cu_k));
  EXPECT_EQ(r.seqused_k, fake<const int32_t>(0x700000 + w.seqused));
  EXPECT_EQ(r.total_k, kBatch * kSeqK);  // the last sequence's rows end at seqlen_k
  EXPECT_EQ(r.leftpad_k, nullptr);
  EXPECT_EQ(r.rotary_seqlens, nullptr);
  // Left padding alone (no new keys, no rotary, the keys as seqused_k) still runs the kernel.
  b.k_new = b.v_new = fa3_tensor{};
  b.rotary_cos = b.rotary_sin = nullptr;
  b.rotary_seqlens = nullptr;
  b.cache_seqlens = nullptr;
  b.seqused_k = fake<const int32_t>(0x650000);
  ASSERT_TRUE(Passes(fa3::validate(b)));
  EXPECT_TRUE(fa3::attn::has_append(b));
  // A longer batch stride (a cache with more rows than seqlen_k): the rows per sequence follow it.
  b.k = fa3::bshd(fake(0x200000), kSeqK + 10, kHeadsKv, kDim);
  b.v = fa3::bshd(fake(0x300000), kSeqK + 10, kHeadsKv, kDim);
  ASSERT_TRUE(Passes(fa3::validate(b)));
  EXPECT_EQ(fa3::attn::attention_params(b, fa3::attn::append_workspace(b)).total_k, (kBatch - 1) * (kSeqK + 10) + kSeqK);
  // Packed queries need no key counts of the caller's: the append kernel makes them.
  fa3::FwdArgs pq = b;
  pq.seqused_k = nullptr;
  pq.cu_seqlens_q = fake<const int32_t>(0x660000);
  pq.total_q = 7;
  EXPECT_TRUE(Passes(fa3::validate(pq)));
  // One sequence: its batch strides are never used.
  fa3::FwdArgs one = b;
  one.batch = 1;
  one.k.batch_stride = one.v.batch_stride = 8;
  EXPECT_TRUE(Passes(fa3::validate(one)));

  auto fails_with = [&](auto edit, fa3_status code, const char* field) {
    fa3::FwdArgs c = a;
    edit(c);
    return Fails(fa3::validate(c), code, field);
  };
  const fa3_status kInvalid = FA3_ERROR_INVALID_ARGUMENT, kNotSupported = FA3_ERROR_NOT_SUPPORTED;
  EXPECT_TRUE(fails_with([](fa3::FwdArgs& c) { c.leftpad_k = fake<const int32_t>(0x690002); }, kInvalid, "leftpad_k"));
  EXPECT_TRUE(fails_with(
      [](fa3::FwdArgs& c) {
        c.page_table = fake<const int32_t>(0x6b0000);
        c.page_size = 16;
        c.num_pages = 64;
        c.page_table_batch_stride = kSeqK / 16;
        c.k = fa3::bshd(fake(0x200000), 16, kHeadsKv, kDim);
        c.v = fa3::bshd(fake(0x300000), 16, kHeadsKv, kDim);
      },
      kNotSupported, "leftpad_k with page_table"));
  EXPECT_TRUE(fails_with([](fa3::FwdArgs& c) { c.k.batch_stride += 8; }, kInvalid, "k.batch_stride"));
  EXPECT_TRUE(fails_with(
      [](fa3::FwdArgs& c) {
        c.k = fa3::bshd(fake(0x200000), kSeqK - 1, kHeadsKv, kDim);  // fewer rows than seqlen_k
        c.k.batch_stride = int64_t(kSeqK - 1) * kHeadsKv * kDim;
      },
      kInvalid, "k"));
  EXPECT_TRUE(fails_with([](fa3::FwdArgs& c) { c.v.batch_stride *= 2; }, kInvalid, "v.batch_stride"));
  EXPECT_TRUE(fails_with([](fa3::FwdArgs& c) { c.rotary_cos = c.rotary_sin = nullptr; }, kInvalid, "rotary_seqlens"));
  EXPECT_TRUE(fails_with([](fa3::FwdArgs& c) { c.rotary_seqlens = fake<const int32_t>(0x6a0001); }, kInvalid,
                         "rotary_seqlens"));
}

// Packed queries and packed new keys (speculative decoding with varying draft counts).
TEST_F(AppendValidation, PackedQueriesAndNewKeysPass) {
  a.cu_seqlens_q = fake<const int32_t>(0x660000);
  a.total_q = 7;  // (q and out: rows h * d apart, the batch stride not read)
  a.cu_seqlens_new = fake<const int32_t>(0x680000);
  a.total_new = 9;
  a.seqlen_new = 0;  // (not read with packed new keys)
  a.k_new = fa3::bshd(fake(0x610000), 9, kHeadsKv, kDim);
  a.v_new = fa3::bshd(fake(0x620000), 9, kHeadsKv, kDim);
  EXPECT_TRUE(Passes(fa3::validate(a)));
  size_t bytes = 0;
  ASSERT_TRUE(Passes(fa3::workspace_size(a, &bytes)));
  EXPECT_GE(bytes, size_t(7) * kHeadsQ * kDim * 2 + kBatch * 4);  // the rotated packed Q and the key counts
}

// Callers built against an older header pass its struct size (FA3_FWD_PARAMS_SIZE_V2: before the
// sinks, _V3: before the append, _V4: before the packed new keys, _V5: before the left padding):
// garbage past it is not read, and
// the same garbage read at the current size is refused (by name where `field` is given).
TEST_F(FwdValidation, StructSizesBeforeLaterFieldsAreAccepted) {
  auto past_older_size_is_ignored = [&](size_t older, auto put_garbage, const char* field) {
    fa3_fwd_params p = a;
    put_garbage(p);
    p.struct_size = uint32_t(older);
    EXPECT_EQ(fa3_fwd_validate(&p), FA3_OK) << fa3_last_error();
    p.struct_size = sizeof(fa3_fwd_params);
    EXPECT_EQ(fa3_fwd_validate(&p), FA3_ERROR_INVALID_ARGUMENT);
    if (field) EXPECT_NE(std::string(fa3_last_error()).find(field), std::string::npos) << fa3_last_error();
  };
  past_older_size_is_ignored(
      FA3_FWD_PARAMS_SIZE_V2, [](fa3_fwd_params& p) { p.sinks = fake<const float>(0x810001); }, "sinks");
  past_older_size_is_ignored(
      FA3_FWD_PARAMS_SIZE_V3, [](fa3_fwd_params& p) { p.k_new.data = fake<void>(0x810001); }, nullptr);
  past_older_size_is_ignored(
      FA3_FWD_PARAMS_SIZE_V4, [](fa3_fwd_params& p) { p.cu_seqlens_new = fake<const int32_t>(0x810001); },
      "cu_seqlens_new");
  past_older_size_is_ignored(
      FA3_FWD_PARAMS_SIZE_V5, [](fa3_fwd_params& p) { p.leftpad_k = fake<const int32_t>(0x810001); }, "leftpad_k");
  past_older_size_is_ignored(FA3_FWD_PARAMS_SIZE_V6, [](fa3_fwd_params& p) { p.sm_margin = -5; }, "sm_margin");
}

TEST_F(AppendValidation, WorkspaceHoldsTheKeyCountsAndTheRotatedQ) {
  size_t with_rotary = 0, without = 0;
  ASSERT_TRUE(Passes(fa3::workspace_size(a, &with_rotary)));
  EXPECT_GE(with_rotary, size_t(kBatch) * kSeqQ * kHeadsQ * kDim * 2 + kBatch * 4);
  a.rotary_cos = a.rotary_sin = nullptr;
  ASSERT_TRUE(Passes(fa3::workspace_size(a, &without)));
  EXPECT_GE(without, size_t(kBatch) * 4);
  EXPECT_LT(without, with_rotary);
  a.k_new = a.v_new = fa3_tensor{};  // cache_seqlens alone is seqused_k: no scratch
  size_t alone = 1;
  ASSERT_TRUE(Passes(fa3::workspace_size(a, &alone)));
  EXPECT_EQ(alone, 0u);
  const char* name = nullptr;
  ASSERT_TRUE(Passes(fa3::kernel_name(a, &name)));
  EXPECT_STREQ(name, "hopper");
}


// ---- fa3_quantize_fp8 ----
class QuantizeValidation : public ::testing::Test {
 protected:
  fa3::QuantizeArgs q = fa3::test::valid_quantize();
};

TEST_F(QuantizeValidation, ValidArgsPass) {
  EXPECT_TRUE(Passes(fa3::validate(q)));
  fa3::QuantizeArgs heads_outer = q;  // [heads][batch][blocks] is a layout too
  heads_outer.descale_head_stride = kBatch * 2;
  heads_outer.descale_batch_stride = 2;
  EXPECT_TRUE(Passes(fa3::validate(heads_outer)));
  for (int bs : {16, 32, 64, 128, 256, 1280}) {
    q.block_size = bs;
    q.descale_head_stride = (kSeqK + bs - 1) / bs;  // [batch][heads][blocks]
    q.descale_batch_stride = kHeadsKv * q.descale_head_stride;
    EXPECT_TRUE(Passes(fa3::validate(q))) << bs;
  }
}

TEST_F(QuantizeValidation, BadArguments) {
  auto expect = [&](auto change, const char* field) {
    fa3::QuantizeArgs b = q;
    change(b);
    EXPECT_TRUE(Invalid(fa3::validate(b), field));
  };
  expect([](auto& b) { b.in_dtype = FA3_DTYPE_E4M3; }, "in_dtype");
  expect([](auto& b) { b.head_dim = 100; }, "head_dim must be a multiple of 8");
  expect([](auto& b) { b.head_dim = 96; b.in = fa3::bshd(b.in.data, kSeqK, kHeadsKv, 96); }, "power of two");
  expect([](auto& b) { b.block_size = 48; }, "block_size");
  expect([](auto& b) { b.block_size = 0; }, "block_size");
  expect([](auto& b) { b.hadamard = 2; }, "hadamard");
  expect([](auto& b) { b.descale = nullptr; }, "descale must not be NULL");
  expect([](auto& b) { b.descale_head_stride = -1; }, "descale_head_stride");
  expect([](auto& b) { b.descale_head_stride = 1; }, "descale strides make (sequence, head) slots overlap");
  expect([](auto& b) { b.descale_batch_stride = 2; }, "descale strides make (sequence, head) slots overlap");
  expect([](auto& b) { b.in.data = offset_bytes(b.in.data, 8); }, "in.data");
  expect([](auto& b) { b.out.row_stride = 8; }, "out.row_stride");
  expect([](auto& b) { b.out.row_stride = b.out.head_stride = 16; }, "out strides make elements overlap");
  expect([](auto& b) { b.seqlen = -1; }, "seqlen");
  expect([](auto& b) { b.heads = 0; }, "heads");
  expect([](auto& b) { b.batch = 70000, b.seqlen = 1 << 24; }, "seqlen x heads x batch is too large");
  expect([](auto& b) { b.batch = 1, b.seqlen = (1 << 30) + 1, b.block_size = 1 << 30; },
         "seqlen + max(block_size, 128)");
  expect([](auto& b) { b.cu_seqlens = fake<const int32_t>(0xb00000); }, "total");
  expect([](auto& b) { b.struct_size = 3; }, "struct_size");
}

TEST_F(FwdValidation, NumSplitsNegative) {
  a.num_splits = -1;
  EXPECT_TRUE(Invalid(fa3::validate(a), "num_splits"));
}

// sm_margin: any SMs left free, none below zero; a margin of every SM still leaves the kernels one
// (fa3_c.h), so it is valid too.
TEST_F(FwdValidation, SmMargin) {
  a.sm_margin = -1;
  EXPECT_TRUE(Invalid(fa3::validate(a), "sm_margin"));
  for (int margin : {0, 1, 131, 132, 1 << 30}) {
    a.sm_margin = margin;
    EXPECT_TRUE(Passes(fa3::validate(a))) << margin;
  }
}

TEST_F(FwdValidation, NumSplitsUpTo128) {
  a.num_splits = 128;
  EXPECT_TRUE(Passes(fa3::validate(a)));
  a.num_splits = 129;
  EXPECT_TRUE(Invalid(fa3::validate(a), "num_splits"));
}

TEST_F(FwdValidation, WorkspaceNullWithBytes) {
  a.workspace_bytes = 1024;
  EXPECT_TRUE(Invalid(fa3::validate(a), "workspace"));
}

TEST_F(FwdValidation, WorkspaceMisaligned) {
  a.workspace = fake(0x900004);
  a.workspace_bytes = 1024;
  EXPECT_TRUE(Invalid(fa3::validate(a), "16-byte aligned"));
}

// A range past the top of the address space (found by the argument fuzzer: the append's offsets
// into such a workspace overflowed a pointer in the kernel-name query).
TEST_F(FwdValidation, WorkspaceRangeWrapsAround) {
  a.workspace = fake(~uintptr_t(0) - 15);
  a.workspace_bytes = 16;
  EXPECT_TRUE(Invalid(fa3::validate(a), "workspace_bytes"));
  a.workspace_bytes = 15;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

// ------------------------------------------------------------ C ABI and calls ----

TEST_F(FwdValidation, LastErrorThroughCAbi) {
  fa3::FwdArgs bad = a;
  bad.heads_kv = 0;
  ASSERT_EQ(fa3_fwd_validate(&bad), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(fa3_last_error()), fa3::validate(bad).message());
  EXPECT_NE(std::string(fa3_last_error()).find("heads_kv"), std::string::npos) << fa3_last_error();

  ASSERT_EQ(fa3_fwd_validate(&a), FA3_OK);
  EXPECT_STREQ(fa3_last_error(), "");
}

TEST_F(FwdValidation, ForwardReturnsValidationErrorBeforeCuda) {
  a.head_dim_v = 100;
  EXPECT_TRUE(Invalid(fa3::forward(a), "head_dim_v"));
}

TEST_F(FwdValidation, WorkspaceSizeAndKernelNameValidate) {
  a.batch = 0;
  size_t bytes = 0;
  const char* name = nullptr;
  EXPECT_TRUE(Invalid(fa3::workspace_size(a, &bytes), "batch"));
  EXPECT_TRUE(Invalid(fa3::kernel_name(a, &name), "batch"));
}

// ---------------------------------------------------------------- backward ----

class BwdValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    b.fwd = valid_fwd();
    b.fwd.lse = fake<float>(0x500000);
    b.dout = fa3::bshd(fake(0xa00000), kSeqQ, kHeadsQ, kDim);
    b.dq = fa3::bshd(fake(0xb00000), kSeqQ, kHeadsQ, kDim);
    b.dk = fa3::bshd(fake(0xc00000), kSeqK, kHeadsKv, kDim);
    b.dv = fa3::bshd(fake(0xd00000), kSeqK, kHeadsKv, kDim);
  }
  fa3::BwdArgs b;
};

TEST_F(BwdValidation, ValidArgsPass) {
  EXPECT_TRUE(Passes(fa3::validate(b)));
  b.deterministic = 1;
  EXPECT_TRUE(Passes(fa3::validate(b)));
}

TEST_F(BwdValidation, VarlenIgnoresGradientBatchStrides) {
  b.fwd.cu_seqlens_q = fake<const int32_t>(0x600000);
  b.fwd.cu_seqlens_k = fake<const int32_t>(0x610000);
  b.fwd.total_q = kBatch * kSeqQ;
  b.fwd.total_k = kBatch * kSeqK;
  b.dq.batch_stride = b.dout.batch_stride = b.dk.batch_stride = b.dv.batch_stride = 3;
  EXPECT_TRUE(Passes(fa3::validate(b)));
}

TEST(BwdValidationCAbi, NullParams) {
  EXPECT_EQ(fa3_bwd_validate(nullptr), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(fa3_last_error()).find("params"), std::string::npos) << fa3_last_error();
}

TEST_F(BwdValidation, WrongStructSize) {
  b.struct_size = sizeof(fa3_fwd_params);
  EXPECT_TRUE(Invalid(fa3::validate(b), "fa3_bwd_params_init"));
}

TEST_F(BwdValidation, DsinksNeedSinks) {
  b.dsinks = fake<float>(0xe00000);
  EXPECT_TRUE(Invalid(fa3::validate(b), "dsinks"));
  b.fwd.sinks = fake<const float>(0xe10000);
  EXPECT_TRUE(Passes(fa3::validate(b)));
  b.dsinks = fake<float>(0xe00001);
  EXPECT_TRUE(Invalid(fa3::validate(b), "dsinks"));
  b.dsinks = nullptr;  // sinks without their gradient: frozen sinks
  EXPECT_TRUE(Passes(fa3::validate(b)));
}

TEST_F(BwdValidation, DlseIsFloat32Aligned) {
  b.dlse = fake<const float>(0xe20000);  // LSE's gradient, laid out as fwd.lse
  EXPECT_TRUE(Passes(fa3::validate(b)));
  b.dlse = fake<const float>(0xe20002);
  EXPECT_TRUE(Invalid(fa3::validate(b), "dlse"));
}

TEST_F(BwdValidation, ForwardArgumentsAreValidated) {
  b.fwd.seqlen_k = 0;
  EXPECT_TRUE(Invalid(fa3::validate(b), "seqlen_k"));
}

TEST_F(BwdValidation, LseNull) {
  b.fwd.lse = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(b), "lse"));
}

TEST_F(BwdValidation, DoutNull) {
  b.dout.data = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(b), "dout.data"));
}

TEST_F(BwdValidation, DqNull) {
  b.dq.data = nullptr;
  EXPECT_TRUE(Invalid(fa3::validate(b), "dq.data"));
}

TEST_F(BwdValidation, DkMisaligned) {
  b.dk.data = offset_bytes(b.dk.data, 2);
  EXPECT_TRUE(Invalid(fa3::validate(b), "dk.data"));
}

TEST_F(BwdValidation, DvRowStrideNotMultipleOf8) {
  b.dv.row_stride += 2;
  EXPECT_TRUE(Invalid(fa3::validate(b), "dv.row_stride"));
}

TEST_F(BwdValidation, DvOverlapping) {
  b.dv.head_stride = 64;  // < head_dim_v = 128: heads overlap
  const fa3::Status st = fa3::validate(b);
  EXPECT_TRUE(Invalid(st, "dv.head_stride"));
  EXPECT_TRUE(Invalid(st, "overlap"));
}

TEST_F(BwdValidation, BroadcastDoutPasses) {
  b.dout.row_stride = 0;  // dO is an input and may be a broadcast gradient
  EXPECT_TRUE(Passes(fa3::validate(b)));
}

TEST_F(BwdValidation, Deterministic3) {
  b.deterministic = 3;
  EXPECT_TRUE(Invalid(fa3::validate(b), "deterministic"));
}

TEST_F(BwdValidation, E4m3NotSupported) {
  b.fwd.dtype = FA3_DTYPE_E4M3;
  b.fwd.out_dtype = FA3_DTYPE_BF16;
  EXPECT_TRUE(Fails(fa3::validate(b), FA3_ERROR_NOT_SUPPORTED, "e4m3"));
}

TEST_F(BwdValidation, WorkspaceNullWithBytes) {
  b.workspace_bytes = 64;
  EXPECT_TRUE(Invalid(fa3::validate(b), "workspace"));
}

TEST_F(BwdValidation, PagedKvNotSupported) {
  b.fwd.page_table = fake<const int32_t>(0x620000);
  b.fwd.page_size = 256;
  b.fwd.num_pages = 8;
  b.fwd.page_table_batch_stride = 4;
  EXPECT_TRUE(Fails(fa3::validate(b), FA3_ERROR_NOT_SUPPORTED, "page_table"));
}

TEST_F(BwdValidation, KernelNameAndWorkspace) {
  const char* name = nullptr;
  size_t bytes = 0;
  ASSERT_TRUE(Passes(fa3::kernel_name(b, &name)));
  EXPECT_STREQ(name, "hopper");
  ASSERT_TRUE(Passes(fa3::workspace_size(b, &bytes)));
  EXPECT_GT(bytes, size_t(0));  // LSE2, D, the dQ accumulator
  // Varlen runs on the Hopper backward; its scratch has a block of padding per sequence and grows
  // with the packed rows.
  b.fwd.cu_seqlens_q = fake<const int32_t>(0x600000);
  b.fwd.cu_seqlens_k = fake<const int32_t>(0x610000);
  b.fwd.total_q = kBatch * kSeqQ;
  b.fwd.total_k = kBatch * kSeqK;
  ASSERT_TRUE(Passes(fa3::kernel_name(b, &name)));
  EXPECT_STREQ(name, "hopper");
  size_t packed = 0, more = 0;
  ASSERT_TRUE(Passes(fa3::workspace_size(b, &packed)));
  EXPECT_GE(packed, bytes);
  b.fwd.total_q += 1000;
  ASSERT_TRUE(Passes(fa3::workspace_size(b, &more)));
  EXPECT_GT(more, packed);
  // Head dim 256 on the Hopper backward too, and with a negative softmax scale (-Q's copy first in
  // the workspace: append_kv.h).
  b.fwd.cu_seqlens_q = b.fwd.cu_seqlens_k = nullptr;
  b.fwd.head_dim_qk = b.fwd.head_dim_v = 256;
  for (fa3_tensor* t : {&b.fwd.q, &b.fwd.k, &b.fwd.v, &b.fwd.out, &b.dout, &b.dq, &b.dk, &b.dv}) {
    t->row_stride *= 2;
    t->batch_stride *= 2;
    t->head_stride *= 2;
  }
  ASSERT_TRUE(Passes(fa3::kernel_name(b, &name)));
  EXPECT_STREQ(name, "hopper");
  size_t positive = 0, negative = 0;
  ASSERT_TRUE(Passes(fa3::workspace_size(b, &positive)));
  b.fwd.softmax_scale = -0.1f;
  ASSERT_TRUE(Passes(fa3::kernel_name(b, &name)));
  EXPECT_STREQ(name, "hopper");
  ASSERT_TRUE(Passes(fa3::workspace_size(b, &negative)));
  const size_t q_bytes = size_t(b.fwd.batch) * b.fwd.seqlen_q * b.fwd.heads_q * b.fwd.head_dim_qk * 2;
  EXPECT_GE(negative, positive + q_bytes);
  EXPECT_LE(negative, positive + q_bytes + 256);
  EXPECT_TRUE(Invalid(fa3::kernel_name(b, nullptr), "name"));
  EXPECT_TRUE(Invalid(fa3::workspace_size(b, nullptr), "bytes"));
}

TEST_F(BwdValidation, BackwardWithoutDeviceMemoryFails) {
  // Fake pointers: no GPU (CUDA error), or host memory (invalid): never success.
  const fa3::Status st = fa3::backward(b);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(st.code() == FA3_ERROR_INVALID_ARGUMENT || st.code() == FA3_ERROR_CUDA ||
              st.code() == FA3_ERROR_NOT_SUPPORTED) << st.message();
}
// The decode path's combine launch describes the workspace partials and the call's O and LSE as
// fa3_combine's parameters: they must be what fa3_combine's validation accepts (16-byte partial
// rows, strides the kernel's float4 loads and 4-column stores take), fixed-length and packed.
TEST(SplitWorkspace, CombineParamsPassTheCombineValidation) {
  for (bool packed : {false, true}) {
    fa3::FwdArgs a = valid_fwd();
    a.seqlen_q = 4;
    a.lse = fake<float>(0x900000);
    static const int32_t kCu[kBatch + 1] = {0, 2, 5};
    if (packed) {
      a.cu_seqlens_q = kCu;
      a.total_q = 5;
    }
    for (int splits : {2, 128}) {
      const fa3::attn::SplitWorkspace w = fa3::attn::split_workspace(a, splits);
      const float* o = fake<const float>(0xA00000);
      const fa3_combine_params c = fa3::attn::combine_params(a, w, o, o + w.o_elems);
      const fa3::Status st = fa3::detail::validate_combine(&c);
      EXPECT_TRUE(st.ok()) << "packed " << packed << ", " << splits << " splits: " << st.message();
      EXPECT_EQ(c.num_splits, splits);
      EXPECT_EQ(c.out_dtype, a.out_dtype);
      EXPECT_EQ(c.out.data, a.out.data);
      EXPECT_EQ(c.lse_head_stride, packed ? a.total_q : a.seqlen_q);
      EXPECT_EQ(w.bytes, size_t(w.o_elems + w.lse_elems) * sizeof(float));
      EXPECT_EQ(c.sinks, nullptr);
    }
  }
  fa3::FwdArgs a = valid_fwd();  // the sinks go to the combine, which adds them once per row
  a.sinks = fake<const float>(0x900000);
  const fa3::attn::SplitWorkspace w = fa3::attn::split_workspace(a, 2);
  EXPECT_EQ(fa3::attn::combine_params(a, w, nullptr, nullptr).sinks, a.sinks);
}

// fa3_combine from a caller built before the sinks (FA3_COMBINE_PARAMS_SIZE_V1): validation does not
// read them (what fails here is the missing GPU or the fake pointers, never the struct or the sinks).
TEST(CombineValidationCAbi, StructSizeBeforeSinksIsAccepted) {
  fa3::CombineArgs c;
  c.num_splits = 2;
  c.batch = c.seqlen = c.heads = 1;
  c.head_dim = 64;
  c.out_partial = fake<const float>(0x100000);
  c.lse_partial = fake<const float>(0x200000);
  c.out = fa3::bshd(fake(0x300000), 1, 1, 64);
  EXPECT_TRUE(Passes(fa3::validate(c)));
  c.sinks = fake<const float>(0x400001);  // misaligned: read by the current struct size
  EXPECT_TRUE(Invalid(fa3::validate(c), "sinks"));
  c.struct_size = FA3_COMBINE_PARAMS_SIZE_V1;
  const fa3_status code = fa3_combine(&c, nullptr);
  EXPECT_NE(code, FA3_OK);
  const std::string msg = fa3_last_error();
  EXPECT_EQ(msg.find("struct_size"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("sinks"), std::string::npos) << msg;
}
// ------------------------------------------------- limits of the kernels' arithmetic ----

// A window wider than every sequence is no window (make_problem): the unmasked kernels run it, and
// no kernel adds a value like INT32_MAX to a position. Narrower windows stay as given.
TEST_F(FwdValidation, WindowsPastEveryKeyAreUnbounded) {
  constexpr int kMax = std::numeric_limits<int32_t>::max();
  a.window_left = kMax;
  a.window_right = kMax;
  ASSERT_TRUE(Passes(fa3::validate(a)));
  fa3::detail::FwdProblem f = fa3::detail::make_problem(a);
  EXPECT_EQ(f.window_left, -1);
  EXPECT_EQ(f.window_right, -1);
  EXPECT_FALSE(f.has_mask());
  // The edges: window_right >= seqlen_q - 1 reaches the last key from row 0, window_left >=
  // seqlen_k - 1 the first key from the last row.
  a.window_left = kSeqK - 1;
  a.window_right = kSeqQ - 1;
  f = fa3::detail::make_problem(a);
  EXPECT_EQ(f.window_left, -1);
  EXPECT_EQ(f.window_right, -1);
  a.window_left = kSeqK - 2;
  a.window_right = kSeqQ - 2;
  f = fa3::detail::make_problem(a);
  EXPECT_EQ(f.window_left, kSeqK - 2);
  EXPECT_EQ(f.window_right, kSeqQ - 2);
  EXPECT_TRUE(f.has_mask());
  a.causal = 1;  // causal stays a window_right of 0 whatever window_left is
  a.window_right = -1;
  a.window_left = kMax;
  f = fa3::detail::make_problem(a);
  EXPECT_EQ(f.window_left, -1);
  EXPECT_EQ(f.window_right, 0);
}

TEST_F(FwdValidation, PositionsMustFit32Bits) {
  a.seqlen_q = 1 << 30;
  a.seqlen_k = 1 << 30;
  a.q = a.out = fa3::bshd(fake(0x100000), 1, kHeadsQ, kDim);  // broadcast rows: any length
  a.out.row_stride = kHeadsQ * kDim;
  a.q.row_stride = 0;
  a.k.row_stride = a.v.row_stride = 0;
  EXPECT_TRUE(Invalid(fa3::validate(a), "seqlen_q + seqlen_k"));
  a.seqlen_q = 1 << 20;
  a.out.batch_stride = int64_t(a.seqlen_q) * a.out.row_stride;
  EXPECT_TRUE(Passes(fa3::validate(a)));
}

TEST_F(FwdValidation, StrideOf2To40BytesIsRefused) {
  a.k.row_stride = int64_t(1) << 39;  // 2^40 bytes of bf16: past a TMA map's stride
  a.k.batch_stride = int64_t(1) << 39;
  EXPECT_TRUE(Invalid(fa3::validate(a), "k.row_stride"));
  a.k.row_stride = (int64_t(1) << 39) - 8;
  EXPECT_TRUE(Invalid(fa3::validate(a), "k.batch_stride"));
}

TEST_F(FwdValidation, DeviceArraysMustBeAligned) {
  a.page_table = fake<const int32_t>(0x620002);
  a.page_size = 256;
  a.num_pages = 8;
  a.page_table_batch_stride = 4;
  EXPECT_TRUE(Invalid(fa3::validate(a), "page_table must be 4-byte aligned"));
  a = valid_fwd();
  a.dtype = FA3_DTYPE_E4M3;
  a.q = fa3::bshd(fake(0x100000), kSeqQ, kHeadsQ, kDim);
  a.k_descale = fake<const float>(0x700002);
  EXPECT_TRUE(Invalid(fa3::validate(a), "k_descale must be 4-byte aligned"));
  a.k_descale = nullptr;
  a.q_block_descale.data = fake<const float>(0x700000);
  a.q_block_descale.block_size = 64;
  a.q_block_descale.num_blocks = 2;
  a.q_block_descale.batch_stride = -1;
  EXPECT_TRUE(Invalid(fa3::validate(a), "q_block_descale.batch_stride"));
  a = valid_fwd();
  a.cu_seqlens_q = fake<const int32_t>(0x600001);
  a.cu_seqlens_k = fake<const int32_t>(0x610000);
  a.total_q = kBatch * kSeqQ;
  a.total_k = kBatch * kSeqK;
  EXPECT_TRUE(Invalid(fa3::validate(a), "cu_seqlens_q must be 4-byte aligned"));
  a.cu_seqlens_q = fake<const int32_t>(0x600000);
  a.seqused_k = fake<const int32_t>(0x620002);
  EXPECT_TRUE(Invalid(fa3::validate(a), "seqused_k must be 4-byte aligned"));
}

TEST_F(FwdValidation, OtherRejectionsNameTheirField) {
  auto expect = [&](auto change, const char* field) {
    fa3::FwdArgs b = valid_fwd();
    change(b);
    EXPECT_TRUE(Invalid(fa3::validate(b), field)) << field;
  };
  expect([](auto& b) { b.heads_q = 0; }, "heads_q");
  expect([](auto& b) { b.descale_batch_stride = -1; }, "descale_batch_stride");
  expect([](auto& b) { b.v.head_stride = 3; }, "v.head_stride");
  EXPECT_TRUE(Invalid(fa3::workspace_size(a, nullptr), "bytes"));
  EXPECT_TRUE(Invalid(fa3::kernel_name(a, nullptr), "name"));
}

// The decode path's partial rows are counted in 64 bits (the launch refuses more than 32 bits hold).
TEST(SplitWorkspace, RowsDoNotWrap) {
  fa3::FwdArgs a = valid_fwd();
  a.batch = 3;
  a.seqlen_q = 1431655766;  // 3 x that = 2^32 + 2
  const fa3::attn::SplitWorkspace w = fa3::attn::split_workspace(a, 2);
  EXPECT_EQ(w.rows, int64_t(3) * 1431655766);
  EXPECT_EQ(w.lse_elems, 2 * int64_t(kHeadsQ) * w.rows);
}

TEST_F(BwdValidation, ForwardOnlyFieldsAreRefused) {
  fa3::BwdArgs c = b;
  c.fwd.cache_seqlens = fake<const int32_t>(0x630000);
  EXPECT_TRUE(Invalid(fa3::validate(c), "cache_seqlens"));
  c = b;
  c.fwd.cache_seqlens = fake<const int32_t>(0x630000);
  c.fwd.seqlen_new = 1;
  c.fwd.k_new = fa3::bshd(fake(0x640000), 1, kHeadsKv, kDim);
  c.fwd.v_new = fa3::bshd(fake(0x650000), 1, kHeadsKv, kDim);
  EXPECT_TRUE(Fails(fa3::validate(c), FA3_ERROR_NOT_SUPPORTED, "k_new"));
  c = b;
  c.fwd.cache_seqlens = fake<const int32_t>(0x630000);
  c.fwd.rotary_cos = fake<const void>(0x660000);
  c.fwd.rotary_sin = fake<const void>(0x670000);
  c.fwd.rotary_dim = 64;
  c.fwd.rotary_rows = kSeqK;
  c.fwd.rotary_row_stride = 32;
  EXPECT_TRUE(Fails(fa3::validate(c), FA3_ERROR_NOT_SUPPORTED, "rotary_cos"));
  c = b;
  c.fwd.leftpad_k = fake<const int32_t>(0x680000);
  EXPECT_TRUE(Fails(fa3::validate(c), FA3_ERROR_NOT_SUPPORTED, "leftpad_k"));
}

TEST_F(BwdValidation, HeadsAndBatchWithinTheGrid) {
  b.fwd.batch = 65536;
  EXPECT_TRUE(Invalid(fa3::validate(b), "batch"));
  b.fwd.batch = 65535;
  EXPECT_TRUE(Passes(fa3::validate(b)));
}

TEST_F(BwdValidation, GradientTensorsAreChecked) {
  auto expect = [&](auto change, const char* field) {
    fa3::BwdArgs c = b;
    change(c);
    EXPECT_TRUE(Invalid(fa3::validate(c), field)) << field;
  };
  expect([](auto& c) { c.dq.head_stride = 0; }, "dq strides make elements overlap");
  expect([](auto& c) { c.dk.row_stride = 4; }, "dk.row_stride");
  expect([](auto& c) { c.dout.row_stride = 12; }, "dout.row_stride");
  expect([](auto& c) { c.workspace = fake(0x700008), c.workspace_bytes = 64; }, "workspace must be 16-byte aligned");
}

class CombineValidation : public ::testing::Test {
 protected:
  fa3::CombineArgs c = fa3::test::valid_combine();
};

TEST_F(CombineValidation, ValidArgsPass) { EXPECT_TRUE(Passes(fa3::validate(c))); }

TEST_F(CombineValidation, BadArgumentsAreNamed) {
  auto expect = [&](auto change, const char* field) {
    fa3::CombineArgs b = c;
    change(b);
    EXPECT_TRUE(Invalid(fa3::validate(b), field)) << field;
  };
  expect([](auto& b) { b.struct_size = 3; }, "struct_size");
  expect([](auto& b) { b.out_dtype = FA3_DTYPE_E4M3; }, "out_dtype");
  expect([](auto& b) { b.num_splits = 0; }, "num_splits");
  expect([](auto& b) { b.num_splits = 129; }, "num_splits");
  expect([](auto& b) { b.batch = 0; }, "batch");
  expect([](auto& b) { b.heads = 0; }, "heads");
  expect([](auto& b) { b.head_dim = 6; }, "head_dim");
  expect([](auto& b) { b.head_dim = 260; }, "head_dim");
  expect([](auto& b) { b.out_partial = nullptr; }, "out_partial must not be NULL");
  expect([](auto& b) { b.lse_partial = nullptr; }, "lse_partial must not be NULL");
  expect([](auto& b) { b.out.data = nullptr; }, "out.data must not be NULL");
  expect([](auto& b) { b.out_partial = offset_bytes(b.out_partial, 8); }, "out_partial must be 16-byte aligned");
  expect([](auto& b) { b.out_partial_row_stride = 6; }, "out_partial_row_stride");
  expect([](auto& b) { b.out.data = offset_bytes(b.out.data, 4); }, "out.data must be 8-byte aligned");
  expect([](auto& b) { b.out.row_stride = -4; }, "out.row_stride");
  expect([](auto& b) { b.lse_partial_split_stride = -1; }, "lse_partial_split_stride");
  expect([](auto& b) { b.lse_partial = offset_bytes(b.lse_partial, 2); }, "lse_partial must be 4-byte aligned");
  expect([](auto& b) { b.lse = fake<float>(0x400002); }, "lse must be 4-byte aligned");
  expect([](auto& b) { b.seqused = fake<const int32_t>(0x500001); }, "seqused must be 4-byte aligned");
  expect([](auto& b) { b.out.head_stride = 0; }, "out strides make elements overlap");
  expect([](auto& b) { b.seqlen = 1 << 24, b.heads = 256; }, "seqlen * heads");
}

TEST_F(QuantizeValidation, PackedRowsNeedAlignedOffsets) {
  q.cu_seqlens = fake<const int32_t>(0xb00002);
  q.total = kBatch * kSeqK;
  EXPECT_TRUE(Invalid(fa3::validate(q), "cu_seqlens must be 4-byte aligned"));
  q.cu_seqlens = fake<const int32_t>(0xb00000);
  EXPECT_TRUE(Passes(fa3::validate(q)));
  q.batch = 0;
  EXPECT_TRUE(Invalid(fa3::validate(q), "batch"));
}
}  // namespace
