// The vit command line (see cli.h): its flags, mapped onto TrainOptions, then training or --predict.
#include "apps/vit/cli.h"

#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/common/app_main.h"
#include "apps/common/run_options.h"
#include "attention/registry.h"
#include "core/error.h"
#include "data.h"
#include "train.h"

namespace attn = linea::attn;

namespace vit {

int run_cli(int argc, char** argv) {
  linea::apps::start_app(argv);  // first: may restart the process; joins an MPI job (app_main.h)
  vit::TrainOptions o;
  o.data_dir = vit::kFashionMnistDir;
  std::vector<std::string> predict_images;
  CLI::App app{"vit: train a Vision Transformer on Fashion-MNIST or an image folder, or classify images"};
  app.set_help_all_flag("--help-all", "all flags, grouped");

  auto* data = "Data";
  app.add_option("--data", o.data_dir, "folder with the Fashion-MNIST IDX files (*-idx?-ubyte[.gz])")
      ->group(data)->capture_default_str();
  app.add_option("--image-folder", o.image_folder,
                 "train on DIR/train/<class>/*.png|jpg and test on DIR/test/<class>/* instead")->group(data);
  app.add_option("--image-size", o.image_size, "image folder: resize images to NxN (0: keep their size)")
      ->group(data)->check(CLI::Range(0, 4096));
  app.add_option("--channels", o.channels, "image folder: 1 (gray) or 3 (RGB); 0: from the first image")
      ->group(data)->check(CLI::IsMember({0, 1, 3}));
  app.add_option("--train-limit", o.train_limit, "use only the first N training images (0: all)")
      ->group(data)
      ->check(linea::apps::non_negative_number());
  app.add_option("--test-limit", o.test_limit, "use only the first N test images (0: all)")
      ->group(data)
      ->check(linea::apps::non_negative_number());

  auto* model = "Model";
  app.add_option("--attention", o.model.attention,
                 "encoder self-attention: " + attn::attention_flag_help(attn::AttentionUse::Self))
      ->group(model)->capture_default_str();
  app.add_option("--patch", o.model.patch, "patch size (must divide the image size)")
      ->group(model)->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--dim", o.model.dim, "token width")->group(model)->capture_default_str()->check(CLI::Range(1, 8192));
  app.add_option("--depth", o.model.depth, "encoder layers")->group(model)->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--heads", o.model.heads, "attention heads (must divide --dim)")
      ->group(model)->capture_default_str()->check(CLI::Range(1, 256));
  app.add_option("--mlp-ratio", o.model.mlp_ratio, "MLP hidden width / dim")
      ->group(model)
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  app.add_option("--dropout", o.model.dropout, "dropout on embeddings, residual branches and MLP")
      ->group(model)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 0.99));
  app.add_option("--init", o.model.init, "Linear layers' initialization: pytorch (nn.Linear's default) or "
                 "trunc_normal (std 0.02, as timm's ViT)")->group(model)->capture_default_str()->check(CLI::IsMember({"trunc_normal", "pytorch"}));
  app.add_option("--pool", o.model.pool, "classify from the CLS token or the mean of the tokens")
      ->group(model)->capture_default_str()->check(CLI::IsMember({"cls", "mean"}));

  auto* train = "Training";
  app.add_option("--epochs", o.epochs, "training epochs")->group(train)->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--time-budget", o.time_budget,
                 "seconds the run may take, from loading the data: train the epochs that fit at the speed of "
                 "probe steps (at most --epochs; 0: off)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--batch-size", o.batch_size, "images per step")
      ->group(train)->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", o.lr, "peak learning rate (AdamW)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::positive_number());
  app.add_option("--min-lr", o.min_lr, "learning rate at the end of the cosine decay")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--weight-decay", o.weight_decay,
                 "AdamW decoupled weight decay (not on biases, norms, "
                 "positional embedding, CLS token)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--warmup", o.warmup_epochs, "linear warmup length in epochs, then cosine decay")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_option("--label-smoothing", o.label_smoothing, "label smoothing of the training loss")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::finite_range(0.0, 0.99));
  linea::apps::add_clip_flag(app, o.clip, train);
  app.add_option("--crop-padding", o.crop_padding,
                 "augmentation: random crop of the image zero-padded by N pixels (0: off)")
      ->group(train)
      ->capture_default_str()
      ->check(linea::apps::non_negative_number());
  app.add_flag("--flip,!--no-flip", o.flip, "augmentation: random horizontal flips")->group(train)->capture_default_str();
  linea::apps::add_run_flags(app, o.run, train, "Running");
  app.get_option("--checkpoint")
      ->description("checkpoint folder (default OUT/checkpoint); with --predict, the checkpoint to classify with");
  app.add_option("--predict", predict_images, "classify these PNG/JPEG images with --checkpoint DIR "
                 "(top-3 classes and probabilities) instead of training")->group("Running");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!predict_images.empty()) {
      if (o.run.checkpoint_dir.empty()) {
        std::fprintf(stderr, "vit: --predict needs --checkpoint DIR (the checkpoint folder of a training run)\n");
        return 2;
      }
      vit::predict(predict_images, o.run.checkpoint_dir, o.run.device);
      return 0;
    }
    vit::run_training(o);
  } catch (const std::exception& e) {
    return linea::apps::fail(e);
  }
  return 0;
}

}  // namespace vit
