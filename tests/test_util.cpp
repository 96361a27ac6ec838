#include "test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "io/safetensors.h"
#include "ops/copy.h"

namespace tessera::test {

std::string fixture_path(const std::string& relative) {
  return std::string(TESSERA_FIXTURES_DIR) + "/" + relative;
}

bool has_fixture(const std::string& relative) {
  return std::filesystem::exists(fixture_path(relative));
}

std::map<std::string, Tensor> load_fixture(const std::string& relative) {
  return load_safetensors(fixture_path(relative));
}

static ::testing::AssertionResult same_shape(const Tensor& a, const Tensor& e) {
  if (a.shape() != e.shape())
    return ::testing::AssertionFailure()
           << "shape " << shape_str(a.shape()) << " != expected " << shape_str(e.shape());
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double rtol,
                                     double atol) {
  if (auto r = same_shape(actual, expected); !r) return r;
  const auto a = actual.to_floats(), e = expected.to_floats();
  double worst = 0;
  size_t worst_i = 0, bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(double(a[i]) - double(e[i]));
    const double excess = diff - (atol + rtol * std::fabs(double(e[i])));
    const bool nan_mismatch = std::isnan(a[i]) != std::isnan(e[i]);
    if (excess > 0 || nan_mismatch) {
      ++bad;
      if (excess > worst || nan_mismatch) {
        worst = nan_mismatch ? INFINITY : excess;
        worst_i = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " elements out of tolerance (rtol " << rtol << ", atol "
         << atol << "); worst at flat index " << worst_i << ": " << a[worst_i] << " vs expected "
         << e[worst_i];
}

::testing::AssertionResult bf16_close(const Tensor& actual, const Tensor& expected, double rtol) {
  if (auto r = same_shape(actual, expected); !r) return r;
  const auto a = actual.to_floats(), e = expected.to_floats();
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const uint16_t ab = f32_to_bf16(a[i]), eb = f32_to_bf16(e[i]);
    const int ulp = std::abs(int(int16_t(ab)) - int(int16_t(eb)));
    const bool ok = ulp <= 1 || std::fabs(a[i] - e[i]) <= rtol * std::fabs(e[i]) ||
                    (std::isnan(a[i]) && std::isnan(e[i]));
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << a.size() << " bf16 elements beyond 1 ulp / rtol " << rtol
         << "; first at flat index " << first << ": " << a[first] << " vs expected " << e[first];
}

::testing::AssertionResult activations_close(const Tensor& actual, const Tensor& expected,
                                             DType compute_dtype) {
  if (auto r = same_shape(actual, expected); !r) return r;
  const auto a = actual.to_floats(), e = expected.to_floats();
  double max_diff = 0, sum_diff = 0, max_ref = 0, sum_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(e[i]));
    if (!(d <= max_diff)) {  // also catches NaN
      max_diff = std::isnan(d) ? INFINITY : d;
      worst = i;
    }
    sum_diff += d;
    max_ref = std::max(max_ref, std::fabs(double(e[i])));
    sum_ref += std::fabs(double(e[i]));
  }
  const double scale = std::max(1.0, max_ref);
  const double n = double(std::max<size_t>(a.size(), 1));
  bool ok;
  if (compute_dtype == DType::bf16) {
    ok = sum_diff / n <= 1e-2 * (sum_ref / n) + 1e-6 && max_diff <= 5e-2 * scale;
  } else {
    ok = max_diff <= 1e-4 * scale;
  }
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << dtype_name(compute_dtype) << " activations differ: max |diff| " << max_diff
         << " at flat index " << worst << " (" << a[worst] << " vs " << e[worst]
         << "), mean |diff| " << sum_diff / n << ", mean |expected| " << sum_ref / n
         << ", max |expected| " << max_ref;
}

std::string show_ids(const std::vector<int64_t>& ids) {
  std::ostringstream os;
  for (size_t i = 0; i < ids.size() && i < 40; ++i) os << ids[i] << ' ';
  if (ids.size() > 40) os << "... (" << ids.size() << ")";
  return os.str();
}

std::string diff_summary(const Tensor& a, const Tensor& e) {
  const auto av = a.to_floats(), ev = e.to_floats();
  double mx = 0, sum = 0, ref = 0;
  for (size_t i = 0; i < av.size() && i < ev.size(); ++i) {
    const double d = std::fabs(double(av[i]) - double(ev[i]));
    mx = std::max(mx, d);
    sum += d;
    ref = std::max(ref, std::fabs(double(ev[i])));
  }
  std::ostringstream os;
  os << "max " << mx << " mean " << sum / double(std::max<size_t>(av.size(), 1)) << " (max|e| "
     << ref << ")";
  return os.str();
}

::testing::AssertionResult bit_equal(const Tensor& actual, const Tensor& expected) {
  if (auto r = same_shape(actual, expected); !r) return r;
  if (actual.dtype() != expected.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(actual.dtype())
                                         << " != expected " << dtype_name(expected.dtype());
  // Host copies: another device's memory is not readable here.
  const Tensor a = contiguous(actual).to(Device::cpu()), e = contiguous(expected).to(Device::cpu());
  const size_t es = dtype_size(a.dtype());
  const char* pa = static_cast<const char*>(a.raw_data());
  const char* pe = static_cast<const char*>(e.raw_data());
  for (int64_t i = 0; i < a.numel(); ++i) {
    if (std::memcmp(pa + i * es, pe + i * es, es) != 0) {
      return ::testing::AssertionFailure()
             << "first differing element at flat index " << i << ": " << a.to_floats()[size_t(i)]
             << " vs expected " << e.to_floats()[size_t(i)];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace tessera::test
