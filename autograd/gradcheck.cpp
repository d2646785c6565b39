// Full-Jacobian gradient check (see gradcheck.h).
#include "autograd/gradcheck.h"

#include <cmath>
#include <random>
#include <sstream>

#include "autograd/autograd.h"
#include "core/ops.h"

namespace linea {

namespace {
// Element offsets (in elements, relative to data_ptr) of t's logical elements in row-major order.
std::vector<int64_t> element_offsets(const Tensor& t) {
  std::vector<int64_t> offs(static_cast<size_t>(t.numel()));
  const Shape& s = t.shape();
  const Strides& st = t.strides();
  std::vector<int64_t> idx(s.size(), 0);
  for (size_t k = 0; k < offs.size(); ++k) {
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d) o += idx[d] * st[d];
    offs[k] = o;
    for (size_t d = s.size(); d-- > 0;) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  return offs;
}

// n normal draws scaled to unit length.
std::vector<double> random_unit(int64_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<double> u(static_cast<size_t>(n));
  double norm2 = 0;
  for (double& e : u) {
    e = normal(rng);
    norm2 += e * e;
  }
  for (double& e : u) e /= std::sqrt(norm2 > 0 ? norm2 : 1.0);
  return u;
}

std::string index_str(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = flat % s[d];
    flat /= s[d];
  }
  return shape_str(idx);
}

// The probes of input i (gradcheck.h): numeric v . (f(x + eps u) - f(x - eps u)) / (2 eps)
// against analytic (backward of v) . u; updates res with the worst probe.
void probe_input(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor>& leaves,
                 const Tensor& y, size_t i, const GradcheckOptions& opts, GradcheckResult& res, double& worst_excess) {
  Tensor x = leaves[i];
  const int64_t nx = x.numel(), ny = y.numel();
  const std::vector<int64_t> offs = element_offsets(x);
  double* p = static_cast<double*>(x.data_ptr());
  std::mt19937_64 rng(opts.probe_seed * 1000003u + i);
  for (int64_t probe = 0; probe < opts.probes; ++probe) {
    const std::vector<double> u = random_unit(nx, rng), v = random_unit(ny, rng);
    std::vector<double> orig(static_cast<size_t>(nx));
    for (int64_t j = 0; j < nx; ++j) orig[j] = p[offs[j]];
    double numeric = 0;
    {
      NoGradGuard ng;
      for (int64_t j = 0; j < nx; ++j) p[offs[j]] = orig[j] + opts.eps * u[j];
      const std::vector<double> yp = f(leaves).to_vector<double>();
      for (int64_t j = 0; j < nx; ++j) p[offs[j]] = orig[j] - opts.eps * u[j];
      const std::vector<double> ym = f(leaves).to_vector<double>();
      for (int64_t j = 0; j < nx; ++j) p[offs[j]] = orig[j];
      for (int64_t k = 0; k < ny; ++k) numeric += v[k] * (yp[k] - ym[k]) / (2 * opts.eps);
    }
    double analytic = 0;
    if (y.requires_grad()) {
      for (auto& l : leaves)
        if (l.defined() && l.requires_grad()) l.zero_grad();
      y.backward(from_vector<double>(v, y.shape()), /*retain_graph=*/true);
      const Tensor g = x.grad();
      if (g.defined()) {
        LINEA_CHECK(g.shape() == x.shape(), "gradcheck: gradient shape ", shape_str(g.shape()),
                    " differs from input shape ", shape_str(x.shape()));
        const std::vector<double> gv = g.to_vector<double>();
        for (int64_t j = 0; j < nx; ++j) analytic += gv[j] * u[j];
      }
    }
    const double err = std::fabs(analytic - numeric);
    const double excess = err - (opts.atol + opts.rtol * std::fabs(numeric));
    res.max_abs_error = std::max(res.max_abs_error, err);
    if (std::isnan(analytic) || std::isnan(numeric) || excess > worst_excess) {
      worst_excess = std::isnan(excess) ? INFINITY : excess;
      res.ok = false;
      std::ostringstream os;
      os << "gradcheck failed for input " << i << " (shape " << shape_str(x.shape()) << "), random probe " << probe
         << " (seed " << opts.probe_seed << "): v . J u analytic " << analytic << ", numeric " << numeric
         << ", |diff| " << err << " > atol " << opts.atol << " + rtol " << opts.rtol << " * |numeric|";
      res.message = os.str();
    }
  }
}

}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                          GradcheckOptions opts) {
  // Fresh leaves sharing the inputs' storage and strides (so non-contiguous inputs stay so).
  std::vector<Tensor> leaves;
  std::vector<bool> checked;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    bool c = in.defined() && in.requires_grad();
    if (c)
      LINEA_CHECK(in.dtype() == DType::Float64 && in.is_cpu(), "gradcheck: input ", i,
                  " must be a float64 CPU tensor, got ", dtype_name(in.dtype()), " on ", in.device().str());
    Tensor leaf = in.defined() ? in.detach() : in;
    if (c) leaf.requires_grad_(true);
    leaves.push_back(leaf);
    checked.push_back(c);
  }

  Tensor y = f(leaves);
  LINEA_CHECK(y.defined() && y.dtype() == DType::Float64, "gradcheck: f must return a float64 tensor");
  const int64_t ny = y.numel();

  GradcheckResult res;
  double worst_excess = 0.0;
  for (size_t i = 0; i < leaves.size(); ++i) {
    if (!checked[i]) continue;
    if (opts.probes > 0) {
      probe_input(f, leaves, y, i, opts, res, worst_excess);
      continue;
    }
    Tensor x = leaves[i];
    const int64_t nx = x.numel();
    // numeric[j][k] = d y_k / d x_j by central differences.
    std::vector<double> numeric(static_cast<size_t>(nx * ny));
    std::vector<int64_t> offs = element_offsets(x);
    double* p = static_cast<double*>(x.data_ptr());
    {
      NoGradGuard ng;
      for (int64_t j = 0; j < nx; ++j) {
        double orig = p[offs[j]];
        p[offs[j]] = orig + opts.eps;
        std::vector<double> yp = f(leaves).to_vector<double>();
        p[offs[j]] = orig - opts.eps;
        std::vector<double> ym = f(leaves).to_vector<double>();
        p[offs[j]] = orig;
        for (int64_t k = 0; k < ny; ++k) numeric[j * ny + k] = (yp[k] - ym[k]) / (2 * opts.eps);
      }
    }
    // analytic[j][k] by backward with one-hot output gradients.
    std::vector<double> analytic(static_cast<size_t>(nx * ny), 0.0);
    if (y.requires_grad()) {
      for (int64_t k = 0; k < ny; ++k) {
        std::vector<double> onehot(static_cast<size_t>(ny), 0.0);
        onehot[k] = 1.0;
        for (auto& l : leaves)
          if (l.defined() && l.requires_grad()) l.zero_grad();
        y.backward(from_vector<double>(onehot, y.shape()), /*retain_graph=*/true);
        Tensor g = x.grad();
        if (!g.defined()) continue;
        LINEA_CHECK(g.shape() == x.shape(), "gradcheck: gradient shape ", shape_str(g.shape()),
                    " differs from input shape ", shape_str(x.shape()));
        std::vector<double> gv = g.to_vector<double>();
        for (int64_t j = 0; j < nx; ++j) analytic[j * ny + k] = gv[j];
      }
    }
    for (int64_t j = 0; j < nx; ++j) {
      for (int64_t k = 0; k < ny; ++k) {
        double a = analytic[j * ny + k], n = numeric[j * ny + k];
        double err = std::fabs(a - n);
        double excess = err - (opts.atol + opts.rtol * std::fabs(n));
        res.max_abs_error = std::max(res.max_abs_error, err);
        if (std::isnan(a) || std::isnan(n) || excess > worst_excess) {
          worst_excess = std::isnan(excess) ? INFINITY : excess;
          res.ok = false;
          std::ostringstream os;
          os << "gradcheck failed for input " << i << " (shape " << shape_str(x.shape()) << "): d out"
             << index_str(k, y.shape()) << " / d in" << index_str(j, x.shape()) << ": analytic " << a << ", numeric "
             << n << ", |diff| " << err << " > atol " << opts.atol << " + rtol " << opts.rtol << " * |numeric|";
          res.message = os.str();
        }
      }
    }
  }
  for (auto& l : leaves)
    if (l.defined() && l.requires_grad()) l.zero_grad();
  return res;
}

}  // namespace linea
