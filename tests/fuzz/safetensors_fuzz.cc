// Fuzz target: the safetensors reader (lib/tensor/safetensors).
//
// Input: the bytes of a .safetensors file. Checked: open() either succeeds
// or throws fd::Error; for a file that opens, every name's entry, shape and
// dtype can be asked for, and every tensor of a supported dtype loads with
// exactly its header's byte count (bounded to keep each run fast).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "lib/tensor/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fd::fuzz::scratch_dir() + "/model.safetensors";
  fd::fuzz::write_file(path, fd::fuzz::as_view(data, size));
  fd::fuzz::expect_clean([&] {
    fd::SafetensorsFile f = fd::SafetensorsFile::open(path);
    (void)f.metadata();
    for (const std::string& name : f.names()) {
      const fd::SafetensorsFile::Entry& e = f.entry(name);
      fd::fuzz::expect_clean([&] {
        fd::Shape shape = f.shape(name);
        fd::DType dtype = f.dtype(name);
        if (e.end - e.begin > (uint64_t(1) << 24)) return;  // valid, just large
        fd::Tensor t = f.load(name);
        if (uint64_t(t.nbytes()) != e.end - e.begin || t.dtype() != dtype ||
            !(t.shape() == shape)) {
          std::fprintf(stderr, "safetensors_fuzz: %s loaded as %zu bytes, header says %llu\n",
                       name.c_str(), size_t(t.nbytes()),
                       static_cast<unsigned long long>(e.end - e.begin));
          std::abort();
        }
      });
    }
  });
  return 0;
}
