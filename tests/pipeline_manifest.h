// The call a pipeline golden's manifest.json records: the fields FLUX.1, FLUX.2 and SD3 share.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::test {

template <class CallOptions>
CallOptions call_from_manifest(const nlohmann::json& m) {
  CallOptions call;
  call.prompt = {m["prompt"].get<std::string>()};
  call.height = m["height"].get<int64_t>();
  call.width = m["width"].get<int64_t>();
  call.num_inference_steps = m["num_inference_steps"].get<int>();
  call.guidance_scale = m["guidance_scale"].get<double>();
  call.seed = m["seed"].get<uint64_t>();
  call.max_sequence_length = m["max_sequence_length"].get<int64_t>();
  return call;
}

}  // namespace tessera::test
