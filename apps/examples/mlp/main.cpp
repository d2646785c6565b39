// The first Linea program to read: a small MLP learns to classify a generated 2-D spiral.
//
//   mlp                       train and print loss/accuracy
//   mlp --save out/           also write out/model.safetensors and out/predictions.csv
//
// It shows the whole loop a model needs: data as tensors, a model made of nn::Linear layers
// (named fc1, fc2, ... with ReLU between them; weights stored [out, in] as PyTorch does),
// a loss, backward(), an optimizer step, evaluation without a graph, and saving.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "apps/common/run_options.h"
#include "linea.h"
#include "nn/io_util.h"
#include "nn/layers.h"
#include "nn/optim.h"
#include "nn/safetensors.h"

using namespace linea;

// The spiral: `classes` arms of `per_class` points each; point i of arm c lies at radius
// r = i / per_class and angle 4c + 4r plus Gaussian noise. Returns {points [N, 2], labels [N]}.
std::pair<Tensor, Tensor> make_spiral(int64_t classes, int64_t per_class, double noise) {
  const int64_t n = classes * per_class;
  Tensor r = arange(0.0, static_cast<double>(per_class)) / static_cast<double>(per_class);      // [P]
  Tensor arm = arange(0.0, static_cast<double>(classes)).reshape({classes, 1});                 // [C, 1]
  Tensor theta = arm * (2.0 * M_PI / classes) + r * 4.0 + randn({classes, per_class}) * noise;  // [C, P]
  Tensor radius = r.expand({classes, per_class});
  Tensor x = stack({radius * sin(theta), radius * cos(theta)}, -1).reshape({n, 2});  // [N, 2]
  Tensor labels = arange(0.0, static_cast<double>(classes), 1.0, TensorOptions(DType::Int64))
                      .reshape({classes, 1})
                      .expand({classes, per_class})
                      .reshape({n});  // [N]
  return {x, labels};
}

