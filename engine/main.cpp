#include "engine/cli.h"

int main(int argc, char** argv) { return quest::run_cli(argc, argv); }
