#pragma once
// The `quest` command line: subcommands generate, make-model (and those later issues add).
// Exit codes: 0 success; 2 bad input (malformed model file, invalid flag value, resource limits), printed as one
// line "error: ..." on stderr; 1 an internal error.
#include <string>
#include <vector>

namespace quest {
int run_cli(int argc, char** argv);

// A flag's comma-separated list of positive integers ("full" is 0 when allow_full); InputError naming the flag and
// the item otherwise.
std::vector<int> parse_int_list(const std::string& s, const std::string& flag, bool allow_full);

// --plot of bench and eval passkey, checked before the run: InputError "--plot: needs python3 with matplotlib
// (Debian: python3-matplotlib)" unless `python3 -c 'import matplotlib'` succeeds.
void check_plot_dependency();
}
