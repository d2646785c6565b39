// The vit app with one more attention mechanism: ReLU linear attention, defined in this folder
// (relu_linear.h) and registered before vit reads its flags. Every vit flag works, and
// --attention relu_linear trains it:
//
//   custom_attention --attention relu_linear --epochs 1 --out runs/relu_linear
//   custom_attention --help                  (relu_linear is listed with the built-in mechanisms)
#include "apps/vit/cli.h"
#include "relu_linear.h"

int main(int argc, char** argv) {
  example::register_relu_linear();
  return vit::run_cli(argc, argv);
}
