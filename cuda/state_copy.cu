// Row and block copies of device state: the fixed-state pool's gather / stage / scatter and bank
// normalization, and the paged cache's block copies for prefix caching.
//
// One launch covers the same list of rows (or block pairs) in several buffers -- every layer's
// state tensor, every layer's K and V cache -- because a step needs the same copy in all of them and
// one launch per buffer would cost more than the copies. Buffer b is described by a source base, a
// destination base and a row size in bytes (three device arrays of 64-bit values; the bases may be
// equal). Each block copies one row of one buffer with 16-, 8-, 4- or 1-byte accesses, the widest
// that the two bases and the row size are all aligned to (uniform over the buffer, so no thread
// diverges on it).
//
// Launch: grid (x: blocks per row, any; y: rows or fewer; z: buffers or fewer), the kernels loop
// over y and z, so the 65535 limit of those grid dimensions is no limit on rows or buffers.
// Destinations must not overlap sources within one launch (a row copied twice, or a block that is
// both the destination of one pair and the source of another, is a race).
#include "device_support.cuh"

template <typename Unit>
__device__ void oga_copy_units(unsigned char* dst, const unsigned char* src, unsigned long long bytes) {
  const unsigned long long count = bytes / sizeof(Unit);
  Unit* out = reinterpret_cast<Unit*>(dst);
  const Unit* in = reinterpret_cast<const Unit*>(src);
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; i < count;
       i += stride) {
    if (in != nullptr) {
      out[i] = in[i];
    } else {
      out[i] = Unit{};
    }
  }
}

// Copies `bytes` from src to dst (src null: writes zeros), this grid's x dimension sharing the work.
__device__ void oga_copy_row(unsigned char* dst, const unsigned char* src, unsigned long long bytes) {
  const unsigned long long alignment = reinterpret_cast<unsigned long long>(dst) |
                                       reinterpret_cast<unsigned long long>(src) | bytes;
  if ((alignment & 15u) == 0) {
    oga_copy_units<uint4>(dst, src, bytes);
  } else if ((alignment & 7u) == 0) {
    oga_copy_units<unsigned long long>(dst, src, bytes);
  } else if ((alignment & 3u) == 0) {
    oga_copy_units<unsigned int>(dst, src, bytes);
  } else {
    oga_copy_units<unsigned char>(dst, src, bytes);
  }
}

__device__ __forceinline__ unsigned char* oga_base(const unsigned long long* bases, int buffer) {
  return reinterpret_cast<unsigned char*>(bases[buffer]);
}

// Gather: destination row i of each buffer <- source row rows[i]; rows[i] < 0 writes a row of zeros
// (the state of a request that has none yet). Fixed-state gather and staging copies.
extern "C" __global__ void oga_gather_rows(const unsigned long long* src_bases, const unsigned long long* dst_bases,
                                           const unsigned long long* row_bytes, int num_buffers, const int* rows,
                                           int num_rows) {
  for (int b = blockIdx.z; b < num_buffers; b += gridDim.z) {
    const unsigned long long bytes = row_bytes[b];
    for (int i = blockIdx.y; i < num_rows; i += gridDim.y) {
      const unsigned char* src = rows[i] >= 0 ? oga_base(src_bases, b) + rows[i] * bytes : nullptr;
      oga_copy_row(oga_base(dst_bases, b) + i * bytes, src, bytes);
    }
  }
}

// Scatter: destination row rows[i] of each buffer <- source row i; rows[i] < 0 is skipped (a padding
// row). Writing staged state back into bank rows.
extern "C" __global__ void oga_scatter_rows(const unsigned long long* src_bases, const unsigned long long* dst_bases,
                                            const unsigned long long* row_bytes, int num_buffers, const int* rows,
                                            int num_rows) {
  for (int b = blockIdx.z; b < num_buffers; b += gridDim.z) {
    const unsigned long long bytes = row_bytes[b];
    for (int i = blockIdx.y; i < num_rows; i += gridDim.y) {
      if (rows[i] < 0) continue;
      oga_copy_row(oga_base(dst_bases, b) + rows[i] * bytes, oga_base(src_bases, b) + i * bytes, bytes);
    }
  }
}

// Block copy: for each pair p, destination block pairs[2p + 1] <- source block pairs[2p] of a
// [num_blocks, block_bytes] buffer. Prefix caching copies a shared block before a request writes
// into it (source and destination bases equal); bank normalization copies a slot's row from one
// bank to the other (the two banks as source and destination bases).
extern "C" __global__ void oga_copy_blocks(const unsigned long long* src_bases, const unsigned long long* dst_bases,
                                           const unsigned long long* block_bytes, int num_buffers, const int* pairs,
                                           int num_pairs) {
  for (int b = blockIdx.z; b < num_buffers; b += gridDim.z) {
    const unsigned long long bytes = block_bytes[b];
    for (int p = blockIdx.y; p < num_pairs; p += gridDim.y) {
      oga_copy_row(oga_base(dst_bases, b) + pairs[2 * p + 1] * bytes, oga_base(src_bases, b) + pairs[2 * p] * bytes,
                   bytes);
    }
  }
}
