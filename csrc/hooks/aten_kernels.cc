#include "hooks/aten_kernels.h"

#include <limits>

namespace braid {
namespace hooks {

void narrowDividedAten(const at::Tensor& buffer, const at::Tensor& compressed, float divisor) {
  // One kernel: the quotient is formed in float32 and rounded straight into
  // the 16-bit output, as the CPU loop does. The divisor is a CPU scalar, which
  // a GPU kernel takes as an argument (no copy to the device).
  at::Tensor out = compressed;
  at::div_out(out, buffer, at::scalar_tensor(divisor, at::TensorOptions().dtype(at::kFloat)));
}

namespace {

// Zeros past the end make whole chunks: they never raise a chunk's max |v|,
// and the outputs drop them again.
at::Tensor chunked(const at::Tensor& flat, int64_t chunk) {
  const int64_t n = flat.numel();
  const int64_t nchunks = (n + chunk - 1) / chunk;
  const int64_t pad = nchunks * chunk - n;
  at::Tensor padded = pad > 0 ? at::constant_pad_nd(flat, {0, pad}, 0) : flat;
  return padded.view({nchunks, chunk});
}

// The first n values of a [nchunks, chunk] tensor, flat.
at::Tensor unchunked(const at::Tensor& t, int64_t n) { return t.reshape({-1}).narrow(0, 0, n); }

// The scales at the front of a packed tensor, as float32.
at::Tensor scalesOf(const at::Tensor& packed, int64_t nchunks) {
  return packed.narrow(0, 0, nchunks * int64_t(sizeof(float))).view(at::kFloat);
}

}  // namespace

void quantizeInt8Aten(const at::Tensor& x, const at::Tensor& residual, int64_t chunk,
                      const at::Tensor& packed) {
  const int64_t n = x.numel();
  const int64_t nchunks = (n + chunk - 1) / chunk;
  at::Tensor v = chunked(residual.defined() ? x.add(residual) : x, chunk);
  at::Tensor amax = v.abs().amax({1}, /*keepdim=*/true);  // [nchunks, 1]; NaN propagates
  // inf or NaN in a chunk: NaN scale, zero q, zero residual (see int8_kernels.h).
  at::Tensor finite = at::isfinite(amax);
  at::Tensor scale = amax.div(127.f);
  // inv = 127 / m, not m / 127's reciprocal: the loop's rounding.
  at::Tensor inv = at::where(amax > 0, at::full_like(amax, 127.f).div_(amax), at::zeros_like(amax));
  at::Tensor y = v.mul(inv);
  // Round half away from zero: trunc(y + copysign(0.5, y)), as the loop's int cast.
  at::Tensor r = at::trunc(y.add(at::copysign(at::full_like(y, 0.5f), y))).clamp_(-127, 127);
  r = at::where(finite, r, at::zeros_like(r));
  scalesOf(packed, nchunks)
      .copy_(at::where(finite, scale, at::full_like(scale, std::numeric_limits<float>::quiet_NaN()))
                 .view({nchunks}));
  packed.narrow(0, nchunks * int64_t(sizeof(float)), n).copy_(unchunked(r, n));
  if (residual.defined()) {
    // v - r * scale, two roundings as in the loop (no fused multiply-add).
    at::Tensor e = v.sub(r.mul(scale));
    residual.copy_(unchunked(at::where(finite, e, at::zeros_like(e)), n));
  }
}

void dequantizeSumInt8Aten(const std::vector<at::Tensor>& packed, int64_t chunk, float factor,
                           const at::Tensor& out) {
  const int64_t n = out.numel();
  const int64_t nchunks = (n + chunk - 1) / chunk;
  const int64_t scaleBytes = nchunks * int64_t(sizeof(float));
  at::Tensor sum;
  for (const at::Tensor& p : packed) {  // rank order: every rank adds the same way
    at::Tensor s = scalesOf(p, nchunks).mul(factor).view({nchunks, 1});
    at::Tensor term = chunked(p.narrow(0, scaleBytes, n).to(at::kFloat), chunk).mul(s);
    sum = sum.defined() ? sum.add_(term) : term;
  }
  out.copy_(unchunked(sum, n));
}

void orthogonalizeAten(const at::Tensor& m, bool rows, double epsilon) {
  TORCH_INTERNAL_ASSERT(m.dim() == 2);
  const at::ScalarType type = m.scalar_type();
  at::Tensor v = rows ? m : m.t();  // vector i is v[i]
  const int64_t count = v.size(0);
  for (int64_t i = 0; i < count; ++i) {
    at::Tensor vi = v.select(0, i);
    at::Tensor d = vi.to(at::kDouble);
    at::Tensor norm = d.dot(d).sqrt_().add_(epsilon);
    // The loop's `if (norm > 0)`: a zero vector stays zero instead of NaN. A
    // device-side choice: no copy of the norm to the host.
    at::Tensor inv = at::where(norm > 0, norm.reciprocal(), at::ones_like(norm)).to(type);
    vi.mul_(inv);
    if (i + 1 == count) break;
    // All later vectors at once: v[k] -= <v[i], v[k]> v[i] (modified
    // Gram-Schmidt), the dot products in double, the update in storage type.
    at::Tensor rest = v.narrow(0, i + 1, count - i - 1);
    at::Tensor dots = at::mv(rest.to(at::kDouble), vi.to(at::kDouble)).to(type);
    rest.sub_(dots.unsqueeze(1).mul(vi.unsqueeze(0)));
  }
}

}  // namespace hooks
}  // namespace braid
