#include "lib/base/version.h"

namespace fd {

const char* version() { return FDTRAIN_VERSION; }

}  // namespace fd
