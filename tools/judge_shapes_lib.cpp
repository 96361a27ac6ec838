#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "judge_shapes.h"
#include "runtime/error.h"

namespace tessera::judge {
namespace {

double dist2(const Rgb& a, const Rgb& b) {
  return (a.r - b.r) * (a.r - b.r) + (a.g - b.g) * (a.g - b.g) + (a.b - b.b) * (a.b - b.b);
}

Rgb pixel(const uint8_t* rgb, int width, int x, int y) {
  const uint8_t* p = rgb + (size_t(y) * width + x) * 3;
  return {double(p[0]), double(p[1]), double(p[2])};
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

struct Pt {
  double x, y;
};

double cross(const Pt& o, const Pt& a, const Pt& b) {
  return (a.x - o.x) * (b.y - o.y) - (a.y - o.y) * (b.x - o.x);
}

// Area of the convex hull (monotone chain) of the points.
double hull_area(std::vector<Pt> p) {
  std::sort(p.begin(), p.end(),
            [](const Pt& a, const Pt& b) { return a.x < b.x || (a.x == b.x && a.y < b.y); });
  p.erase(std::unique(p.begin(), p.end(),
                      [](const Pt& a, const Pt& b) { return a.x == b.x && a.y == b.y; }),
          p.end());
  if (p.size() < 3) return 0;
  std::vector<Pt> h(2 * p.size());
  size_t k = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    while (k >= 2 && cross(h[k - 2], h[k - 1], p[i]) <= 0) --k;
    h[k++] = p[i];
  }
  for (size_t i = p.size() - 1, t = k + 1; i > 0; --i) {
    while (k >= t && cross(h[k - 2], h[k - 1], p[i - 1]) <= 0) --k;
    h[k++] = p[i - 1];
  }
  h.resize(k - 1);
  double a = 0;
  for (size_t i = 0; i < h.size(); ++i) {
    const Pt& u = h[i];
    const Pt& v = h[(i + 1) % h.size()];
    a += u.x * v.y - v.x * u.y;
  }
  return std::abs(a) / 2;
}

// Shape from two statistics whose ideal values are far apart: fill ratio (square 1.0,
// circle 0.785, triangle 0.5, star 0.39) and solidity (star 0.55, the others ~1).
std::string classify(double fill, double solidity) {
  if (solidity < 0.76) return "star";
  if (fill > 0.89) return "square";
  if (fill > 0.64) return "circle";
  return "triangle";
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string quote_json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

}  // namespace

const std::vector<std::pair<std::string, Rgb>>& named_colours() {
  static const std::vector<std::pair<std::string, Rgb>> colours = {
      {"red", {220, 30, 30}},     {"green", {30, 160, 50}},   {"blue", {30, 70, 220}},
      {"yellow", {245, 215, 30}}, {"orange", {245, 135, 20}}, {"purple", {135, 45, 175}},
      {"white", {255, 255, 255}}, {"black", {0, 0, 0}},       {"gray", {128, 128, 128}},
  };
  return colours;
}

const Rgb& colour_rgb(const std::string& name) {
  for (const auto& [n, c] : named_colours())
    if (n == name) return c;
  TESSERA_CHECK(false, "[judge_shapes] unknown colour '", name, "'");
  return named_colours()[0].second;
}

std::string nearest_colour(const Rgb& c) {
  std::string best;
  double best_d = 1e300;
  for (const auto& [n, rgb] : named_colours())
    if (dist2(c, rgb) < best_d) best_d = dist2(c, rgb), best = n;
  return best;
}

const std::vector<std::string>& shape_names() {
  static const std::vector<std::string> names = {"circle", "square", "triangle", "star"};
  return names;
}

Request parse_prompt(const std::string& prompt) {
  std::vector<std::string> words;
  std::string w;
  for (char c : prompt + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += char(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      words.push_back(w);
      w.clear();
    }
  }
  Request r;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& s = words[i];
    const std::string grey = s == "grey" ? "gray" : s;
    const bool is_colour = std::any_of(named_colours().begin(), named_colours().end(),
                                       [&](const auto& c) { return c.first == grey; });
    if (s == "two") r.count = 2;
    if (is_colour) {
      if (i + 1 < words.size() && words[i + 1] == "background")
        r.background = grey;
      else if (r.colour.empty())
        r.colour = grey;
    }
    for (const auto& shape : shape_names())
      if (r.shape.empty() && (s == shape || s == shape + "s")) r.shape = shape;
  }
  TESSERA_CHECK(!r.colour.empty() && !r.shape.empty(), "[judge_shapes] prompt '", prompt,
                "' names no known colour and shape; expected e.g. 'a red circle on a white "
                "background' (colours: red green blue yellow orange purple white black gray; "
                "shapes: circle square triangle star)");
  return r;
}

Verdict judge_image(const uint8_t* rgb, int width, int height, const Request& request) {
  TESSERA_CHECK(width >= 8 && height >= 8, "[judge_shapes] image is ", width, "x", height,
                "; expected at least 8x8");
  Verdict v;
  v.request = request;
  // Background: the per-channel median of the border pixels.
  std::vector<double> br, bg, bb;
  for (int x = 0; x < width; ++x)
    for (int y : {0, height - 1}) {
      const Rgb p = pixel(rgb, width, x, y);
      br.push_back(p.r), bg.push_back(p.g), bb.push_back(p.b);
    }
  for (int y = 1; y < height - 1; ++y)
    for (int x : {0, width - 1}) {
      const Rgb p = pixel(rgb, width, x, y);
      br.push_back(p.r), bg.push_back(p.g), bb.push_back(p.b);
    }
  v.background_rgb = {median(br), median(bg), median(bb)};
  v.background = nearest_colour(v.background_rgb);
  v.background_ok = request.background.empty() || v.background == request.background;

  // Foreground colour: the mean of the pixels far from the background (the farthest half of
  // those that differ at all), then each pixel goes to the nearer of the two colours.
  const size_t n = size_t(width) * height;
  std::vector<double> d(n);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      d[size_t(y) * width + x] = std::sqrt(dist2(pixel(rgb, width, x, y), v.background_rgb));
  std::vector<double> far;
  for (double x : d)
    if (x > 40) far.push_back(x);
  std::vector<uint8_t> mask(n, 0);
  if (!far.empty()) {
    const double cut = median(far);
    Rgb fg;
    double cnt = 0;
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x)
        if (d[size_t(y) * width + x] >= cut) {
          const Rgb p = pixel(rgb, width, x, y);
          fg.r += p.r, fg.g += p.g, fg.b += p.b, cnt += 1;
        }
    fg = {fg.r / cnt, fg.g / cnt, fg.b / cnt};
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) {
        const Rgb p = pixel(rgb, width, x, y);
        const size_t i = size_t(y) * width + x;
        mask[i] = d[i] > 24 && dist2(p, fg) < dist2(p, v.background_rgb);
      }
  }

  // Connected components (8-connectivity); specks under 15 pixels or 20% of the largest go.
  std::vector<int> label(n, -1);
  std::vector<std::vector<int>> comps;
  for (size_t s = 0; s < n; ++s) {
    if (!mask[s] || label[s] >= 0) continue;
    std::vector<int> stack{int(s)}, members;
    label[s] = int(comps.size());
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      members.push_back(i);
      const int x = i % width, y = i / width;
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) {
          const int nx = x + dx, ny = y + dy;
          if (nx < 0 || ny < 0 || nx >= width || ny >= height) continue;
          const int j = ny * width + nx;
          if (mask[size_t(j)] && label[size_t(j)] < 0) {
            label[size_t(j)] = int(comps.size());
            stack.push_back(j);
          }
        }
    }
    comps.push_back(std::move(members));
  }
  size_t largest = 0;
  for (const auto& c : comps) largest = std::max(largest, c.size());
  for (size_t ci = 0; ci < comps.size(); ++ci) {
    const auto& members = comps[ci];
    if (members.size() < 15 || double(members.size()) < 0.2 * double(largest)) continue;
    Component c;
    c.area = int64_t(members.size());
    c.x0 = width, c.y0 = height, c.x1 = -1, c.y1 = -1;
    std::vector<Pt> corners;
    Rgb sum, sum_all;
    double inner = 0;
    for (int i : members) {
      const int x = i % width, y = i / width;
      c.x0 = std::min(c.x0, x), c.x1 = std::max(c.x1, x);
      c.y0 = std::min(c.y0, y), c.y1 = std::max(c.y1, y);
      for (int cy = 0; cy <= 1; ++cy)
        for (int cx = 0; cx <= 1; ++cx) corners.push_back({double(x + cx), double(y + cy)});
      const Rgb p = pixel(rgb, width, x, y);
      sum_all.r += p.r, sum_all.g += p.g, sum_all.b += p.b;
      // Interior pixels (all four neighbours in the component) carry the pure colour.
      bool interior = x > 0 && y > 0 && x < width - 1 && y < height - 1;
      if (interior)
        for (int j : {i - 1, i + 1, i - width, i + width}) interior &= label[size_t(j)] == int(ci);
      if (interior) sum.r += p.r, sum.g += p.g, sum.b += p.b, inner += 1;
    }
    if (inner == 0) sum = sum_all, inner = double(members.size());
    c.mean = {sum.r / inner, sum.g / inner, sum.b / inner};
    c.colour = nearest_colour(c.mean);
    c.fill = double(c.area) / double((c.x1 - c.x0 + 1) * (c.y1 - c.y0 + 1));
    const double hull = hull_area(corners);
    c.solidity = hull > 0 ? double(c.area) / hull : 0;
    c.shape = classify(c.fill, c.solidity);
    v.components.push_back(c);
  }
  const auto& cs = v.components;
  v.colour_ok = !cs.empty() && std::all_of(cs.begin(), cs.end(), [&](const Component& c) {
    return c.colour == request.colour;
  });
  v.shape_ok = !cs.empty() && std::all_of(cs.begin(), cs.end(), [&](const Component& c) {
    return c.shape == request.shape;
  });
  v.count_ok = int(cs.size()) == request.count;
  return v;
}

