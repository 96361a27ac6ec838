// judge_shapes: prints whether PNG images show the colour and shape their prompt asks for.
// Usage: judge_shapes [--prompt "a red circle on a white background"] [--json] IMAGE.png...
// Without --prompt each image's own "prompt" text chunk (written by tessera generate) is used.
#include "judge_shapes.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "io/png.h"
#include "runtime/error.h"

int main(int argc, char** argv) {
  std::string prompt;
  bool json = false;
  std::vector<std::string> images;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--prompt" && i + 1 < argc) {
      prompt = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: judge_shapes [--prompt TEXT] [--json] IMAGE.png...\n"
          "Judges colour and shape from pixel statistics; without --prompt, each image's\n"
          "'prompt' text chunk is used. Prints one verdict per image (one JSON object per\n"
          "line with --json).\n");
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "judge_shapes: unknown option '%s' (expected --prompt, --json)\n",
                   a.c_str());
      return 2;
    } else {
      images.push_back(a);
    }
  }
  if (images.empty()) {
    std::fprintf(stderr,
                 "judge_shapes: no image given; usage: judge_shapes [--prompt TEXT] "
                 "[--json] IMAGE.png...\n");
    return 2;
  }
  try {
    for (const std::string& path : images) {
      const tessera::PngImage img = tessera::read_png(path);
      const std::string p = prompt.empty() ? img.text_value("prompt") : prompt;
      TESSERA_CHECK(!p.empty(), "[judge_shapes] ", path,
                    " has no 'prompt' text chunk; pass --prompt");
      const auto verdict = tessera::judge::judge_image(img.rgb.data(), img.width, img.height,
                                                       tessera::judge::parse_prompt(p));
      if (json)
        std::printf("%s\n", tessera::judge::verdict_json(verdict).c_str());
      else
        std::printf("%s: %s\n", path.c_str(), tessera::judge::verdict_text(verdict).c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "judge_shapes: %s\n", e.what());
    return 1;
  }
  return 0;
}
