#include "commands.h"

int main(int argc, char** argv) {
  return cupcake::tools::RunMain(cupcake::profile_cli::kTool, cupcake::profile_cli::Commands(), argc, argv);
}
