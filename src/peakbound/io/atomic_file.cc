#include "peakbound/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "peakbound/core/error.h"

namespace peakbound {

void fsync_directory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw Error(dir + ": cannot open the folder to flush it: " + std::strerror(errno));
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  // Some file systems (tmpfs on old kernels) refuse fsync on a folder: nothing to flush.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    throw Error(dir + ": cannot flush the folder to disk: " + std::strerror(err));
}

void write_file_atomic(const std::string& path, std::span<const std::span<const std::byte>> parts, FileSum* sum) {
  if (sum != nullptr) *sum = FileSum{};
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::string tmp_name = ".";  // appended step by step: GCC 12 warns falsely on a + b + c here
  tmp_name += target.filename().string();
  tmp_name += ".tmpXXXXXX";
  std::string tmpl = (dir / tmp_name).string();
  // The rename would replace whatever the name holds: a device (/dev/full, as root), a
  // FIFO or a socket is refused before anything is written, and so is a folder.
  struct stat sb {};
  if (::stat(path.c_str(), &sb) == 0 && !S_ISREG(sb.st_mode))
    throw Error(path + ": " +
                (S_ISDIR(sb.st_mode) ? std::string("is a directory")
                                     : S_ISFIFO(sb.st_mode) ? std::string("is a FIFO")
                                     : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? std::string("is a device")
                                     : S_ISSOCK(sb.st_mode) ? std::string("is a socket")
                                                            : std::string("is not a regular file")) +
                ": not replaced; give the path of a regular file (or of one that does not exist yet)");
  const int fd = mkstemp(tmpl.data());
  if (fd < 0) throw Error(path + ": cannot create a temporary file in " + dir.string() + ": " + std::strerror(errno));
  // mkstemp makes the file 0600; give it the mode an ordinary create would (0666 & ~umask).
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw Error(path + ": " + what + ": " + std::strerror(err));
  };
  for (std::span<const std::byte> part : parts) {
    if (sum != nullptr) {
      sum->crc = crc32(part.data(), part.size(), sum->crc);
      sum->bytes += part.size();
    }
    const std::byte* c = part.data();
    std::size_t n = part.size();
    while (n > 0) {
      const ssize_t w = ::write(fd, c, std::min<std::size_t>(n, std::size_t{1} << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        fail("cannot write", errno);
      }
      if (w == 0) fail("cannot write", EIO);
      c += w;
      n -= static_cast<std::size_t>(w);
    }
  }
  if (::fsync(fd) != 0) fail("cannot flush to disk", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmpl.c_str());
    throw Error(path + ": cannot close: " + std::strerror(err));
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmpl.c_str());
    throw Error(path + ": cannot rename the written file into place: " + std::strerror(err));
  }
  fsync_directory(dir.string());
}

void write_text_atomic(const std::string& path, std::string_view text) {
  const std::span<const std::byte> part(reinterpret_cast<const std::byte*>(text.data()), text.size());
  write_file_atomic(path, std::span<const std::span<const std::byte>>(&part, 1));
}

namespace {

// Slicing-by-8 tables: t[0] the byte table, t[k][i] = CRC of byte i followed by k zeros.
struct CrcTables {
  std::uint32_t t[8][256];
  CrcTables() {
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int k = 1; k < 8; ++k) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xFFu];
  }
};

}  // namespace

std::uint32_t crc32(const void* data, std::size_t n, std::uint32_t crc) {
  static const CrcTables tables;
  const auto& t = tables.t;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (; n >= 8; n -= 8, p += 8) {  // eight bytes a step (little-endian byte order)
    const std::uint32_t lo = crc ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 |
                                    std::uint32_t{p[3]} << 24);
    crc = t[7][lo & 0xFFu] ^ t[6][(lo >> 8) & 0xFFu] ^ t[5][(lo >> 16) & 0xFFu] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
          t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) crc = t[0][(crc ^ *p) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

FileSum file_sum(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  FileSum s;
  std::vector<unsigned char> buf(std::size_t{1} << 20);
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot read: " + std::strerror(err));
    }
    if (r == 0) break;
    s.crc = crc32(buf.data(), static_cast<std::size_t>(r), s.crc);
    s.bytes += static_cast<std::uint64_t>(r);
  }
  ::close(fd);
  return s;
}

}  // namespace peakbound
