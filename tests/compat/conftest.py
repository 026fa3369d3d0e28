"""``tests/compat/packages`` holds plugin packages, not tests of this repository: their own
tests import the packages, which only ``tests/system/compat`` installs (in a directory of
its own) and runs them against. Collecting them here would import packages that are not
installed."""

collect_ignore = ["packages"]