std::string verdict_json(const Verdict& v) {
  std::ostringstream o;
  const auto b = [](bool x) { return x ? "true" : "false"; };
  o << "{\"colour_ok\":" << b(v.colour_ok) << ",\"shape_ok\":" << b(v.shape_ok)
    << ",\"count_ok\":" << b(v.count_ok) << ",\"background_ok\":" << b(v.background_ok)
    << ",\"asked\":{\"colour\":" << quote_json(v.request.colour)
    << ",\"shape\":" << quote_json(v.request.shape)
    << ",\"background\":" << quote_json(v.request.background) << ",\"count\":" << v.request.count
    << "},\"background\":" << quote_json(v.background) << ",\"components\":[";
  for (size_t i = 0; i < v.components.size(); ++i) {
    const Component& c = v.components[i];
    o << (i ? "," : "") << "{\"colour\":" << quote_json(c.colour)
      << ",\"shape\":" << quote_json(c.shape) << ",\"area\":" << c.area
      << ",\"fill\":" << fmt(c.fill) << ",\"solidity\":" << fmt(c.solidity) << ",\"bbox\":[" << c.x0
      << "," << c.y0 << "," << c.x1 << "," << c.y1 << "],\"rgb\":[" << fmt(c.mean.r) << ","
      << fmt(c.mean.g) << "," << fmt(c.mean.b) << "]}";
  }
  o << "]}";
  return o.str();
}

