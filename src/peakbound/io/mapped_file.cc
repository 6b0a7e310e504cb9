#include "peakbound/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "peakbound/core/error.h"

namespace peakbound {

MappedFile::Mapping::~Mapping() {
  if (addr) munmap(addr, size);
}

MappedFile MappedFile::open(const std::string& path) {
  MappedFile f;
  f.path_ = path;
  f.map_ = std::make_shared<Mapping>();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block
  if (fd < 0) throw InvalidArgument(path + ": cannot read: " + std::strerror(errno));
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    ::close(fd);
    throw InvalidArgument(path + ": not a regular file");
  }
  const auto size = static_cast<std::size_t>(sb.st_size);
  if (size > 0) {
    void* a = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (a == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw InvalidArgument(path + ": cannot map: " + why);
    }
    f.map_->addr = a;
    f.map_->size = size;
  }
  ::close(fd);
  return f;
}

}  // namespace peakbound
