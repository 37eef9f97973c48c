// Helpers of the tuning variants: an ad-hoc tile configuration and its registry entry.
#pragma once
#include <string>
#include <vector>

#include "bench/tune_variants.h"
#include "src/attention/fwd_launch.cuh"

namespace fa3::bench {

template <int kD, int kM, int kN, int kS, bool kAlias>
struct Tile {
  static constexpr int kHeadDim = kD, kBlockM = kM, kBlockN = kN, kStages = kS;
  static constexpr bool kOAliasesQ = kAlias;
};

// Both mask variants of one tile configuration with schedule flags `kSched` (fwd_config.h).
template <class Cfg, int kSched>
void add_variant(std::vector<TuneVariant>& v) {
  std::string name = std::to_string(Cfg::kBlockM) + "x" + std::to_string(Cfg::kBlockN) + (Cfg::kOAliasesQ ? " O=Q" : "") +
                     (Cfg::kStages != 2 ? " st" + std::to_string(Cfg::kStages) : "") +
                     ((kSched & attn::kPingpong) ? " pp" : "") + ((kSched & attn::kLazyRescale) ? " lazy" : "") +
                     ((kSched & attn::kExpUnderPv) ? " xpv" : "");
  v.push_back({name, Cfg::kHeadDim, false, &attn::launch_fwd_cfg<FA3_DTYPE_BF16, Cfg, false, kSched>});
  v.push_back({name, Cfg::kHeadDim, true, &attn::launch_fwd_cfg<FA3_DTYPE_BF16, Cfg, true, kSched>});
}

void add_d64(std::vector<TuneVariant>& v);
void add_d128(std::vector<TuneVariant>& v);
void add_d256(std::vector<TuneVariant>& v);

}  // namespace fa3::bench
