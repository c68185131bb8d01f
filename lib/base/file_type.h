// describe_file_type(): what a path names, in words, for the messages about a
// path that should be a regular file ("'/dev/zero' is a character device, not
// a regular file").
#pragma once

#include <string>

namespace fd {

// "a regular file", "a directory", "a character device", "a block device",
// "a FIFO", "a socket" or "a file of unknown type", following symbolic links;
// "" when nothing is there (or it cannot be looked at).
std::string describe_file_type(const std::string& path);

}  // namespace fd
