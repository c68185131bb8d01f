#include "lib/base/file_type.h"

#include <filesystem>

namespace fd {

std::string describe_file_type(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  switch (st.type()) {
    case fs::file_type::regular:
      return "a regular file";
    case fs::file_type::directory:
      return "a directory";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::none:
    case fs::file_type::not_found:
      return "";
    default:
      return "a file of unknown type";
  }
}

}  // namespace fd
