#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace tessera {

void write_file_atomically(const std::string& path, const std::function<bool(std::FILE*)>& write) {
  static std::atomic<unsigned> counter{0};
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    // O_EXCL: never clobber another writer's temporary; 0666 lets the umask decide, as fopen.
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  TESSERA_CHECK(fd >= 0, path, ": cannot write (", std::strerror(errno), ")");
  std::FILE* fp = ::fdopen(fd, "wb");
  if (!fp) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    TESSERA_FAIL(path, ": cannot write (", std::strerror(err), ")");
  }
  bool ok = false;
  int err = 0;
  try {
    ok = write(fp);
    err = errno;
    ok = ok && std::fflush(fp) == 0 && ::fsync(::fileno(fp)) == 0;
    if (!ok && err == 0) err = errno;
  } catch (...) {
    std::fclose(fp);
    ::unlink(tmp.c_str());
    throw;
  }
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) {
    if (err == 0) err = errno;
    ::unlink(tmp.c_str());
    TESSERA_FAIL(path, ": write failed (", std::strerror(err ? err : EIO), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    TESSERA_FAIL(path, ": cannot replace the file (", std::strerror(err), ")");
  }
}

bool read_whole_file(const std::string& path, std::string* bytes) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::stringstream buf;
  buf << f.rdbuf();
  *bytes = buf.str();
  return true;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace tessera
