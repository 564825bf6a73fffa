"""The exit codes of the ``scheduler`` command: one meaning each, so that scripts and
Kubernetes probes can tell a wrong command line from a bad config file from a request nothing
can serve (docs/cli.md, "Exit codes")."""

from __future__ import annotations

OK = 0
# The command ran and did not succeed: a router, store or provider it needs did not answer,
# a check it runs found a problem, a file it writes could not be written.
FAILURE = 1
# The command line is wrong. argparse exits with 2 for the errors it finds itself; the
# handlers use the same code for the ones only they can find (options that go together).
USAGE = 2
# ``scheduler route``: no region and pool satisfies the request's hard limits.
UNSCHEDULABLE = 3
# A config file is invalid or missing something the command needs: regions/, policies/
# (also a --policy that is not in them), the keys, budgets or ticket-keys files, profiles.
CONFIG = 4
# Ctrl-C: 128 + SIGINT, as a shell reports a process the signal ended.
INTERRUPTED = 130
