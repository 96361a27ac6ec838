// PNG output (libspng): 8-bit RGB images with text chunks recording how they were made.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

using PngText = std::vector<std::pair<std::string, std::string>>;  // keyword, text

struct PngImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // height * width * 3, row-major
  PngText text;              // tEXt / iTXt / zTXt chunks in file order
  // The text of `keyword`, or "" when absent.
  std::string text_value(const std::string& keyword) const;
};

// The parameters a generated image records.
struct GenerationInfo {
  std::string prompt;
  uint64_t seed = 0;
  int steps = 0;
  double guidance = 0;
  int width = 0;
  int height = 0;
  std::string model;
};
// Keywords prompt, seed, steps, guidance, size ("WxH"), model and Software.
PngText generation_text(const GenerationInfo& info);

// Writes `rgb` (height x width x 3 uint8) atomically: a temporary file is renamed into place,
// so `path` is either the whole new image or untouched. ASCII text goes in tEXt chunks, other
// text (UTF-8) in iTXt. Throws tessera::Error "<path>: <problem>".
void write_png(const std::string& path, const uint8_t* rgb, int width, int height,
               const PngText& text = {});

// Reads any PNG, converted to 8-bit RGB, with its text chunks.
PngImage read_png(const std::string& path);

}  // namespace tessera
