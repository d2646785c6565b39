// vit: train a Vision Transformer on Fashion-MNIST (or a folder of images) with any attention
// mechanism, and classify images with a trained checkpoint.
//
//   vit                                    train the default ViT on Fashion-MNIST (runs/vit/)
//   vit --attention lara:samples=16 --epochs 2 --out runs/lara
//   vit --resume --out runs/vit            continue an interrupted run from its checkpoint
//   vit --predict shirt.png --checkpoint runs/vit/checkpoint
//
// Flags and defaults: vit --help. What a run writes: apps/vit/train.h.
#include "apps/vit/cli.h"

int main(int argc, char** argv) { return vit::run_cli(argc, argv); }
