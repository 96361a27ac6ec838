// Errors a user can act on: "[where] what failed; what was expected".
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

// TESSERA_CHECK(cond, "[op] message ", value, ...) throws tessera::Error when cond is false.
#define TESSERA_CHECK(cond, ...)                                         \
  do {                                                                   \
    if (!(cond)) throw ::tessera::Error(::tessera::detail::concat(__VA_ARGS__)); \
  } while (0)

#define TESSERA_FAIL(...) throw ::tessera::Error(::tessera::detail::concat(__VA_ARGS__))

}  // namespace tessera
