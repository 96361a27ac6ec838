// WeightSource over a checkpoint on disk (one safetensors file or shards through an index).
#pragma once
#include "io/checkpoint.h"
#include "nn/module.h"

namespace tessera {

class CheckpointWeightSource final : public WeightSource {
 public:
  explicit CheckpointWeightSource(CheckpointReader reader) : reader_(std::move(reader)) {}
  // Opens the weights of a component folder (or a .safetensors / index.json path).
  static CheckpointWeightSource open(const std::string& path) {
    return CheckpointWeightSource(CheckpointReader::open(path));
  }
  bool contains(const std::string& name) const override { return reader_.contains(name); }
  Tensor get(const std::string& name) const override { return reader_.get(name); }
  std::vector<std::string> names() const override { return reader_.names(); }
  std::string describe() const override { return reader_.path(); }
  const CheckpointReader& reader() const { return reader_; }

 private:
  CheckpointReader reader_;
};

}  // namespace tessera
