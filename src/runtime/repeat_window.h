// Deferred mode's repeated-suffix heuristic (a pass over the op stream as it is recorded): cut
// the segment where the last L ops repeat the L before, so each repeated block becomes one
// cached segment.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>

namespace tessera::graph_detail {

// The repeated-suffix heuristic, incrementally: run_[j] counts how many of the latest ops equal
// the op L = kMaxPeriod - j before them, so "the last L ops repeat the L before" is run >= L.
// Both arrays are walked forwards (period descending), so the per-op update vectorises; the
// window keeps 32 bits of each op hash (a collision only moves a cut, never changes results).
class RepeatWindow {
 public:
  static constexpr int32_t kMinPeriod = 3, kMaxPeriod = 128;
  void clear() {
    len_ = 0;
    any_ = false;
    std::fill(std::begin(run_), std::end(run_), 0);
  }
  void push(uint64_t h64) {
    const uint32_t h = uint32_t(h64 ^ (h64 >> 32));
    if (len_ == kCap) {  // keep the last kMaxPeriod hashes, the most any period looks back
      std::memmove(hist_, hist_ + kCap - kMaxPeriod, kMaxPeriod * sizeof(uint32_t));
      len_ = kMaxPeriod;
    }
    // Periods L <= len_ only: j from kMaxPeriod - min(len_, kMaxPeriod) to kMaxPeriod - 3.
    const int32_t j0 = kMaxPeriod - std::min<int32_t>(len_, kMaxPeriod);
    const int32_t back = len_ - kMaxPeriod;  // hist_[back + j] is the op L before
    int32_t best = 0;                        // max of run + j: >= kMaxPeriod when a period fits
    for (int32_t j = j0; j <= kMaxPeriod - kMinPeriod; ++j) {
      run_[j] = hist_[back + j] == h ? run_[j] + 1 : 0;
      best = std::max(best, run_[j] + j);
    }
    any_ = best >= kMaxPeriod;
    hist_[len_++] = h;
  }
  // Cut where the last L ops repeat the L before (3 <= L <= 128, L <= seg_len); the period
  // found last time is tried first, then the smallest.
  bool repeated_suffix(int64_t seg_len) {
    if (!any_) return false;
    if (last_period_ && last_period_ <= seg_len && run(last_period_) >= last_period_) return true;
    const int32_t top = int32_t(std::min<int64_t>(kMaxPeriod, seg_len));
    for (int32_t L = kMinPeriod; L <= top; ++L)
      if (run(L) >= L && L != last_period_) {
        last_period_ = L;
        return true;
      }
    return false;
  }
  void reset_period() { last_period_ = 0; }

 private:
  int32_t run(int32_t L) const { return run_[kMaxPeriod - L]; }
  static constexpr int32_t kCap = 4 * kMaxPeriod;
  uint32_t hist_[kCap] = {};
  int32_t len_ = 0;
  int32_t run_[kMaxPeriod + 1] = {};
  int32_t last_period_ = 0;
  bool any_ = false;
};

}  // namespace tessera::graph_detail
