#pragma once
// The `quest` command line: subcommands generate, make-model (and those later issues add).
// Exit codes: 0 success; 2 bad input (malformed model file, invalid flag value, resource limits), printed as one
// line "error: ..." on stderr; 1 an internal error.
namespace quest {
int run_cli(int argc, char** argv);
}
