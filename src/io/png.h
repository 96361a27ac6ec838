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
  std::string prompt_2;  // the T5 prompt when given ("": `prompt` is the T5 prompt too)
  std::string seed;  // the integer given to manual_seed, in decimal (negative ones stay negative)
  int steps = 0;
  double guidance = 0;
  int width = 0;
  int height = 0;
  std::string model;
};
// Keywords prompt, prompt_2 (when set), seed, steps, guidance, size ("WxH"), model and Software.
PngText generation_text(const GenerationInfo& info);

// Throws tessera::Error "[png] <problem>" unless write_png can store every entry of `text`:
// keywords of 1-79 printable ASCII characters, texts in UTF-8 without NUL bytes (any length a
// chunk holds, empty ones included).
void check_png_text(const PngText& text);

// Writes `rgb` (height x width x 3 uint8) atomically: a temporary file is renamed into place,
// so `path` is either the whole new image or untouched. Text goes in chunks right after IHDR:
// printable ASCII and line feeds (an empty text too) in tEXt, other text (UTF-8) in uncompressed
// iTXt. Throws tessera::Error "<path>: <problem>".
void write_png(const std::string& path, const uint8_t* rgb, int width, int height,
               const PngText& text = {});

// The bytes write_png writes, in memory (the server sends them; nothing touches the disk).
// Errors name `what`.
std::string encode_png(const uint8_t* rgb, int width, int height, const PngText& text = {},
                       const std::string& what = "png");

// Reads any PNG, converted to 8-bit RGB, with its text chunks.
PngImage read_png(const std::string& path);

}  // namespace tessera
