#include "commands.h"

int main(int argc, char** argv) {
  return cupcake::tools::RunMain(cupcake::plan_cli::kTool, cupcake::plan_cli::Commands(), argc, argv);
}
