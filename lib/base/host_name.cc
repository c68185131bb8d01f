#include "lib/base/host_name.h"

#include <unistd.h>

namespace fd {

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "?";
  return buf;
}

}  // namespace fd