// fc1 -> ReLU -> fc2 -> ReLU -> ... -> fcK
struct Mlp : nn::Module {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  Mlp(int64_t in, int64_t hidden, int64_t out, int64_t depth) : nn::Module("Mlp") {
    for (int64_t i = 0; i < depth; ++i) {
      int64_t a = i == 0 ? in : hidden, b = i + 1 == depth ? out : hidden;
      layers.push_back(register_module("fc" + std::to_string(i + 1), std::make_shared<nn::Linear>(a, b)));
    }
  }
  Tensor forward(Tensor x) {
    for (size_t i = 0; i < layers.size(); ++i) {
      x = (*layers[i])(x);
      if (i + 1 < layers.size()) x = relu(x);
    }
    return x;  // logits [N, classes]
  }
};

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP on a 2-D spiral (Linea's first example)"};
  int64_t classes = 3, per_class = 200, hidden = 64, depth = 3, steps = 500;
  double lr = 1e-2, noise = 0.2, min_accuracy = 0.0;
  uint64_t seed = 0;
  std::string save_dir;
  app.add_option("--classes", classes, "number of spiral arms")->check(CLI::Range(2, 100));
  app.add_option("--points", per_class, "points per arm")->check(CLI::Range(10, 100000));
  app.add_option("--hidden", hidden, "hidden width")->check(CLI::Range(1, 4096));
  app.add_option("--depth", depth, "number of Linear layers")->check(CLI::Range(1, 16));
  app.add_option("--steps", steps, "full-batch training steps")->check(CLI::Range(0, 1000000));
  // apps::positive_number() and friends reject NaN and Inf, which CLI11's own checks let through.
  app.add_option("--lr", lr, "Adam learning rate")->check(apps::positive_number());
  app.add_option("--noise", noise, "angular noise of the spiral")->check(apps::non_negative_number());
  app.add_option("--seed", seed, "random seed (data and initialization)");
  app.add_option("--save", save_dir, "write model.safetensors and predictions.csv into this folder");
  app.add_option("--min-accuracy", min_accuracy, "exit with status 1 if the final accuracy is below this")
      ->check(apps::finite_range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);

  try {
    LINEA_CHECK(save_dir.empty() || !std::filesystem::exists(save_dir) || std::filesystem::is_directory(save_dir),
                "mlp: --save '", save_dir, "' is a file, not a folder");
    manual_seed(seed);
    // Not `auto [x, y] = ...`: clang < 16 cannot capture a structured binding in the lambda below.
    const std::pair<Tensor, Tensor> spiral = make_spiral(classes, per_class, noise);
    const Tensor &x = spiral.first, &y = spiral.second;  // [N, 2], [N]
    auto model = std::make_shared<Mlp>(2, hidden, classes, depth);
    nn::Adam opt({nn::ParamGroup{model->parameters(), lr, 0.0}});
    std::printf("%s\n%lld parameters, %lld points, %lld classes\n", model->str().c_str(),
                static_cast<long long>(model->num_parameters()), static_cast<long long>(x.size(0)),
                static_cast<long long>(classes));

    auto accuracy = [&](const Tensor& logits) { return mean(eq(argmax(logits, 1), y).to(DType::Float32)).item(); };
    for (int64_t step = 1; step <= steps; ++step) {
      Tensor logits = model->forward(x);
      Tensor loss = cross_entropy(logits, y);
      // A diverged run stops here, naming the step, instead of training on NaN.
      const double l = loss.item();
      LINEA_CHECK(std::isfinite(l), "mlp: step ", step, ": non-finite loss (", l,
                  "); training diverged (try a "
                  "smaller --lr)");
      opt.zero_grad();
      loss.backward();
      opt.step();
      if (step % 100 == 0 || step == steps)
        std::printf("step %5lld  loss %.4f  accuracy %.3f\n", static_cast<long long>(step), l,
                    accuracy(logits.detach()));
    }

    NoGradGuard no_grad;  // evaluation records no graph
    Tensor logits = model->forward(x);
    double acc = accuracy(logits);
    std::printf("final accuracy: %.4f\n", acc);

    if (!save_dir.empty()) {
      std::filesystem::create_directories(save_dir);
      nn::save_safetensors(save_dir + "/model.safetensors", model->state_dict(),
                           {{"format", "pt"}, {"model", "mlp"}, {"depth", std::to_string(depth)}});
      // The first 100 points with the model's prediction and logits, for checking elsewhere.
      std::ostringstream csv;
      csv << "x,y,predicted";
      for (int64_t c = 0; c < classes; ++c) csv << ",logit_" << c;
      csv << "\n";
      const int64_t rows = std::min<int64_t>(100, x.size(0));
      auto xv = x.to_vector<float>();
      auto lv = logits.to_vector<float>();
      auto pv = argmax(logits, 1).to_vector<int64_t>();
      char buf[64];
      for (int64_t i = 0; i < rows; ++i) {
        // %.9g prints every float32 exactly enough to read it back bit for bit.
        std::snprintf(buf, sizeof buf, "%.9g,%.9g,%lld", xv[2 * i], xv[2 * i + 1], static_cast<long long>(pv[i]));
        csv << buf;
        for (int64_t c = 0; c < classes; ++c) {
          std::snprintf(buf, sizeof buf, ",%.9g", lv[i * classes + c]);
          csv << buf;
        }
        csv << "\n";
      }
      nn::write_text_file_atomic(save_dir + "/predictions.csv", csv.str());
      std::printf("saved %s/model.safetensors and %s/predictions.csv\n", save_dir.c_str(), save_dir.c_str());
    }
    if (acc < min_accuracy) {
      std::fprintf(stderr, "mlp: final accuracy %.4f is below --min-accuracy %.4f\n", acc, min_accuracy);
      return 1;
    }
  } catch (const std::exception& e) {  // linea::Error, and the filesystem's errors of --save
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
