// This machine's host name (gethostname), for messages, run records and the ranks' agreement:
// "?" when the system gives none.
#pragma once

#include <string>

namespace fd {

std::string host_name();

}  // namespace fd
