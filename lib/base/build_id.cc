#include "lib/base/build_id.h"

#include <elf.h>
#include <fmt/format.h>
#include <link.h>

#include <cstdint>
#include <cstring>

namespace fd {

namespace {

// Notes are (namesz, descsz, type) words, then the name and the descriptor, each padded to 4.
std::string id_in_notes(const uint8_t* p, size_t size) {
  auto pad = [](size_t n) { return (n + 3) & ~size_t{3}; };
  size_t at = 0;
  while (at + sizeof(ElfW(Nhdr)) <= size) {
    ElfW(Nhdr) h;
    std::memcpy(&h, p + at, sizeof h);
    const size_t name = at + sizeof h, desc = name + pad(h.n_namesz);
    if (desc + h.n_descsz > size) break;
    if (h.n_type == NT_GNU_BUILD_ID && h.n_namesz == 4 && std::memcmp(p + name, "GNU", 4) == 0) {
      std::string hex;
      for (size_t i = 0; i < h.n_descsz; ++i) hex += fmt::format("{:02x}", p[desc + i]);
      return hex;
    }
    at = desc + pad(h.n_descsz);
  }
  return {};
}

int first_object(struct dl_phdr_info* info, size_t, void* out) {
  auto* id = static_cast<std::string*>(out);
  for (int i = 0; i < info->dlpi_phnum && id->empty(); ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_NOTE)
      *id = id_in_notes(reinterpret_cast<const uint8_t*>(info->dlpi_addr + ph.p_vaddr),
                        size_t(ph.p_memsz));
  }
  return 1;  // the first object reported is the main program
}

}  // namespace

std::string build_id() {
  static const std::string id = [] {
    std::string out;
    dl_iterate_phdr(first_object, &out);
    return out;
  }();
  return id;
}

}  // namespace fd
