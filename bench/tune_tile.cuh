// Helper of the tuning variants: the registry entry of a tile configuration.
#pragma once
#include <string>
#include <vector>

#include "bench/tune_variants.h"
#include "src/attention/fwd_launch.cuh"

namespace fa3::bench {

using attn::TileConfig;
// An e4m3 tile (fwd_config.h's Fp8Tile) of a TileConfig.
template <class Cfg>
using Fp8 = attn::Fp8Tile<Cfg>;

// Both mask variants of one tile configuration (fwd_config.h's TileConfig) with its schedule flags,
// with or without softcap.
template <class Cfg, int kDtype = FA3_DTYPE_BF16, bool kSoftcap = false>
void add_variant(std::vector<TuneVariant>& v) {
  constexpr int kSched = Cfg::kSchedule;
  std::string name = std::to_string(Cfg::kBlockM) + "x" + std::to_string(Cfg::kBlockN) + (Cfg::kOInKV ? " O@KV" : "") +
                     (Cfg::kStages != 2 ? " st" + std::to_string(Cfg::kStages) : "") +
                     ((kSched & attn::kPingpong) ? " pp" : "") + ((kSched & attn::kLazyRescale) ? " lazy" : "") +
                     ((kSched & attn::kExpUnderPv) ? " xpv" : "") + ((kSched & attn::kCrossTile) ? " xtile" : "") +
                     ((kSched & attn::kNarrowFirst) ? " narrow" : "");
  if (kSoftcap) name += " softcap";
  const auto dtype = static_cast<fa3_dtype>(kDtype);
  v.push_back({name, Cfg::kHeadDim, false, dtype, kSoftcap,
               &attn::launch_fwd<kDtype, Cfg, attn::FwdFeatures<false, kSoftcap>>});
  v.push_back({name, Cfg::kHeadDim, true, dtype, kSoftcap,
               &attn::launch_fwd<kDtype, Cfg, attn::FwdFeatures<true, kSoftcap>>});
}

void add_d64(std::vector<TuneVariant>& v);
void add_d128(std::vector<TuneVariant>& v);
void add_d256(std::vector<TuneVariant>& v);

}  // namespace fa3::bench
