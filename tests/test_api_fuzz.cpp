// Random arguments through the host side of the public API: validation, the kernel choice and the
// workspace query. Every combination must get OK or an error whose message names an argument, and
// never a crash or undefined behaviour (tools/host-sanitize.sh runs these tests under
// AddressSanitizer and UndefinedBehaviorSanitizer); arguments that pass validation must also plan
// (a kernel name, a workspace size). Each trial starts from a valid call of one kind (dense, packed,
// paged, decode with splits, e4m3 with descales, the KV-cache append, left padding, masks with
// softcap and sinks) and sets one to three of its fields to values that break arithmetic: zero,
// signs, tile sizes and their neighbours, 32- and 64-bit limits, misaligned and aliasing pointers,
// non-finite floats. No device is touched: validation reads no pointer (fake addresses serve).
// FA3_FUZZ_TRIALS sets the trials per starting call (default 3000), FA3_FUZZ_SEED the seeds' offset.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fa3/fa3.h"
#include "fa3/fa3_c.h"
#include "tests/valid_args.h"

namespace {

using Rng = std::mt19937_64;

using namespace fa3::test;  // (valid_args.h: the valid calls, fake addresses, their shapes)

template <class T, size_t N>
const T& pick_of(const T (&values)[N], Rng& rng) {
  return values[rng() % N];
}

// ---- the values a field is set to, by its type ----
constexpr int64_t kInts[] = {std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<int32_t>::min(),
                             -65536, -128, -2, -1, 0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 31, 32, 63, 64, 65, 80, 96,
                             127, 128, 129, 176, 192, 255, 256, 257, 448, 1000, 4096, 4097, 65535, 65536,
                             (int64_t(1) << 24) + 1,
                             std::numeric_limits<int32_t>::max(),
                             int64_t(1) << 32,
                             int64_t(1) << 40,
                             std::numeric_limits<int64_t>::max()};

void pick(int64_t& field, Rng& rng) { field = pick_of(kInts, rng); }
void pick(int32_t& field, Rng& rng) {
  int64_t v;
  do v = pick_of(kInts, rng);
  while (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max());
  field = int32_t(v);
}
void pick(uint64_t& field, Rng& rng) {
  constexpr uint64_t kSizes[] = {0, 1, 15, 16, 256, 4096, uint64_t(1) << 20, uint64_t(1) << 40,
                                 std::numeric_limits<uint64_t>::max()};
  field = pick_of(kSizes, rng);
}
void pick(uint32_t& field, Rng& rng) {  // struct_size: earlier versions' sizes, neighbours, limits
  constexpr uint32_t kSizes[] = {0, 1, uint32_t(FA3_FWD_PARAMS_SIZE_V1), uint32_t(FA3_FWD_PARAMS_SIZE_V5),
                                 uint32_t(FA3_FWD_PARAMS_SIZE_V6),
                                 uint32_t(FA3_COMBINE_PARAMS_SIZE_V1), uint32_t(sizeof(fa3_fwd_params)),
                                 uint32_t(sizeof(fa3_bwd_params)), uint32_t(sizeof(fa3_fwd_params) + 8),
                                 std::numeric_limits<uint32_t>::max()};
  field = pick_of(kSizes, rng);
}
void pick(float& field, Rng& rng) {
  constexpr float kFloats[] = {0.f, -0.f, 1.f, -1.f, 0.125f, 1e-45f, 1e-38f, 30.f, 448.f, 1e30f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  field = pick_of(kFloats, rng);
}
void pick(fa3_dtype& field, Rng& rng) {  // (the enumerators only: another value is not a fa3_dtype in C++)
  constexpr fa3_dtype kTypes[] = {FA3_DTYPE_FP16, FA3_DTYPE_BF16, FA3_DTYPE_E4M3, FA3_DTYPE_FP32};
  field = pick_of(kTypes, rng);
}
// Pointers: NULL, aligned, misaligned by 1 to 8 bytes, another tensor's address (aliasing: 0x100000
// is Q's in every starting call), near the top of the address space.
template <class T>
void pick(T*& field, Rng& rng) {
  constexpr uintptr_t kAddresses[] = {0,        0x4000000, 0x4000001, 0x4000002, 0x4000004,
                                      0x4000008, 0x100000,  0x200000,  ~uintptr_t(0) - 15};
  field = reinterpret_cast<T*>(pick_of(kAddresses, rng));
}

// One field of S, named as fa3_c.h spells it (the error messages name fields so).
template <class S>
struct Field {
  const char* name;
  void (*set)(S&, Rng&);
};
#define FA3_FIELD(S, member) \
  Field<S> { #member, [](S& s, Rng& r) { pick(s.member, r); } }
#define FA3_TENSOR_FIELDS(S, t)                                                              \
  FA3_FIELD(S, t.data), FA3_FIELD(S, t.batch_stride), FA3_FIELD(S, t.row_stride), \
      FA3_FIELD(S, t.head_stride)
#define FA3_BLOCK_SCALE_FIELDS(S, b)                                                                    \
  FA3_FIELD(S, b.data), FA3_FIELD(S, b.batch_stride), FA3_FIELD(S, b.head_stride), FA3_FIELD(S, b.block_size), \
      FA3_FIELD(S, b.num_blocks)
// fa3_fwd_params' fields, as a member of S (prefix: "" or "fwd.").
#define FA3_FWD_FIELDS(S, f)                                                                                      \
  FA3_FIELD(S, f struct_size), FA3_FIELD(S, f dtype), FA3_FIELD(S, f out_dtype), FA3_FIELD(S, f batch),          \
      FA3_FIELD(S, f seqlen_q), FA3_FIELD(S, f seqlen_k), FA3_FIELD(S, f heads_q), FA3_FIELD(S, f heads_kv),      \
      FA3_FIELD(S, f head_dim_qk), FA3_FIELD(S, f head_dim_v), FA3_TENSOR_FIELDS(S, f q), FA3_TENSOR_FIELDS(S, f k), \
      FA3_TENSOR_FIELDS(S, f v), FA3_TENSOR_FIELDS(S, f out), FA3_FIELD(S, f lse), FA3_FIELD(S, f softmax_scale),   \
      FA3_FIELD(S, f causal), FA3_FIELD(S, f window_left), FA3_FIELD(S, f window_right), FA3_FIELD(S, f softcap),  \
      FA3_FIELD(S, f cu_seqlens_q), FA3_FIELD(S, f cu_seqlens_k), FA3_FIELD(S, f seqused_q),                       \
      FA3_FIELD(S, f seqused_k), FA3_FIELD(S, f total_q), FA3_FIELD(S, f total_k), FA3_FIELD(S, f page_table),     \
      FA3_FIELD(S, f page_table_batch_stride), FA3_FIELD(S, f page_size), FA3_FIELD(S, f num_pages),              \
      FA3_FIELD(S, f q_descale), FA3_FIELD(S, f k_descale), FA3_FIELD(S, f v_descale),                             \
      FA3_FIELD(S, f descale_batch_stride), FA3_FIELD(S, f descale_head_stride), FA3_FIELD(S, f num_splits),       \
      FA3_FIELD(S, f workspace), FA3_FIELD(S, f workspace_bytes), FA3_BLOCK_SCALE_FIELDS(S, f q_block_descale),    \
      FA3_BLOCK_SCALE_FIELDS(S, f k_block_descale), FA3_BLOCK_SCALE_FIELDS(S, f v_block_descale),                  \
      FA3_FIELD(S, f sinks), FA3_FIELD(S, f cache_seqlens), FA3_TENSOR_FIELDS(S, f k_new),                         \
      FA3_TENSOR_FIELDS(S, f v_new), FA3_FIELD(S, f seqlen_new), FA3_FIELD(S, f rotary_dim),                       \
      FA3_FIELD(S, f rotary_cos), FA3_FIELD(S, f rotary_sin), FA3_FIELD(S, f rotary_row_stride),                   \
      FA3_FIELD(S, f rotary_rows), FA3_FIELD(S, f rotary_interleaved), FA3_FIELD(S, f cu_seqlens_new),             \
      FA3_FIELD(S, f total_new), FA3_FIELD(S, f leftpad_k), FA3_FIELD(S, f rotary_seqlens),                      \
      FA3_FIELD(S, f sm_margin)

const std::vector<Field<fa3_fwd_params>>& fwd_fields() {
  static const std::vector<Field<fa3_fwd_params>> fields = {FA3_FWD_FIELDS(fa3_fwd_params, )};
  return fields;
}
const std::vector<Field<fa3_bwd_params>>& bwd_fields() {
  static const std::vector<Field<fa3_bwd_params>> fields = {
      FA3_FWD_FIELDS(fa3_bwd_params, fwd.), FA3_FIELD(fa3_bwd_params, struct_size),
      FA3_TENSOR_FIELDS(fa3_bwd_params, dout), FA3_TENSOR_FIELDS(fa3_bwd_params, dq),
      FA3_TENSOR_FIELDS(fa3_bwd_params, dk), FA3_TENSOR_FIELDS(fa3_bwd_params, dv),
      FA3_FIELD(fa3_bwd_params, deterministic), FA3_FIELD(fa3_bwd_params, workspace),
      FA3_FIELD(fa3_bwd_params, workspace_bytes), FA3_FIELD(fa3_bwd_params, dsinks),
      FA3_FIELD(fa3_bwd_params, dlse)};
  return fields;
}
const std::vector<Field<fa3_combine_params>>& combine_fields() {
  using S = fa3_combine_params;
  static const std::vector<Field<S>> fields = {
      FA3_FIELD(S, struct_size), FA3_FIELD(S, out_dtype), FA3_FIELD(S, num_splits), FA3_FIELD(S, batch),
      FA3_FIELD(S, seqlen), FA3_FIELD(S, heads), FA3_FIELD(S, head_dim), FA3_FIELD(S, out_partial),
      FA3_FIELD(S, out_partial_split_stride), FA3_FIELD(S, out_partial_batch_stride),
      FA3_FIELD(S, out_partial_row_stride), FA3_FIELD(S, out_partial_head_stride), FA3_FIELD(S, lse_partial),
      FA3_FIELD(S, lse_partial_split_stride), FA3_FIELD(S, lse_partial_batch_stride),
      FA3_FIELD(S, lse_partial_row_stride), FA3_FIELD(S, lse_partial_head_stride), FA3_TENSOR_FIELDS(S, out),
      FA3_FIELD(S, lse), FA3_FIELD(S, lse_batch_stride), FA3_FIELD(S, lse_row_stride), FA3_FIELD(S, lse_head_stride),
      FA3_FIELD(S, cu_seqlens), FA3_FIELD(S, seqused), FA3_FIELD(S, sinks)};
  return fields;
}
const std::vector<Field<fa3_quantize_params>>& quantize_fields() {
  using S = fa3_quantize_params;
  static const std::vector<Field<S>> fields = {
      FA3_FIELD(S, struct_size), FA3_FIELD(S, in_dtype), FA3_FIELD(S, batch), FA3_FIELD(S, seqlen),
      FA3_FIELD(S, heads), FA3_FIELD(S, head_dim), FA3_TENSOR_FIELDS(S, in), FA3_TENSOR_FIELDS(S, out),
      FA3_FIELD(S, cu_seqlens), FA3_FIELD(S, total), FA3_FIELD(S, descale), FA3_FIELD(S, descale_batch_stride),
      FA3_FIELD(S, descale_head_stride), FA3_FIELD(S, block_size), FA3_FIELD(S, hadamard), FA3_FIELD(S, seed)};
  return fields;
}
#undef FA3_FWD_FIELDS
#undef FA3_BLOCK_SCALE_FIELDS
#undef FA3_TENSOR_FIELDS
#undef FA3_FIELD

// A field's name without the blanks its macro leaves ("fwd. causal").
template <class S>
std::string label(const Field<S>& f) {
  std::string name;
  for (const char* c = f.name; *c != '\0'; ++c)
    if (*c != ' ') name += *c;
  return name;
}

// The identifiers an error message may name: the fields' names, split at '.', and the structs'
// init functions (struct_size's message names the one to call).
template <class S>
std::set<std::string> argument_names(const std::vector<Field<S>>& fields) {
  std::set<std::string> names = {"params", "fa3_fwd_params_init", "fa3_bwd_params_init", "fa3_combine_params_init",
                                 "fa3_quantize_params_init"};
  for (const Field<S>& f : fields) {
    std::string name = label(f);
    for (size_t dot; (dot = name.find('.')) != std::string::npos; name = name.substr(dot + 1))
      names.insert(name.substr(0, dot));
    names.insert(name);
  }
  return names;
}

bool names_an_argument(const std::string& message, const std::set<std::string>& names) {
  std::string word;
  for (size_t i = 0; i <= message.size(); ++i) {
    const char c = i < message.size() ? message[i] : ' ';
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      word += c;
    } else {
      if (names.count(word)) return true;
      word.clear();
    }
  }
  return false;
}

int trials() {
  const char* env = std::getenv("FA3_FUZZ_TRIALS");
  return env != nullptr ? std::max(1, std::atoi(env)) : 3000;
}

// What the trials of one starting call saw (a fuzzer whose trials all pass, or all fail, tests
// little: the counts are checked).
struct Tally {
  int passed = 0, refused = 0;
};

// A status of the host path: OK, or an argument error / an unsupported combination whose message
// names an argument; a device query (the workspace of automatic splits asks for the SM count) may
// also fail as a CUDA error on a machine without a GPU.
void expect_clear(const fa3::Status& st, const std::set<std::string>& names, bool device_query,
                  const std::string& trial) {
  if (st.ok()) return;
  if (device_query && st.code() == FA3_ERROR_CUDA) return;
  EXPECT_TRUE(st.code() == FA3_ERROR_INVALID_ARGUMENT || st.code() == FA3_ERROR_NOT_SUPPORTED)
      << trial << ": code " << st.code() << " '" << st.message() << "'";
  EXPECT_TRUE(names_an_argument(st.message(), names)) << trial << ": '" << st.message() << "' names no argument";
}

// Runs the trials from `base`: mutate, call `check` (which validates and, when that passes, plans).
template <class S, class Check>
Tally fuzz(const S& base, const std::vector<Field<S>>& fields, uint64_t seed, Check check) {
  const char* offset = std::getenv("FA3_FUZZ_SEED");
  seed += offset != nullptr ? std::strtoull(offset, nullptr, 10) : 0;
  Rng rng(seed);
  Tally tally;
  const int n = trials();
  for (int t = 0; t < n && !::testing::Test::HasFailure(); ++t) {
    S s = base;
    std::string trial = "trial " + std::to_string(t) + " (seed " + std::to_string(seed) + "):";
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const Field<S>& f = fields[rng() % fields.size()];
      f.set(s, rng);
      trial += " " + label(f);
    }
    if (check(s, trial)) ++tally.passed;
    else ++tally.refused;
  }
  return tally;
}

// ---- the starting calls: each passes validation as it is ----
fa3::FwdArgs dense() {
  fa3::FwdArgs a = valid_fwd();
  a.lse = fake<float>(0x500000);
  return a;
}
// One query per sequence.
fa3::FwdArgs decode() {
  fa3::FwdArgs a = dense();
  a.seqlen_q = 1;
  a.q = fa3::bshd(fake(0x100000), 1, kHeadsQ, kDim);
  a.out = fa3::bshd(fake(0x400000), 1, kHeadsQ, kDim);
  return a;
}
// A workspace larger than any of the starts needs.
fa3::FwdArgs with_workspace(fa3::FwdArgs a) {
  a.workspace = fake(0x4000000);
  a.workspace_bytes = size_t(1) << 26;
  return a;
}

std::vector<fa3::FwdArgs> fwd_starts() {
  std::vector<fa3::FwdArgs> starts;
  starts.push_back(dense());
  {  // packed sequences
    fa3::FwdArgs a = dense();
    a.cu_seqlens_q = fake<const int32_t>(0x600000);
    a.cu_seqlens_k = fake<const int32_t>(0x610000);
    a.seqused_k = fake<const int32_t>(0x620000);
    a.total_q = kBatch * kSeqQ;
    a.total_k = kBatch * kSeqK;
    starts.push_back(a);
  }
  {  // a paged cache: 32 pages of 16 rows
    fa3::FwdArgs a = dense();
    a.page_table = fake<const int32_t>(0x600000);
    a.page_table_batch_stride = kSeqK / 16;
    a.page_size = 16;
    a.num_pages = 32;
    a.seqused_k = fake<const int32_t>(0x620000);
    a.k = fa3::bshd(fake(0x200000), 16, kHeadsKv, kDim);
    a.v = fa3::bshd(fake(0x300000), 16, kHeadsKv, kDim);
    starts.push_back(a);
  }
  {  // a decode with explicit splits and their workspace
    fa3::FwdArgs a = with_workspace(decode());
    a.num_splits = 8;
    starts.push_back(a);
  }
  {  // e4m3 with per-head and block descales
    fa3::FwdArgs a = dense();
    a.dtype = FA3_DTYPE_E4M3;
    a.q_descale = fake<const float>(0x700000);
    a.k_descale = fake<const float>(0x710000);
    a.v_descale = fake<const float>(0x720000);
    a.descale_batch_stride = kHeadsKv;
    a.descale_head_stride = 1;
    a.q_block_descale = fa3_block_scales{fake<const float>(0x730000), kHeadsQ * 2, 2, 64, 2};
    a.k_block_descale = fa3_block_scales{fake<const float>(0x740000), kHeadsKv * 2, 2, 128, 2};
    a.v_block_descale = fa3_block_scales{fake<const float>(0x750000), kHeadsKv * 2, 2, 128, 2};
    starts.push_back(a);
  }
  starts.push_back(with_workspace(with_append(decode(), 1)));  // the KV-cache append with rotary
  {  // a left-padded cache
    fa3::FwdArgs a = with_workspace(dense());
    a.leftpad_k = fake<const int32_t>(0x600000);
    a.seqused_k = fake<const int32_t>(0x620000);
    starts.push_back(a);
  }
  {  // masks, softcap, sinks, d_qk 192 / d_v 128
    fa3::FwdArgs a = dense();
    a.head_dim_qk = 192;
    a.q = fa3::bshd(fake(0x100000), kSeqQ, kHeadsQ, 192);
    a.k = fa3::bshd(fake(0x200000), kSeqK, kHeadsKv, 192);
    a.causal = 1;
    a.window_left = 100;
    a.window_right = 0;
    a.softcap = 30.f;
    a.sinks = fake<const float>(0x800000);
    starts.push_back(a);
  }
  return starts;
}

fa3::BwdArgs bwd_start(const fa3::FwdArgs& fwd) {
  fa3::BwdArgs b;
  b.fwd = fwd;
  b.dout = fa3::bshd(fake(0xa00000), kSeqQ, kHeadsQ, fwd.head_dim_v);
  b.dq = fa3::bshd(fake(0xb00000), kSeqQ, kHeadsQ, fwd.head_dim_qk);
  b.dk = fa3::bshd(fake(0xc00000), kSeqK, kHeadsKv, fwd.head_dim_qk);
  b.dv = fa3::bshd(fake(0xd00000), kSeqK, kHeadsKv, fwd.head_dim_v);
  b.workspace = fake(0x4000000);
  b.workspace_bytes = size_t(1) << 30;
  return b;
}

TEST(ApiFuzz, ForwardArgumentsGetAnswers) {
  const auto names = argument_names(fwd_fields());
  const std::vector<fa3::FwdArgs> starts = fwd_starts();
  for (size_t i = 0; i < starts.size(); ++i) {
    ASSERT_TRUE(fa3::validate(starts[i]).ok()) << "start " << i << ": " << fa3::validate(starts[i]).message();
    const Tally tally = fuzz<fa3_fwd_params>(starts[i], fwd_fields(), 1000 + i, [&](const fa3_fwd_params& p, const std::string& trial) {
      fa3::FwdArgs a;
      static_cast<fa3_fwd_params&>(a) = p;
      const fa3::Status st = fa3::validate(a);
      expect_clear(st, names, false, trial + " validate");
      const char* name = nullptr;
      const fa3::Status named = fa3::kernel_name(a, &name);
      size_t bytes = 0;
      const fa3::Status sized = fa3::workspace_size(a, &bytes);
      if (!st.ok()) {  // the queries validate first: the same answer
        EXPECT_EQ(named.message(), st.message()) << trial;
        EXPECT_EQ(sized.message(), st.message()) << trial;
        return false;
      }
      EXPECT_TRUE(named.ok() && name != nullptr) << trial << " kernel_name: '" << named.message() << "'";
      expect_clear(sized, names, true, trial + " workspace_size");
      return true;
    });
    EXPECT_GT(tally.passed, 0) << "start " << i << ": no trial passed validation";
    EXPECT_GT(tally.refused, 0) << "start " << i << ": no trial was refused";
  }
}

TEST(ApiFuzz, BackwardArgumentsGetAnswers) {
  const auto names = argument_names(bwd_fields());
  const std::vector<fa3::FwdArgs> fwd = fwd_starts();
  // The dense, packed and masked starts (the backward takes no paged cache, append or descales).
  for (size_t i : {size_t(0), size_t(1), fwd.size() - 1}) {
    fa3::BwdArgs start = bwd_start(fwd[i]);
    if (i == fwd.size() - 1) start.fwd.softcap = 0.f, start.dsinks = fake<float>(0x810000);
    ASSERT_TRUE(fa3::validate(start).ok()) << "start " << i << ": " << fa3::validate(start).message();
    const Tally tally = fuzz<fa3_bwd_params>(start, bwd_fields(), 2000 + i, [&](const fa3_bwd_params& p, const std::string& trial) {
      fa3::BwdArgs b;
      static_cast<fa3_bwd_params&>(b) = p;
      const fa3::Status st = fa3::validate(b);
      expect_clear(st, names, false, trial + " validate");
      if (!st.ok()) return false;
      const char* name = nullptr;
      EXPECT_TRUE(fa3::kernel_name(b, &name).ok() && name != nullptr) << trial;
      size_t bytes = 0;
      expect_clear(fa3::workspace_size(b, &bytes), names, false, trial + " workspace_size");
      return true;
    });
    EXPECT_GT(tally.passed, 0) << "start " << i;
    EXPECT_GT(tally.refused, 0) << "start " << i;
  }
}

// Combine and quantize: validation is the whole host path.
template <class Args, class S>
void fuzz_validation(const Args& start, const std::vector<Field<S>>& fields, uint64_t seed) {
  ASSERT_TRUE(fa3::validate(start).ok()) << fa3::validate(start).message();
  const auto names = argument_names(fields);
  const Tally tally = fuzz<S>(start, fields, seed, [&](const S& p, const std::string& trial) {
    Args a;
    static_cast<S&>(a) = p;
    const fa3::Status st = fa3::validate(a);
    expect_clear(st, names, false, trial);
    return st.ok();
  });
  EXPECT_GT(tally.passed, 0);
  EXPECT_GT(tally.refused, 0);
}

TEST(ApiFuzz, CombineArgumentsGetAnswers) {
  fuzz_validation<fa3::CombineArgs, fa3_combine_params>(valid_combine(), combine_fields(), 3000);
}

TEST(ApiFuzz, QuantizeArgumentsGetAnswers) {
  fuzz_validation<fa3::QuantizeArgs, fa3_quantize_params>(valid_quantize(), quantize_fields(), 4000);
}

}  // namespace
