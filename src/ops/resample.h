// Nearest-neighbour upsampling by an integer factor (F.interpolate(mode="nearest")).
#pragma once
#include "runtime/primitive.h"

namespace tessera {

class UpsampleNearest final : public Primitive {
 public:
  explicit UpsampleNearest(int64_t factor) : factor_(factor) {}
  const char* name() const override { return "upsample_nearest"; }
  void eval_cpu(const std::vector<Tensor>& in, std::vector<Tensor>& out) override;
  void hash_attributes(Hasher& h) const override { h.add(uint64_t(factor_)); }
  bool equal_attributes(const Primitive& o) const override {
    return static_cast<const UpsampleNearest&>(o).factor_ == factor_;
  }

  int64_t factor() const { return factor_; }

 private:
  int64_t factor_;
};

// x[N, C, H, W] -> [N, C, H*factor, W*factor]; factor 2 is the VAE decoder's Upsample2D.
Tensor upsample_nearest(const Tensor& x, int64_t factor = 2);

}  // namespace tessera
