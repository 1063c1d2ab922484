// PyTorch's CUDA caching allocator driven from C++, with no Python per operation.
//
// Built on the GPU machine by replay_peer.py through torch.utils.cpp_extension.load
// (build directory under /tmp). The allocator is whichever one PyTorch chose from
// PYTORCH_CUDA_ALLOC_CONF when it started (native, native with expandable
// segments, or cudaMallocAsync); replay_peer.py sets that variable before torch is
// imported, and reads max_memory_reserved() from Python after replay() returns.
//
// replay(kinds, ids, sizes, n_ids) -> (elapsed_ns, ooms)
//   kinds: int8 buffer, 1 = allocate, 0 = free; ids, sizes: int64 buffers (the
//   parsed trace, see tracefile.py). For each event in order: an allocation calls
//   raw_alloc(size) on the current (default) stream and keeps the pointer in a flat
//   table indexed by request ID; a free calls raw_delete on it. A request the
//   allocator refuses (c10::OutOfMemoryError) is counted and its free skipped.
//   Only the loop is timed (std::chrono::steady_clock); requests the trace never
//   frees are released after the clock stops, so a second call starts with the
//   allocator's cache as the first call left it and nothing live.
//
// Headers are kept to c10 and pybind11 (no torch/extension.h) so that it builds in
// seconds.

#include <pybind11/pybind11.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;
namespace alloc = c10::cuda::CUDACachingAllocator;

namespace {

template <typename T>
const T* view(const py::buffer_info& b, const char* what) {
  if (b.ndim != 1 || b.itemsize != static_cast<py::ssize_t>(sizeof(T))) {
    throw std::invalid_argument(std::string(what) + ": want a 1-D buffer of " +
                                std::to_string(sizeof(T)) + "-byte items");
  }
  return static_cast<const T*>(b.ptr);
}

std::pair<int64_t, int64_t> replay(py::buffer kinds_buf, py::buffer ids_buf,
                                   py::buffer sizes_buf, int64_t n_ids) {
  py::buffer_info kb = kinds_buf.request(), ib = ids_buf.request(),
                  sb = sizes_buf.request();
  const int8_t* kinds = view<int8_t>(kb, "kinds");
  const int64_t* ids = view<int64_t>(ib, "ids");
  const int64_t* sizes = view<int64_t>(sb, "sizes");
  const int64_t n = kb.shape[0];
  if (ib.shape[0] != n || sb.shape[0] != n) {
    throw std::invalid_argument("kinds, ids and sizes differ in length");
  }
  for (int64_t k = 0; k < n; ++k) {
    if (ids[k] < 0 || ids[k] >= n_ids) {
      throw std::out_of_range("request ID out of range at event " + std::to_string(k));
    }
  }

  std::vector<void*> slot(static_cast<size_t>(n_ids), nullptr);
  int64_t ooms = 0;
  alloc::CUDAAllocator* a = alloc::get();
  std::chrono::steady_clock::time_point t0, t1;
  {
    py::gil_scoped_release nogil;
    t0 = std::chrono::steady_clock::now();
    for (int64_t k = 0; k < n; ++k) {
      void*& p = slot[static_cast<size_t>(ids[k])];
      if (kinds[k]) {
        try {
          p = a->raw_alloc(static_cast<size_t>(sizes[k]));
        } catch (const c10::OutOfMemoryError&) {
          ++ooms;
        }
      } else if (p != nullptr) {  // nullptr: refused, or a 0-byte request
        a->raw_delete(p);
        p = nullptr;
      }
    }
    t1 = std::chrono::steady_clock::now();
    for (void*& p : slot) {
      if (p != nullptr) {
        a->raw_delete(p);
        p = nullptr;
      }
    }
  }
  int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
  return {ns, ooms};
}

std::string allocator_name() { return alloc::get()->name(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Replay a gpumem trace through PyTorch's CUDA caching allocator from C++";
  m.def("replay", &replay, py::arg("kinds"), py::arg("ids"), py::arg("sizes"),
        py::arg("n_ids"));
  m.def("allocator_name", &allocator_name);
}
