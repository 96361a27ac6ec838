// judge_shapes: whether an image shows the colour and shape its prompt asks for, from pixel
// statistics alone (no neural network): background from the border, a two-colour segmentation,
// connected components, and each component's bounding-box fill ratio and convex-hull solidity.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::judge {

struct Rgb {
  double r = 0, g = 0, b = 0;
};

// The named colours of the tessera-shapes model (reference/train_default.py uses the same RGB).
const std::vector<std::pair<std::string, Rgb>>& named_colours();
const Rgb& colour_rgb(const std::string& name);  // throws tessera::Error for unknown names
std::string nearest_colour(const Rgb& c);
// "circle", "square", "triangle", "star".
const std::vector<std::string>& shape_names();

// What a prompt such as "a red circle on a white background" or "two blue squares" asks for.
struct Request {
  std::string colour, shape, background;  // background "" when the prompt names none
  int count = 1;
};
// Throws tessera::Error "[judge_shapes] ..." when the prompt names no known colour or shape.
Request parse_prompt(const std::string& prompt);

struct Component {
  int64_t area = 0;
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // bounding box, inclusive
  double fill = 0;                     // area / bounding-box area
  double solidity = 0;                 // area / convex-hull area (hull of the pixel corners)
  Rgb mean;                            // mean colour of the interior pixels
  std::string colour, shape;
};

struct Verdict {
  Request request;
  Rgb background_rgb;
  std::string background;
  std::vector<Component> components;
  bool colour_ok = false, shape_ok = false, count_ok = false, background_ok = false;
};

Verdict judge_image(const uint8_t* rgb, int width, int height, const Request& request);
std::string verdict_json(const Verdict& v);  // one line
std::string verdict_text(const Verdict& v);  // one line for people

// Draws shapes as the training data does (4x supersampled, box-filtered): for tests.
struct Placed {
  std::string shape;
  double cx = 0, cy = 0, r = 0;  // centre and half-size in pixels
};
std::vector<uint8_t> draw_shapes(int width, int height, const std::string& colour,
                                 const std::string& background, const std::vector<Placed>& s);

}  // namespace tessera::judge