std::string verdict_text(const Verdict& v) {
  std::ostringstream o;
  o << "colour " << (v.colour_ok ? "ok" : "WRONG") << ", shape " << (v.shape_ok ? "ok" : "WRONG")
    << ", count " << (v.count_ok ? "ok" : "WRONG") << ", background "
    << (v.background_ok ? "ok" : "WRONG") << " (asked " << v.request.count << " "
    << v.request.colour << " " << v.request.shape
    << (v.request.background.empty() ? "" : " on " + v.request.background) << "; saw "
    << v.components.size() << " on " << v.background << ":";
  for (const Component& c : v.components)
    o << " " << c.colour << " " << c.shape << " (fill " << fmt(c.fill) << ", solidity "
      << fmt(c.solidity) << ")";
  o << ")";
  return o.str();
}

std::vector<uint8_t> draw_shapes(int width, int height, const std::string& colour,
                                 const std::string& background, const std::vector<Placed>& s) {
  constexpr int ss = 4;
  const Rgb fg = colour_rgb(colour), bgc = colour_rgb(background);
  const double pi = std::acos(-1.0);
  std::vector<uint8_t> out(size_t(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      int hits = 0;
      for (int sy = 0; sy < ss; ++sy)
        for (int sx = 0; sx < ss; ++sx) {
          const double px = x + (sx + 0.5) / ss, py = y + (sy + 0.5) / ss;
          bool in = false;
          for (const Placed& p : s) {
            const double dx = px - p.cx, dy = py - p.cy, r = p.r;
            if (p.shape == "circle") {
              in |= dx * dx + dy * dy <= r * r;
            } else if (p.shape == "square") {
              in |= std::abs(dx) <= r && std::abs(dy) <= r;
            } else if (p.shape == "triangle") {
              in |= dy <= r && dy >= -r && std::abs(dx) <= (dy + r) / 2;
            } else if (p.shape == "star") {
              bool inside = false;  // even-odd rule over the ten edges
              for (int k = 0; k < 10; ++k) {
                const auto vert = [&](int j) {
                  const double a = -pi / 2 + j * pi / 5, rr = j % 2 ? 0.45 * r : r;
                  return Pt{rr * std::cos(a), rr * std::sin(a)};
                };
                const Pt a = vert(k), b = vert((k + 1) % 10);
                if ((a.y > dy) != (b.y > dy) &&
                    dx < (b.x - a.x) * (dy - a.y) / (b.y - a.y + 1e-12) + a.x)
                  inside = !inside;
              }
              in |= inside;
            } else {
              TESSERA_CHECK(false, "[judge_shapes] unknown shape '", p.shape, "'");
            }
          }
          hits += in;
        }
      const double t = double(hits) / (ss * ss);
      uint8_t* o = out.data() + (size_t(y) * width + x) * 3;
      o[0] = uint8_t(std::lround(bgc.r + t * (fg.r - bgc.r)));
      o[1] = uint8_t(std::lround(bgc.g + t * (fg.g - bgc.g)));
      o[2] = uint8_t(std::lround(bgc.b + t * (fg.b - bgc.b)));
    }
  return out;
}

}  // namespace tessera::judge
