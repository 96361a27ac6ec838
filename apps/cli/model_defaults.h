// What generate and serve share about the model they load: the bundled default model and the
// defaults it was trained with, so that the same request gives the same image through either.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace tessera::cli {

// The bundled default model: the trained shapes model once it exists, else the tiny test
// pipeline (random weights: it makes noise, but runs the whole FLUX.1 path).
std::string default_model(bool* is_test_pipeline);

// The bundled model is trained at one size and T5 length: its vae sample_size and tokenizer_2
// model_max_length are its defaults (FluxPipeline.__call__'s, 1024 px and 512 tokens, are not).
struct BundledDefaults {
  std::optional<int64_t> size, max_sequence_length;
};
BundledDefaults bundled_defaults(const std::string& model);

}  // namespace tessera::cli
